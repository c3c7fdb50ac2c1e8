"""Failed-only backfills: which documents a rerun can fix, and a real Dagster backfill for them.

A document is picked when Dagster shows it FAILED (or the store does) and its category says a
rerun can help: the categories that need a person, DEAD_LETTER documents (until ``ai-pipeline
requeue``) and those a reviewer rejected are left out; BUDGET_REACHED ones only in a launch that
carries a budget (a rerun without one would spend what the budget refused).

The backfill is a real one: the UI's Backfills page shows it and the daemon runs it. With the
accelerator its runs are planned here (``plan_runs``: runs of the run size wherever the documents
are, each naming its documents); on Dagster's own storage Dagster plans them and the backfill
planner re-plans those still queued (``ai_pipeline.defs.replan``). Checkpoints make every rerun
free of repeated LLM calls.
"""

from __future__ import annotations

import hashlib
import secrets
import string
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from ai_pipeline.defs.acceleration import backfill_acceleration
from ai_pipeline.defs.dagster_private import (
    BULK_ACTION_TERMINAL_STATUSES,
    BulkActionStatus,
    PartitionBackfill,
)
from ai_pipeline.defs.jobs import DOCUMENTS_PER_BACKFILL_RUN, range_tags
from ai_pipeline.defs.partitions import naming_config
from ai_pipeline.defs.site import ANALYSIS_TAG, DEFAULT_SITE, Site
from ai_pipeline.failures import Category
from ai_pipeline.settings import Settings
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.rows import DocumentRow

BACKFILL_TAG = "ai_pipeline/backfill"

# The tags Dagster's run retries put on a failed run: whether it will be retried, and its retry.
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_RUN_ID_TAG = "dagster/auto_retry_run_id"


@dataclass(frozen=True)
class Candidate:
    """A failed document, and why a backfill leaves it out (None: it is rerun)."""

    document_id: str
    source: str
    state: str
    category: str | None
    attempts: int
    error: str | None
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.skipped is None:
            del out["skipped"]
        return out


@dataclass
class BackfillPlan:
    """The documents a failed-only backfill would rerun, and those it leaves out (with why)."""

    selected: list[Candidate] = field(default_factory=list)
    skipped: list[Candidate] = field(default_factory=list)

    @property
    def document_ids(self) -> list[str]:
        return [d.document_id for d in self.selected]


def plan_failed_backfill(
    instance: dg.DagsterInstance,
    store: Store,
    *,
    categories: Iterable[Category] | None = None,
    since: datetime | None = None,
    budgeted: bool = False,
    site: Site = DEFAULT_SITE,
) -> BackfillPlan:
    """Documents FAILED in Dagster or in the store, filtered by category and time. BUDGET_REACHED
    ones only when asked for by category and the backfill carries a budget (``budgeted``)."""
    wanted = set(categories) if categories else None
    keys = instance.get_dynamic_partitions(site.partitions)
    partitions = set(keys)
    dagster_status = (
        instance.get_status_by_partition(site.results_key, keys, site.partitions_def) or {}
    )
    failed_in_dagster = {
        k for k, v in dagster_status.items() if v == dg.AssetPartitionStatus.FAILED
    }
    plan = BackfillPlan()
    # The documents FAILED here (an indexed query) and those Dagster shows FAILED: never all rows.
    failed_here = store.documents.rows_in_state(State.FAILED)
    elsewhere = failed_in_dagster - {d.document_id for d in failed_here}
    candidates = sorted(
        [*failed_here, *store.documents.rows(elsewhere)],
        key=lambda d: (d.created_at, d.document_id),
    )
    for doc in candidates:
        candidate = Candidate(
            document_id=doc.document_id,
            source=doc.source,
            state=doc.state.value,
            category=doc.category.value if doc.category else None,
            attempts=doc.attempts,
            error=doc.last_error,
        )
        reason = _skip_reason(doc, wanted, since, budgeted)
        if reason:
            plan.skipped.append(Candidate(**{**asdict(candidate), "skipped": reason}))
        elif doc.document_id in partitions:
            plan.selected.append(candidate)
    return plan


def _skip_reason(
    doc: DocumentRow, wanted: set[Category] | None, since: datetime | None, budgeted: bool
) -> str | None:
    if doc.state == State.DEAD_LETTER:
        return "dead letter: retry budget spent (ai-pipeline requeue puts it back)"
    if doc.rejected_by_reviewer:
        return "rejected by a reviewer"
    category = doc.category
    if wanted is not None:
        if category not in wanted:
            return f"category {category.value if category else 'none'} not selected"
    elif category is not None and category.needs_person:
        return f"{category.value} needs a person (ai-pipeline review)"
    if category == Category.BUDGET_REACHED and (wanted is None or not budgeted):
        return (
            "held by a budget: continues under one (submit its batch again with a larger "
            "budget, or backfill --failed --category BUDGET_REACHED --budget-tokens/--budget-usd)"
        )
    if since is not None and doc.updated_at < since:
        return "failed before --since"
    return None


def new_backfill_id() -> str:
    """A new backfill id: eight random lower-case letters, like Dagster's own."""
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(8))


def backfill_id_for(name: str) -> str:
    """A deterministic backfill id (eight lower-case letters, like Dagster's own) for a name."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return "".join(string.ascii_lowercase[b % 26] for b in digest[:8])


def plan_runs(
    document_ids: Sequence[str], partition_keys: Sequence[str], run_size: int
) -> list[list[str]]:
    """The documents (those that are partitions) in partition order, cut into runs of at most
    ``run_size`` whatever their position."""
    order = {key: i for i, key in enumerate(partition_keys)}
    ordered = sorted({d for d in document_ids if d in order}, key=order.__getitem__)
    size = max(1, run_size)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


# The most documents one run of a backfill takes when the run size is left to the product: the
# largest measured (10,000 documents in one wave of four runs, benchmarks/README.md). Creating a run
# costs time in proportion to its documents, and a run that dies takes its documents with it.
MAX_DOCUMENTS_PER_RUN = 2500


def backfill_run_size(
    documents: int,
    run_slots: int | None,
    llm_concurrency: int,
    *,
    global_llm_concurrency: int | None = None,
    most: int = MAX_DOCUMENTS_PER_RUN,
) -> int:
    """Documents per run so that a backfill's runs fill the run queue's ``run_slots``
    (``max_concurrent_runs``) in one wave: ceil(documents / slots). A run takes at least
    ``llm_concurrency`` documents (fewer cannot keep its LLM calls busy; more runs would only
    add process starts) and at most ``most``; above ``most`` × slots, the runs come in full
    waves of equal runs. Under a global cap of ``global_llm_concurrency`` calls, only
    ceil(cap / ``llm_concurrency``) runs can have their calls out at once: the runs fill that
    many slots, not more (a run beyond them would wait for the cap's slots, at the cost of its
    process). A queue with no limit (or closed, or none) gives Dagster's planning size,
    ``DOCUMENTS_PER_BACKFILL_RUN``."""
    if run_slots is None or run_slots < 1:
        return DOCUMENTS_PER_BACKFILL_RUN
    if documents < 1:
        return 1
    if global_llm_concurrency:
        run_slots = min(run_slots, -(-global_llm_concurrency // max(1, llm_concurrency)))
    waves = -(-documents // (run_slots * most))
    size = -(-documents // (run_slots * waves))
    return max(1, min(most, max(size, min(documents, llm_concurrency))))


def planned_run_size(instance: dg.DagsterInstance, documents: int) -> int:
    """The run size of a backfill of ``documents`` that this package plans: the
    ``AI_PIPELINE_BACKFILL_RUN_SIZE`` override when set, else ``run_size_for``."""
    settings = Settings.load()
    return run_size_for(instance, documents, settings, settings.backfill_run_size)


def run_size_for(
    instance: dg.DagsterInstance, documents: int, settings: Settings, override: int | None
) -> int:
    """``override`` when set, else ``backfill_run_size`` of ``documents`` from the instance's run
    queue (``run_coordinator``'s ``max_concurrent_runs`` in ``dagster.yaml``) and the runs' LLM
    concurrency (and the global cap, ``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY``): runs that fill the
    queue's useful slots in one wave. A sensor tick's runs are sized the same way
    (``AI_PIPELINE_DOCUMENTS_PER_RUN`` is their override)."""
    if override is not None:
        return override
    queue = instance.get_concurrency_config().run_queue_config
    slots = queue.max_concurrent_runs if queue is not None else None
    return backfill_run_size(
        documents,
        slots,
        settings.llm_concurrency,
        global_llm_concurrency=settings.global_llm_concurrency,
    )


def run_request_for(
    documents: Sequence[str],
    position: Mapping[str, int],
    asset_keys: Sequence[dg.AssetKey],
    check_keys: Sequence[dg.AssetCheckKey],
    op: str = DEFAULT_SITE.op,
) -> dg.RunRequest:
    """A range run over ``documents`` (in partition order); when the range holds others too, its
    config names the documents it works on."""
    contiguous = position[documents[-1]] - position[documents[0]] + 1 == len(documents)
    return dg.RunRequest(
        asset_selection=list(asset_keys),
        asset_check_keys=list(check_keys),
        tags=range_tags(documents),
        run_config=None if contiguous else naming_config(documents, op),
    )


def launch_backfill(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    document_ids: Sequence[str],
    *,
    title: str,
    tags: dict[str, str] | None = None,
    backfill_id: str | None = None,
    include: Sequence[dg.AssetKey] = (),
    site: Site = DEFAULT_SITE,
    run_size: int | None = None,
) -> str:
    """Create an asset backfill of the analysis assets (and ``include``) for these documents; the
    daemon runs it. ``asset_graph`` is the code location's (``repository_def.asset_graph``).
    With the accelerator and without ``include``, its runs are planned here (``plan_runs``): as
    many as the run size needs (``run_size``, or ``planned_run_size``), wherever the documents
    are; else Dagster plans them, and the backfill planner sensor re-plans those still queued
    (``ai_pipeline.defs.replan``).

    Returns the backfill id; when ``backfill_id`` names an existing backfill nothing new is made
    (a retried schedule tick must not launch twice).
    """
    backfill_id = backfill_id or new_backfill_id()
    if instance.get_backfill(backfill_id) is not None:
        return backfill_id
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id,
        asset_graph=asset_graph,
        partition_names=list(document_ids),
        asset_selection=[*site.keys, *include],
        backfill_timestamp=time.time(),
        tags={BACKFILL_TAG: "failed", ANALYSIS_TAG: site.declaration.name, **(tags or {})},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=title,
        description=f"{len(document_ids)} documents",
        run_config=None,
    )
    acceleration = backfill_acceleration(instance)
    if acceleration is not None and not include:
        backfill = acceleration.plan_backfill(
            instance, asset_graph, backfill, document_ids, site, run_size
        )
    instance.add_backfill(backfill)
    return backfill_id


def backfill_ended(backfill: Any) -> bool:
    return backfill.status in BULK_ACTION_TERMINAL_STATUSES


# The tag Dagster puts on every run a backfill launches.
DAGSTER_BACKFILL_TAG = "dagster/backfill"
# The tag of a queued run the backfill planner replaced by others (``ai_pipeline.defs.replan``).
REPLACED_TAG = "ai_pipeline/replaced_by"


def settled_status(
    instance: dg.DagsterInstance, backfill_id: str, ended_in: Callable[[list[str]], bool]
) -> str | None:
    """The status a running backfill is bound to end in, once its work is done: every run it
    launched is over and ``ended_in(their run ids)`` says each of its documents ended in one of
    them — so no run is left to launch. Dagster's backfill daemon records that status on its next
    loop, up to 30 s later; None while there is work left (or the runs say nothing yet)."""
    runs = instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: backfill_id}))
    if not runs or not all(r.is_finished for r in runs) or retry_pending(instance, runs):
        return None
    if not ended_in([r.run_id for r in runs]):
        return None
    # A run the backfill planner replaced while it was queued has its documents in other runs.
    succeeded = all(
        r.status == dg.DagsterRunStatus.SUCCESS
        or (r.status == dg.DagsterRunStatus.CANCELED and REPLACED_TAG in r.tags)
        for r in runs
    )
    return (
        BulkActionStatus.COMPLETED_SUCCESS if succeeded else BulkActionStatus.COMPLETED_FAILED
    ).value


def retry_pending(instance: dg.DagsterInstance, runs: Sequence[dg.DagsterRun]) -> bool:
    """Whether one of these runs failed and the daemon may yet retry it (the instance's
    ``run_retries``): Dagster sets a failed run's ``dagster/will_retry`` tag just after its
    status, and the daemon creates the retry — under the same backfill tag — on its next look.
    Until then the documents the failed run left are FAILED, yet the backfill's work is not
    over: a worker host lost mid-run is retried on another, and the batch completes."""
    if not instance.run_retries_enabled:
        return False
    return any(
        r.status == dg.DagsterRunStatus.FAILURE
        and AUTO_RETRY_RUN_ID_TAG not in r.tags
        and r.tags.get(WILL_RETRY_TAG, "true") == "true"
        for r in runs
    )


# The run statuses in which a run has begun its documents (or is over).
_STARTED_OR_OVER = frozenset(
    dg.DagsterRunStatus[name] for name in ("STARTED", "CANCELING", "SUCCESS", "FAILURE", "CANCELED")
)


def documents_settled_status(
    instance: dg.DagsterInstance,
    backfill_id: str,
    ended_in: Callable[[list[str]], bool],
    all_completed: Callable[[], bool],
) -> str | None:
    """The status a running backfill is bound to end in, as soon as its last document has
    settled: every one of its documents ended (in the results store) in one of its runs, though
    those runs may still be writing their last events and closing. It is ``settled_status`` once
    they are over; before, only ``all_completed`` (every document COMPLETED) settles it, as
    COMPLETED_SUCCESS: a run still going may yet take up a document that failed in another run
    (the daemon's retry of a run lost with its worker host takes up the documents that run left
    FAILED, RUN_INTERRUPTED), so a failure is final only once every run is over. None while a
    document is still to settle."""
    runs = instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: backfill_id}))
    # A run not yet begun still has its documents ahead of it: no need to ask the store.
    if not runs or not all(r.status in _STARTED_OR_OVER for r in runs):
        return None
    if not ended_in([r.run_id for r in runs]) or retry_pending(instance, runs):
        return None
    if all(r.is_finished for r in runs):
        return settled_status(instance, backfill_id, ended_in)
    return BulkActionStatus.COMPLETED_SUCCESS.value if all_completed() else None


def settled_once_runs_end(
    instance: dg.DagsterInstance,
    backfill_id: str,
    ended_in: Callable[[list[str]], bool],
    *,
    timeout: float = 60.0,
    poll: float = 0.5,
) -> str | None:
    """``settled_status``, after waiting (up to ``timeout``) for the runs of a backfill whose
    documents have all settled to finish closing — a ``--wait`` returns before they do; None when
    its documents have not all settled (the backfill still has work)."""
    deadline = time.monotonic() + timeout
    while True:
        status = settled_status(instance, backfill_id, ended_in)
        if status is not None:
            return status
        settled = documents_settled_status(instance, backfill_id, ended_in, lambda: False)
        if settled is None or time.monotonic() > deadline:
            return None
        time.sleep(poll)


# How often a wait that settles a backfill from its documents (``ended_in``) reads the backfill
# itself, for what only Dagster records (a cancel, a daemon's end): reading it deserializes every
# partition it targets, which at 10,000 documents cost a sixth of a waiting command's CPU.
RECORDED_STATUS_SECONDS = 5.0


def wait_for_backfill(
    instance: dg.DagsterInstance,
    backfill_id: str,
    *,
    timeout: float,
    poll: float | Callable[[], float] = 2.0,
    on_poll: Callable[[], None] | None = None,
    ended_in: Callable[[list[str]], bool] | None = None,
    all_completed: Callable[[], bool] | None = None,
) -> str:
    """Wait until the backfill is done (the daemon must be running); returns its final status.
    ``poll``: the seconds between two looks, or what gives them at each look. ``on_poll`` is
    called at every poll (to show progress). With ``ended_in`` (whether all the
    backfill's documents ended in these runs), it returns as soon as the work is done
    (``settled_status``) instead of waiting for the daemon to record it, and reads the status
    Dagster recorded only every ``RECORDED_STATUS_SECONDS``; with ``all_completed`` too, as soon
    as the last document has settled (``documents_settled_status``), before its run has closed."""
    deadline = time.monotonic() + timeout
    every = 0.0 if ended_in is None else RECORDED_STATUS_SECONDS
    read_at = -every
    backfill = None
    while True:
        if on_poll is not None:
            on_poll()
        if backfill is None or time.monotonic() - read_at >= every:
            backfill, read_at = instance.get_backfill(backfill_id), time.monotonic()
            if backfill is None:
                raise KeyError(f"no backfill {backfill_id}")
            if backfill_ended(backfill):
                return str(backfill.status.value)
        if ended_in is not None and backfill.status == BulkActionStatus.REQUESTED:
            settled = (
                settled_status(instance, backfill_id, ended_in)
                if all_completed is None
                else documents_settled_status(instance, backfill_id, ended_in, all_completed)
            )
            if settled is not None:
                return settled
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"backfill {backfill_id} still {backfill.status.value} after {timeout:g} s "
                "(is dagster-daemon running?)"
            )
        time.sleep(poll() if callable(poll) else poll)
