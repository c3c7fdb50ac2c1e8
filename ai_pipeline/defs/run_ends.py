"""A failed analysis run's unfinished documents, shown FAILED in Dagster.

With one planned event per asset and run (the accelerator's event log), the analysis step writes
the per-partition planned events of the documents it saw fail (``ai_pipeline.defs.assets``). A run that fails before its step ends — its worker killed, its
launch failed, the machine lost — writes none, so its unfinished documents would not be FAILED in
Dagster and ``backfill --failed`` would not see those it never started (they are still PENDING or
QUEUED in the store: no run claimed them). ``mark_unfinished`` writes, in the ended run,
the planned event of every (stage, document) of its range that it selected, did not materialize
and has no planned event for: what run creation writes by default, so Dagster's status is then the
same as with per-partition planned events. A CANCELED run's documents are not FAILED in Dagster
either way (someone stopped them; re-submitting the batch finishes them), so only FAILURE counts.
The documents it never started are moved to FAILED (RUN_INTERRUPTED, retryable) in the store as
well (``ai_pipeline.reconcile.fail_unstarted``), so that every retry — ``backfill --failed``, the
nightly schedule — finds them as Dagster shows them.

Only documents the store says nobody has finished or taken over since are marked: PENDING or
QUEUED, or FAILED or DEAD_LETTER by this very run. A document COMPLETED, RUNNING elsewhere or
failed by another run keeps the status that run gives it.

A run of the product's size has thousands of documents, five planned events each. They are written
``EVENTS_PER_WRITE`` at a time in one transaction (``grouped_writes``, where the storage has it), and
a tick of the reconcile sensor stops after the run that takes it past ``DOCUMENTS_PER_TICK``
documents (the next tick goes on from there). Written event by event, the 12,500 events of one
failed run of 2,500 took minutes on a busy SQLite event log: the tick outlived the daemon's wait
for it, so it never moved its cursor, and the code server the daemon starts every minute began the
same run again while the earlier ones went on writing it (seen at 100,000 documents: fifteen code
servers, every event written twice).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from ai_pipeline.defs.acceleration import report_planned_materialization
from ai_pipeline.defs.jobs import RANGE_END_TAG, RANGE_START_TAG
from ai_pipeline.defs.partitions import named_in
from ai_pipeline.defs.site import DEFAULT_SITE, Site
from ai_pipeline.reconcile import fail_unstarted
from ai_pipeline.states import State
from ai_pipeline.store import Store

ENDED = [dg.DagsterRunStatus.FAILURE]
RUNS_PER_TICK = 50
# Planned events per transaction: about a run worker's group (50 documents, nine events each).
EVENTS_PER_WRITE = 500
# A tick ends after the run that takes its marked documents past this.
DOCUMENTS_PER_TICK = 5_000
_UNTOUCHED = frozenset({State.PENDING, State.QUEUED})
_FAILED = frozenset({State.FAILED, State.DEAD_LETTER})


@dataclass(frozen=True)
class RunEnd:
    """A run that ended FAILURE, and the cursor once it is marked (its update time, ISO 8601)."""

    run: dg.DagsterRun
    cursor: str


def ended_runs(instance: dg.DagsterInstance, cursor: str | None) -> list[RunEnd]:
    """The next runs (at most ``RUNS_PER_TICK``) that ended FAILURE after the run update time
    ``cursor`` (ISO 8601), oldest first."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=ENDED, updated_after=datetime.fromisoformat(cursor) if cursor else None
        ),
        limit=RUNS_PER_TICK,
        order_by="update_timestamp",
        ascending=True,
    )
    return [RunEnd(r.dagster_run, r.update_timestamp.isoformat()) for r in records]


def _analyses(run: dg.DagsterRun, site: Site) -> bool:
    return bool(run.asset_selection and run.asset_selection & set(site.keys))


def run_documents(run: dg.DagsterRun, partition_keys: Sequence[str]) -> list[str]:
    """The documents of a run: its partition, or its range of the ordered partition keys (those
    of the range its config names, when it names some)."""
    if run.tags.get("dagster/partition"):
        return [run.tags["dagster/partition"]]
    start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if not start or not end:
        return []
    try:
        first, last = partition_keys.index(start), partition_keys.index(end)
    except ValueError:
        return []
    named = named_in(run.run_config)
    return [k for k in partition_keys[first : last + 1] if named is None or k in named]


def mark_unfinished(
    instance: dg.DagsterInstance,
    store: Store,
    run: dg.DagsterRun,
    partition_keys: Sequence[str],
    site: Site = DEFAULT_SITE,
) -> list[str]:
    """Write the missing per-partition planned events of ``run``'s unfinished documents; returns
    the documents marked."""
    candidates = run_documents(run, partition_keys)
    if not candidates:
        return []
    unfinished = [
        d.document_id
        for d in store.documents.rows(candidates)
        if d.state in _UNTOUCHED or (d.state in _FAILED and d.run_id == run.run_id)
    ]
    if not unfinished:
        return []
    fail_unstarted(store, run.run_id, unfinished)
    planned = instance.get_asset_partitions_for_run(
        run.run_id, dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    )
    materialized = instance.get_asset_partitions_for_run(
        run.run_id, dg.DagsterEventType.ASSET_MATERIALIZATION
    )
    missing: list[tuple[dg.AssetKey, str]] = []
    for asset_key in site.keys:
        if run.asset_selection is None or asset_key not in run.asset_selection:
            continue
        done = set(planned.get(asset_key, ())) | set(materialized.get(asset_key, ()))
        missing.extend((asset_key, d) for d in unfinished if d not in done)
    grouped = getattr(instance.event_log_storage, "grouped_writes", contextlib.nullcontext)
    for start in range(0, len(missing), EVENTS_PER_WRITE):
        with grouped():
            for asset_key, document_id in missing[start : start + EVENTS_PER_WRITE]:
                if not report_planned_materialization(
                    instance, run, site.op, asset_key, document_id
                ):
                    return sorted({d for _, d in missing[:start]})
    return sorted({document_id for _, document_id in missing})


def mark_failed_runs(
    instance: dg.DagsterInstance,
    store: Store,
    runs: Sequence[dg.DagsterRun],
    site: Site = DEFAULT_SITE,
) -> dict[str, list[str]]:
    """``mark_unfinished`` for those of these runs that are analysis runs ended FAILURE: the
    documents marked by run id."""
    ended = [r for r in runs if r.status in ENDED and _analyses(r, site)]
    marked: dict[str, list[str]] = {}
    if ended:
        keys = instance.get_dynamic_partitions(site.partitions)
        for run in ended:
            documents = mark_unfinished(instance, store, run, keys, site)
            if documents:
                marked[run.run_id] = documents
    return marked


def mark_ended_runs(
    instance: dg.DagsterInstance, store: Store, cursor: str | None, site: Site = DEFAULT_SITE
) -> tuple[dict[str, list[str]], str | None]:
    """``mark_unfinished`` for ``site``'s analysis runs that ended after ``cursor``, up to the one
    that takes the documents marked past ``DOCUMENTS_PER_TICK``: the documents marked by run id,
    and the cursor after the last run looked at."""
    marked: dict[str, list[str]] = {}
    ends = ended_runs(instance, cursor)
    for end, following in itertools.zip_longest(ends, ends[1:]):
        marked.update(mark_failed_runs(instance, store, [end.run], site))
        cursor = end.cursor
        # Not between two runs of the same update time: the next tick asks for later ones only
        # (SQLite's run storage keeps whole seconds).
        same_time = following is not None and following.cursor == end.cursor
        if sum(map(len, marked.values())) >= DOCUMENTS_PER_TICK and not same_time:
            break
    return marked, cursor
