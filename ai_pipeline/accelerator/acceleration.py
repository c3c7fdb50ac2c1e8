"""What the accelerator's storages offer the product (``ai_pipeline.defs.acceleration`` says what
it asks for): each storage class carries one of these as ``ai_pipeline_acceleration``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from ai_pipeline.accelerator import backfills, missed_retries, start_runs
from ai_pipeline.accelerator.internals import AssetMaterializationPlannedData, DagsterEvent
from ai_pipeline.defs.site import Site


class Backfills:
    """The run storage's: backfills planned by the product and started at once."""

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
        return backfills.with_planned_runs(
            instance, asset_graph, backfill, document_ids, site, run_size, asset_keys
        )

    def replace_backfill(
        self,
        instance: dg.DagsterInstance,
        backfill_id: str,
        change: Callable[[Any], Any | None],
    ) -> Any | None:
        return backfills.replace_backfill(instance, backfill_id, change)

    def start_planned_runs(
        self, instance: dg.DagsterInstance, backfill_ids: Sequence[str], site: Site
    ) -> int:
        return start_runs.start_planned_runs(instance, backfill_ids, site)

    def retry_missed(self, instance: dg.DagsterInstance, site: Site) -> list[str]:
        return missed_retries.retry_missed(instance, site)


class Events:
    """The event log's: a run plans events for the documents it names, and a failed document's
    planned event is written where run creation left it out."""

    narrows_named_runs = True

    def report_planned_materialization(
        self,
        instance: dg.DagsterInstance,
        run: dg.DagsterRun,
        step_key: str,
        asset_key: dg.AssetKey,
        partition: str,
    ) -> None:
        event = DagsterEvent.build_asset_materialization_planned_event(
            run.job_name,
            step_key,
            AssetMaterializationPlannedData(asset_key, partition=partition, partitions_subset=None),
        )
        instance.report_dagster_event(event, run.run_id, logging.DEBUG)


BACKFILLS = Backfills()
EVENTS = Events()
