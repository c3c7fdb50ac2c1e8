"""Backfills handed to Dagster's daemon with their runs already planned, and rewritten by compare
and set.

``with_planned_runs`` puts a backfill in the state the daemon writes before it submits runs it
planned itself, with the product's plan in it (``ai_pipeline.defs.backfills.plan_runs``: runs of the
run size wherever the documents are, each naming its documents). The daemon resumes that state on
its next loop and submits exactly those runs. ``replace_backfill`` writes such a plan into a
backfill the UI created, only if nobody wrote the backfill since it was read.

The rule: a plan is written by compare and set only where the run storage also refuses a stale
plan from the daemon (``backfill_writes``); otherwise one backfill could run under two plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from ai_pipeline.accelerator.internals import (
    BulkActionsTable,
    db_select,
    deserialize_value,
    make_new_run_id,
    serialize_value,
)
from ai_pipeline.defs.backfills import plan_runs, planned_run_size, run_request_for
from ai_pipeline.defs.site import Site


def with_planned_runs(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    backfill: Any,
    document_ids: Sequence[str],
    site: Site,
    run_size: int | None = None,
    asset_keys: Sequence[dg.AssetKey] = (),
) -> Any:
    """``backfill`` handed to the daemon with its runs planned (``plan_runs``) in runs of
    ``run_size`` (None: ``planned_run_size``) of ``asset_keys`` (none: all of the analysis's)
    and their checks: the daemon submits them as it resumes a backfill whose runs it had
    planned, and plans none itself."""
    keys = instance.get_dynamic_partitions(site.partitions)
    run_size = run_size or planned_run_size(instance, len(document_ids))
    position = {key: i for i, key in enumerate(keys)}
    selected = list(asset_keys or site.keys)
    check_keys = list(asset_graph.get_check_keys_for_assets(set(selected)))
    requests = [
        run_request_for(run, position, selected, check_keys, site.op)
        for run in plan_runs(document_ids, keys, run_size)
    ]
    data = backfill.asset_backfill_data
    # The daemon counts the materializations stored after this cursor as the backfill's progress,
    # and none at all while it is None; a backfill whose roots are requested gets it only at the
    # end of the daemon's next loop. On an empty event log (the first batch of an instance) it
    # would be None, and runs that all ended before that loop would leave every document without
    # a status: the daemon marks them failed and the backfill COMPLETED_FAILED. 0 counts them all.
    data = (
        data.replace_requested_subset(data.target_subset)
        .with_requested_runs_for_target_roots(True)
        .with_latest_storage_id(instance.event_log_storage.get_maximum_record_id() or 0)
    )
    return backfill.with_asset_backfill_data(
        data, dynamic_partitions_store=instance, asset_graph=asset_graph
    ).with_submitting_run_requests(requests, [make_new_run_id() for _ in requests])


def replace_backfill(
    instance: dg.DagsterInstance, backfill_id: str, change: Callable[[Any], Any | None]
) -> Any | None:
    """The backfill ``change(backfill)`` made of the stored one, stored in its place only if its
    record is still the one read (compare and set on the stored body); None when ``change``
    made nothing or the record changed in between."""
    storage = instance.run_storage
    with storage.connect() as conn:  # type: ignore[attr-defined]
        body = conn.execute(
            db_select([BulkActionsTable.c.body]).where(BulkActionsTable.c.key == backfill_id)
        ).scalar()
    if body is None:
        return None
    new = change(deserialize_value(body))
    if new is None:
        return None
    with storage.connect() as conn:  # type: ignore[attr-defined]
        replaced = conn.execute(
            BulkActionsTable.update()
            .where(BulkActionsTable.c.key == backfill_id, BulkActionsTable.c.body == body)
            .values(status=new.status.value, body=serialize_value(new))
        ).rowcount
    return new if replaced == 1 else None
