"""Backfills the UI creates, planned as the command line plans its own, before Dagster does.

With the accelerator (``ai_pipeline.defs.acceleration``), the backfill planner sensor looks at
every backfill created since its last tick and, when it targets this analysis's stages only and
Dagster would make more runs of it, writes the product's plan into it (runs of the run size
wherever the documents are, each naming its documents) by compare and set, and starts the first
wave at once. The accelerated run storage refuses a stale plan from the daemon, so a backfill runs
under one plan, never two. Without the accelerator nothing is written here; the runs Dagster
plans are re-planned while queued (``ai_pipeline.defs.replan``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from ai_pipeline.defs.acceleration import BackfillAcceleration
from ai_pipeline.defs.backfills import BACKFILL_TAG, plan_runs, planned_run_size
from ai_pipeline.defs.dagster_private import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from ai_pipeline.defs.site import Site
from ai_pipeline.intake import contiguous_ranges

# How often the planner looks for new backfills: well within the daemon's 30 s backfill loop.
PLANNER_INTERVAL_SECONDS = 2


@dataclass(frozen=True)
class Planned:
    backfill_id: str
    documents: int
    runs: int
    dagster_runs: int


def documents_of(backfill: PartitionBackfill, site: Site) -> tuple[list[dg.AssetKey], list[str]]:
    """The analysis stages a UI backfill targets and its documents, when it is one this planner
    may plan: an asset backfill not made by this package, nothing requested yet, of this
    analysis's stages only, the same documents for each; else ``([], [])``."""
    data = backfill.asset_backfill_data
    if (
        data is None
        or backfill.status != BulkActionStatus.REQUESTED
        or BACKFILL_TAG in backfill.tags
        or backfill.submitting_run_requests
        or data.requested_runs_for_target_roots
        or not data.requested_subset.is_empty
    ):
        return [], []
    target = data.target_subset
    stages = [key for key in site.keys if key in target.asset_keys]
    if not stages or target.non_partitioned_asset_keys or len(stages) < len(target.asset_keys):
        return [], []
    documents = {
        key: sorted(target.get_partitions_subset(key).get_partition_keys()) for key in stages
    }
    first = documents[stages[0]]
    if any(keys != first for keys in documents.values()):
        return [], []
    return stages, first


def plan(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    backfill: PartitionBackfill,
    site: Site,
    acceleration: BackfillAcceleration,
) -> tuple[PartitionBackfill, Planned] | None:
    """``backfill`` with its runs planned, and what the plan is, when it is a UI backfill this
    planner plans (``documents_of``) and Dagster would make more runs of it; else None."""
    stages, documents = documents_of(backfill, site)
    if not documents:
        return None
    ordered = instance.get_dynamic_partitions(site.partitions)
    run_size = planned_run_size(instance, len(documents))
    ours = len(plan_runs(documents, ordered, run_size))
    policy = asset_graph.get(stages[0]).backfill_policy
    most = (policy.max_partitions_per_run if policy is not None else None) or len(ordered) or 1
    dagsters = len(contiguous_ranges(documents, ordered, most))
    if ours >= dagsters:
        return None
    planned = acceleration.plan_backfill(
        instance, asset_graph, backfill, documents, site, run_size, asset_keys=stages
    )
    return planned, Planned(backfill.backfill_id, len(documents), ours, dagsters)


def plan_new_backfills(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    site: Site,
    since: float | None,
    acceleration: BackfillAcceleration,
) -> tuple[list[Planned], float | None]:
    """Plan every UI backfill created after the time ``since`` that ``plan`` plans, each only if
    it is still unplanned when written; what was planned, and the time to look after next."""
    filters = BulkActionsFilter(
        statuses=[BulkActionStatus.REQUESTED],
        created_after=datetime.fromtimestamp(since, UTC) if since else None,
    )
    backfills: Sequence[PartitionBackfill] = instance.get_backfills(filters=filters)
    planned: list[Planned] = []
    for backfill in backfills:
        made: list[Planned] = []

        def change(stored: PartitionBackfill, made: list[Planned] = made) -> Any:
            result = plan(instance, asset_graph, stored, site, acceleration)
            if result is None:
                return None
            made.append(result[1])
            return result[0]

        if documents_of(backfill, site)[1] and acceleration.replace_backfill(
            instance, backfill.backfill_id, change
        ):
            planned.extend(made)
    return planned, max((b.backfill_timestamp for b in backfills), default=since)
