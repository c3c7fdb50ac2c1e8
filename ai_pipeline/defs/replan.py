"""A backfill's runs that Dagster planned, replaced by fewer runs of the run size.

Dagster's backfill daemon cuts a backfill into runs of contiguous documents (``BackfillPolicy``):
50 failures scattered over 1,000 documents become 50 runs of one, each paying a run's start, which
it creates one by one. Once the first of them exists, the backfill's documents that none of its
runs has begun are planned in runs of the run size (a replan, ``store.replans``), requested by the
backfill planner sensor under the same backfill (its ``dagster/backfill`` tag: the backfill counts
their materializations and stays open until they end), and Dagster's runs of those documents are
cancelled in the queue once the replan's runs hold them, and deleted (Dagster counts a cancelled
run's documents as failed). The first of Dagster's runs to start
replans before its own work, and the sensor on each tick: only Dagster's first wave ever works.
It needs nothing but Dagster's public calls, so it is how every backfill gets few runs on
Dagster's own storage.

The rules: a document is analysed in one run — a replan takes each document once, and a run of
Dagster's that starts anyway leaves the documents a replan took to its runs (``left_to_replans``).
And a backfill never has all its runs over while a replan's documents wait: Dagster ends such a
backfill, counting a cancelled run's documents as failed, so a run of Dagster's holding taken
documents is neither cancelled nor let end before a run of the replan holds them (``hand_over``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

from ai_pipeline.defs.acceleration import names_documents
from ai_pipeline.defs.backfills import (
    AUTO_RETRY_RUN_ID_TAG,
    DAGSTER_BACKFILL_TAG,
    REPLACED_TAG,
    WILL_RETRY_TAG,
    plan_runs,
    planned_run_size,
)
from ai_pipeline.defs.jobs import DOCUMENTS_TAG, range_tags
from ai_pipeline.defs.partitions import naming_config
from ai_pipeline.defs.run_ends import run_documents
from ai_pipeline.defs.site import Site
from ai_pipeline.intake import contiguous_ranges
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.rows import Replan

# The tag of a run a replan requested: the replan's number.
REPLAN_TAG = "ai_pipeline/replan"
# Dagster's run queue starts the runs of a higher priority first.
PRIORITY_TAG = "dagster/priority"
# A failed run marked to be retried whose retry has not come after this long was missed: Dagster's
# consumer of failures looks every 5 s. Older than a day, it is left alone.
MISSED_RETRY_SECONDS = 60.0
MISSED_RETRY_LOOKBACK_SECONDS = 86_400.0
# On stock storage a run covers every document of its range, and those between the selected ones
# are re-reported from their checkpoints (no call): about a hundredth of a run's start each. A gap
# of more than this many documents is cheaper as another run.
MOST_RIDING_ALONG = 200

_NOT_BEGUN = (
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.CANCELED,
)

# Dagster's tags that say what a run is, not what it is for: a new run gets its own.
_OWN_TAGS = (
    "dagster/partition",
    "dagster/asset_partition_range_start",
    "dagster/asset_partition_range_end",
    "dagster/run_key",
    "dagster/sensor_name",
    "dagster/will_retry",
    "dagster/retry_number",
    "dagster/root_run_id",
    "dagster/parent_run_id",
    REPLACED_TAG,
)


@dataclass(frozen=True)
class Replanned:
    """What a replan did for a backfill: Dagster's queued runs removed, runs planned instead."""

    backfill_id: str
    cancelled: int
    runs: int
    replan: Replan | None

    def describe(self) -> str:
        planned = (
            f"{len(self.replan.documents)} documents in {self.runs} runs (replan "
            f"{self.replan.seq}), "
            if self.replan is not None
            else ""
        )
        return (
            f"backfill {self.backfill_id}: {planned}{self.cancelled} of Dagster's queued runs "
            "replaced (cancelled and deleted; the backfill planner sensor starts the new runs)"
        )


def plan_ranges(
    document_ids: Iterable[str],
    partition_keys: Sequence[str],
    run_size: int,
    rides_along: Callable[[Sequence[str]], set[str]],
    most_riding: int = MOST_RIDING_ALONG,
) -> list[list[str]]:
    """The documents (those that are partitions) in partition order, cut into runs of at most
    ``run_size`` that each cover their whole range: a run goes on over the documents between two
    of its own only when ``rides_along`` says each of them may be re-reported from its checkpoints
    and there are at most ``most_riding`` of them."""
    position = {key: i for i, key in enumerate(partition_keys)}
    wanted = sorted({d for d in document_ids if d in position}, key=position.__getitem__)
    gaps = [
        partition_keys[position[a] + 1 : position[b]]
        for a, b in zip(wanted, wanted[1:], strict=False)
    ]
    candidates = [key for gap in gaps if len(gap) <= most_riding for key in gap]
    riding = rides_along(candidates) if candidates else set()
    runs: list[list[str]] = []
    for i, key in enumerate(wanted):
        gap = gaps[i - 1] if i else None
        if (
            runs
            and len(runs[-1]) < run_size
            and gap is not None
            and len(gap) <= most_riding
            and all(k in riding for k in gap)
        ):
            runs[-1].append(key)
        else:
            runs.append([key])
    return runs


def current_and_completed(store: Store, task_suffix: str) -> Callable[[Sequence[str]], set[str]]:
    """Which of some documents a run may re-report from their checkpoints without a call: the
    ones COMPLETED under the current analysis (``task_suffix`` ends their task id)."""

    def rides(document_ids: Sequence[str]) -> set[str]:
        return {
            d.document_id
            for d in store.documents.rows(document_ids)
            if d.state == State.COMPLETED and (d.task_id or "").endswith(task_suffix)
        }

    return rides


def planned_by_dagster(run: dg.DagsterRun, site: Site) -> str | None:
    """The backfill of a run of ``site``'s analysis that Dagster planned (this package's runs, a
    replan's or the accelerator's, say how many documents they have), or None."""
    backfill_id = run.tags.get(DAGSTER_BACKFILL_TAG)
    if backfill_id and DOCUMENTS_TAG not in run.tags and _analyses(run, site):
        return backfill_id
    return None


def backfill_targets(instance: dg.DagsterInstance, backfill_id: str, site: Site) -> list[str]:
    """The documents an open backfill targets, when it targets this analysis's stages alone (the
    same documents for each); else none (its runs are left as Dagster plans them)."""
    backfill = instance.get_backfill(backfill_id)
    try:
        if backfill is None or backfill.status.value != "REQUESTED":
            return []
        data = backfill.asset_backfill_data
        if data is None:
            return []
        target = data.target_subset
        stages = [key for key in site.keys if key in target.asset_keys]
        if not stages or target.non_partitioned_asset_keys or len(stages) < len(target.asset_keys):
            return []
        documents = [set(target.get_partitions_subset(k).get_partition_keys()) for k in stages]
    except AttributeError:  # a backfill of another kind
        return []
    return sorted(documents[0]) if all(d == documents[0] for d in documents) else []


def replan_backfill(
    instance: dg.DagsterInstance,
    store: Store,
    site: Site,
    task_suffix: str,
    backfill_id: str,
    policy_size: int,
) -> Replanned | None:
    """Plan in runs of the run size the documents of a backfill that none of its runs has begun
    and no replan took (recorded, for the backfill planner sensor to request), where that makes
    fewer runs than Dagster's ``policy_size`` per stretch of contiguous documents; then cancel
    Dagster's queued runs whose documents replans took and their runs hold. What was done, or
    None."""
    runs = instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: backfill_id}))
    keys = instance.get_dynamic_partitions(site.partitions)
    # A run of Dagster's not yet queued (NOT_STARTED: the daemon submits it) has not begun
    # either; whenever it starts, it leaves the documents a replan took (``left_to_replans``).
    begun = {
        d
        for run in runs
        if run.status not in _NOT_BEGUN and REPLAN_TAG not in run.tags
        for d in run_documents(run, keys)
    }
    taken = store.replans.taken(backfill_id)
    left = [
        d for d in backfill_targets(instance, backfill_id, site) if d not in begun | taken.keys()
    ]
    replan = None
    if left:
        named = names_documents(instance)
        run_size = planned_run_size(instance, len(left))
        if named:
            groups = plan_runs(left, keys, run_size)
        else:
            groups = plan_ranges(left, keys, run_size, current_and_completed(store, task_suffix))
        if len(groups) < len(contiguous_ranges(left, keys, policy_size)):
            replan = store.replans.record(backfill_id, groups, named=named)
            if replan is not None:
                taken |= dict.fromkeys(replan.documents, replan.seq)
    replaced = [
        (run, documents)
        for run in runs
        if run.status == dg.DagsterRunStatus.QUEUED
        and planned_by_dagster(run, site)
        and (documents := run_documents(run, keys))
        and all(d in taken for d in documents)
    ]
    # A replaced run is cancelled only once a run of a replan holds each of its documents: a
    # backfill whose runs are all over ends, counting a cancelled run's documents as failed.
    requested = replans_hold(runs, keys)
    cancelled = 0
    for run, documents in replaced:
        if REPLACED_TAG not in run.tags:
            instance.add_run_tags(run.run_id, {REPLACED_TAG: f"replan {taken[documents[0]]}"})
        if not all(d in requested for d in documents):
            continue
        fresh = instance.get_run_by_id(run.run_id)
        if fresh is not None and fresh.status == dg.DagsterRunStatus.QUEUED:
            instance.report_run_canceled(
                fresh,
                message=f"replaced: its documents run in the runs of replan "
                f"{taken[documents[0]]} of backfill {backfill_id} (ai_pipeline's backfill planner)",
            )
            # Then gone: Dagster counts a cancelled run's documents as failed, and may end the
            # backfill COMPLETED_FAILED in the one loop where it reads the replan's last
            # materializations before they are written and its runs as over after.
            instance.delete_run(fresh.run_id)
            cancelled += 1
    if replan is None and not cancelled:
        return None
    return Replanned(backfill_id, cancelled, len(replan.runs) if replan else 0, replan)


def replan_open_backfills(
    instance: dg.DagsterInstance, store: Store, site: Site, task_suffix: str, policy_size: int
) -> list[Replanned]:
    """``replan_backfill`` for every backfill of which Dagster has a run not over."""
    open_runs = instance.get_runs(
        dg.RunsFilter(
            statuses=[
                dg.DagsterRunStatus.QUEUED,
                dg.DagsterRunStatus.NOT_STARTED,
                dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED,
            ]
        )
    )
    backfills = sorted({b for run in open_runs if (b := planned_by_dagster(run, site))})
    done = [replan_backfill(instance, store, site, task_suffix, b, policy_size) for b in backfills]
    return [d for d in done if d is not None]


def replans_hold(runs: Iterable[dg.DagsterRun], partition_keys: Sequence[str]) -> set[str]:
    """The documents that a run of a replan, among ``runs``, holds."""
    return {d for run in runs if REPLAN_TAG in run.tags for d in run_documents(run, partition_keys)}


def left_to_replans(store: Store, run: dg.DagsterRun, document_ids: Sequence[str]) -> set[str]:
    """The documents of a run of a backfill that a replan took: they run in its runs, not here."""
    backfill_id = run.tags.get(DAGSTER_BACKFILL_TAG)
    if not backfill_id or REPLAN_TAG in run.tags:
        return set()
    taken = store.replans.taken(backfill_id)
    return {d for d in document_ids if d in taken}


# How long a run whose documents a replan took waits for the replan's runs: past READY_SECONDS,
# the backfill planner sensor requests them on its next tick.
HANDOVER_SECONDS = 360.0


def hand_over(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    site: Site,
    document_ids: Iterable[str],
    *,
    timeout: float = HANDOVER_SECONDS,
    poll: float = 1.0,
) -> bool:
    """Wait until runs of a replan hold ``document_ids``, taken from ``run`` by a replan: the
    backfill stays open while a run of it is not over, so until then this run must not end (a
    backfill whose runs are all over ends, and those documents would never have run). Whether
    they exist; False after ``timeout`` (the backfill planner sensor is stopped)."""
    backfill_id = run.tags[DAGSTER_BACKFILL_TAG]
    wanted = set(document_ids)
    deadline = time.monotonic() + timeout
    keys: Sequence[str] | None = None
    while True:
        runs = instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: backfill_id}))
        if any(REPLAN_TAG in r.tags for r in runs):
            keys = keys or instance.get_dynamic_partitions(site.partitions)
            if wanted <= replans_hold(runs, keys):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)


def missed_retries(
    instance: dg.DagsterInstance, *, now: float | None = None
) -> list[dg.DagsterRun]:
    """The failed runs marked to be retried that have no retry, failed between a day and
    ``MISSED_RETRY_SECONDS`` ago: Dagster's consumer of failures read the failure before the run
    was marked to be retried, and passed over it for good."""
    now = time.time() if now is None else now
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE],
            tags={WILL_RETRY_TAG: "true"},
            updated_after=datetime.fromtimestamp(now - MISSED_RETRY_LOOKBACK_SECONDS, UTC),
            updated_before=datetime.fromtimestamp(now - MISSED_RETRY_SECONDS, UTC),
        )
    )
    return [r.dagster_run for r in records if AUTO_RETRY_RUN_ID_TAG not in r.dagster_run.tags]


def release_missed_retries(
    instance: dg.DagsterInstance, site: Site, *, now: float | None = None
) -> list[str]:
    """A backfill's ``missed_retries`` of ``site``'s analysis, marked not to be retried: their
    backfill no longer waits for a retry that never comes, and ends; their documents wait, FAILED
    and retryable, for ``backfill --failed`` or the nightly schedule. Their ids."""
    released = []
    for run in missed_retries(instance, now=now):
        if DAGSTER_BACKFILL_TAG not in run.tags or not _analyses(run, site):
            continue
        instance.add_run_tags(run.run_id, {WILL_RETRY_TAG: "false"})
        released.append(run.run_id)
    return released


# The longest a replan's run waits for Dagster to have created its own runs of its documents.
READY_SECONDS = 300.0


def replan_requests(
    instance: dg.DagsterInstance,
    store: Store,
    site: Site,
    after: int,
    *,
    now: float | None = None,
) -> tuple[list[dg.RunRequest], int]:
    """The runs of the replans recorded after the replan ``after`` that may start and do not
    exist yet, and the last replan (in order) whose every run exists or is requested here.

    A run may start once Dagster has created a run of its own for each of its documents (none is
    then created after it checked them: a check that a cancelled run planned would be their
    latest, shown as skipped), or after ``READY_SECONDS``. Dagster creates a backfill's runs in
    partition order, and so are a replan's runs: the first may start while it creates the rest.
    Each request is keyed by its replan and documents (the daemon drops a key it has seen)."""
    now = time.time() if now is None else now
    out: list[dg.RunRequest] = []
    done = after
    settled = True
    keys: Sequence[str] | None = None
    for replan in store.replans.after(after):
        runs = instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: replan.backfill_id}))
        existing = {r.tags.get("dagster/run_key") for r in runs if REPLAN_TAG in r.tags}
        keys = keys if keys is not None else instance.get_dynamic_partitions(site.partitions)
        covered = {d for r in runs if planned_by_dagster(r, site) for d in run_documents(r, keys)}
        waited = now - replan.created_at.timestamp() > READY_SECONDS
        template = _replaced(runs, replan)
        all_in = True
        for documents in replan.runs:
            request = _request(replan, documents, template, site)
            if request.run_key in existing:
                continue
            if waited or all(d in covered for d in documents):
                out.append(request)
            else:
                all_in = False
        settled = settled and all_in
        if settled:
            done = replan.seq
    return out, done


def _request(
    replan: Replan, documents: Sequence[str], template: dg.DagsterRun, site: Site
) -> dg.RunRequest:
    """A run of the replan's: its documents, under the backfill, with the tags and the selection
    of assets and checks of a run Dagster planned for the backfill (``template``)."""
    digest = hashlib.sha256("\n".join(documents).encode()).hexdigest()[:16]
    inherited = {k: v for k, v in template.tags.items() if k not in _OWN_TAGS}
    try:
        priority = int(inherited.get(PRIORITY_TAG, "0")) + 1
    except ValueError:
        priority = 1
    return dg.RunRequest(
        run_key=f"replan:{replan.seq}:{digest}",
        job_name=site.job_name,
        asset_selection=sorted(template.asset_selection or site.keys),
        asset_check_keys=(
            sorted(template.asset_check_selection)
            if template.asset_check_selection is not None
            else None
        ),
        run_config=naming_config(documents, site.op) if replan.named else {},
        tags={
            **inherited,
            **range_tags(documents),
            DAGSTER_BACKFILL_TAG: replan.backfill_id,
            REPLAN_TAG: str(replan.seq),
            # Ahead of the backfill's queued runs: those it replaces are cancelled once it exists.
            PRIORITY_TAG: str(priority),
        },
    )


def _replaced(runs: Sequence[dg.DagsterRun], replan: Replan) -> dg.DagsterRun:
    """A run Dagster planned for the replan's backfill: its tags from the backfill (batch,
    budget, analysis…) and its selection of assets and checks are the new runs'."""
    dagsters = [r for r in runs if DOCUMENTS_TAG not in r.tags]
    if not dagsters:
        raise dg.DagsterInvariantViolationError(
            f"replan {replan.seq}: backfill {replan.backfill_id} has no run Dagster planned"
        )
    return dagsters[-1]


def _analyses(run: dg.DagsterRun, site: Site) -> bool:
    selection = run.asset_selection
    return bool(selection) and selection <= set(site.keys)  # type: ignore[operator]
