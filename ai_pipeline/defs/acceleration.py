"""What the optional accelerator adds, found on the instance's storage; the product never imports it.

The product is correct on Dagster's own storage. ``dagster.yaml`` may name the storages of
``ai_pipeline.accelerator`` instead; each carries an ``ai_pipeline_acceleration`` object, which
the functions here look up. Where one is missing, the caller takes the path that is correct on
stock storage: Dagster plans a backfill's runs, and a run covers every document of its range.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import dagster as dg

from ai_pipeline.defs.site import Site

ATTRIBUTE = "ai_pipeline_acceleration"

log = logging.getLogger(__name__)


class BackfillAcceleration(Protocol):
    """Backfills planned by the product and started at once (the run storage's)."""

    def plan_backfill(
        self,
        instance: dg.DagsterInstance,
        asset_graph: Any,
        backfill: Any,
        document_ids: Sequence[str],
        site: Site,
        run_size: int | None = None,
        asset_keys: Sequence[dg.AssetKey] = (),
    ) -> Any:
        """``backfill`` with its runs planned by the product, for the daemon to submit."""

    def replace_backfill(
        self,
        instance: dg.DagsterInstance,
        backfill_id: str,
        change: Callable[[Any], Any | None],
    ) -> Any | None:
        """``change`` of the stored backfill, written only if nobody wrote it meanwhile."""

    def start_planned_runs(
        self, instance: dg.DagsterInstance, backfill_ids: Sequence[str], site: Site
    ) -> int:
        """Submit the first wave of these backfills' planned runs now; how many."""

    def retry_missed(self, instance: dg.DagsterInstance, site: Site) -> list[str]:
        """Retry the failed runs whose automatic retry the daemon missed; their ids."""


class EventAcceleration(Protocol):
    """What the event log adds (the event log storage's)."""

    # A run that names some documents of its range plans events for those alone: the others of
    # the range keep their status and checks, untouched.
    narrows_named_runs: bool

    def report_planned_materialization(
        self,
        instance: dg.DagsterInstance,
        run: dg.DagsterRun,
        step_key: str,
        asset_key: dg.AssetKey,
        partition: str,
    ) -> None:
        """Write, in ``run``, the planned event of one partition of an asset."""


def backfill_acceleration(instance: dg.DagsterInstance) -> BackfillAcceleration | None:
    return getattr(instance.run_storage, ATTRIBUTE, None)


def event_acceleration(instance: dg.DagsterInstance) -> EventAcceleration | None:
    return getattr(instance.event_log_storage, ATTRIBUTE, None)


def names_documents(instance: dg.DagsterInstance) -> bool:
    """Whether a run may name the documents of its range it works on: only where the event log
    plans events for those alone. On stock storage every document of a range is planned, so a run
    works on all of them (those done already are re-reported from their checkpoints)."""
    acceleration = event_acceleration(instance)
    return acceleration is not None and acceleration.narrows_named_runs


def planned_events_per_partition(instance: dg.DagsterInstance) -> bool:
    """Whether run creation writes one planned event per partition (Dagster's default), so that a
    failed run's partitions are FAILED without help."""
    storage = instance.event_log_storage
    return not storage.supports_partition_subset_in_asset_materialization_planned_events


_warned: set[str] = set()


def report_planned_materialization(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    step_key: str,
    asset_key: dg.AssetKey,
    partition: str,
) -> bool:
    """Write the per-partition planned event run creation left out (it wrote one per asset), so
    that Dagster shows the partition FAILED; False (said once in the log) where nothing can: the
    planned events were narrowed by ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS`` without the
    accelerator."""
    acceleration = event_acceleration(instance)
    if acceleration is None:
        if "planned" not in _warned:
            _warned.add("planned")
            log.warning(
                "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS is set without the accelerator's "
                "event log: Dagster cannot show which documents of a failed run failed; unset "
                "it, or turn the accelerator on (docs/accelerator.md)"
            )
        return False
    acceleration.report_planned_materialization(instance, run, step_key, asset_key, partition)
    return True
