"""Backfills the UI creates, planned as the CLI plans its own.

The UI's "Materialize… → Failed → Launch backfill" creates an asset backfill that Dagster's
backfill daemon plans on its next loop: its ``BackfillPolicy`` cuts only *contiguous* partitions
into runs, so 50 failures scattered over 1,000 documents become 50 runs of one document, each
paying a run's start (about 6 s of two cores here). The backfill planner sensor looks at every
backfill created since its last tick and, when the UI's backfill targets this analysis's stages
only and Dagster would make more runs of it than ``backfills.plan_runs`` does, plans its runs as
``ai-pipeline backfill --failed`` does (``backfills.with_planned_runs``): runs of the product's
run size whatever the documents' positions, each naming its documents, so that the documents of
a range it does not name cost no call and no event. The sensor then starts the first wave of
those runs at once (``start_runs.start_planned_runs``, as ``submit`` and ``backfill`` do), and the
daemon submits the rest as it resumes a backfill whose runs it had planned.

The plan is written only if the backfill is still as it was read (``dagster_private.
replace_backfill``): when the daemon's loop got to it first, the backfill keeps Dagster's plan
(one run per stretch of contiguous documents), never both plans. The other way round, a daemon
iteration that read the backfill before the plan was written would write its own plan over it and
submit its runs too; the project's run storages refuse that write (``backfill_writes``). The sensor ticks every
``PLANNER_INTERVAL_SECONDS``, the daemon's backfill loop every 30 s, so a UI backfill is planned
here unless it was created in the few seconds before that loop's next pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from ai_pipeline.defs.backfills import (
    BACKFILL_TAG,
    plan_runs,
    planned_run_size,
    with_planned_runs,
)
from ai_pipeline.defs.dagster_private import (
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
    replace_backfill,
)
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
    instance: dg.DagsterInstance, asset_graph: Any, backfill: PartitionBackfill, site: Site
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
    planned = with_planned_runs(
        instance, asset_graph, backfill, documents, site, run_size, asset_keys=stages
    )
    return planned, Planned(backfill.backfill_id, len(documents), ours, dagsters)


def plan_new_backfills(
    instance: dg.DagsterInstance, asset_graph: Any, site: Site, cursor: str | None
) -> tuple[list[Planned], str | None]:
    """Plan every UI backfill created since ``cursor`` that ``plan`` plans, each only if it is
    still unplanned when written; what was planned, and the cursor to keep."""
    since = json.loads(cursor)["created"] if cursor else None
    filters = BulkActionsFilter(
        statuses=[BulkActionStatus.REQUESTED],
        created_after=datetime.fromtimestamp(since, UTC) if since else None,
    )
    backfills: Sequence[PartitionBackfill] = instance.get_backfills(filters=filters)
    planned: list[Planned] = []
    for backfill in backfills:
        made: list[Planned] = []

        def change(stored: PartitionBackfill, made: list[Planned] = made) -> Any:
            result = plan(instance, asset_graph, stored, site)
            if result is None:
                return None
            made.append(result[1])
            return result[0]

        if documents_of(backfill, site)[1] and replace_backfill(
            instance, backfill.backfill_id, change
        ):
            planned.extend(made)
    latest = max((b.backfill_timestamp for b in backfills), default=since)
    return planned, json.dumps({"created": latest}) if latest is not None else cursor
