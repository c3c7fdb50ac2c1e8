"""Reconciling the documents with the runs that held them: none stays RUNNING once its run is over.

A document is RUNNING while a run holds its lease (``ai_pipeline.store.leases``) and works on it.
When the run ends without settling it — its worker was killed, it was terminated from the UI, its
process died — the document would stay RUNNING for ever. ``reconcile`` finds those documents and
moves them to FAILED with RUN_INTERRUPTED (retryable: the next launch or backfill finishes them),
records a failure event, and gives up the leases the run still had on them. A run is over when
Dagster says so (``run_status``), when its process is known to have ended on this machine, or
when it stopped renewing its lease (a process killed with SIGKILL that Dagster never hears of).

A run that ended before it even started some of its documents leaves them PENDING or QUEUED, where
no retry would look for them: ``fail_unstarted`` moves those to FAILED with RUN_INTERRUPTED too
(not counted as an attempt: nothing was tried).

The Dagster side calls this from the ``reconcile_sensor`` (``ai_pipeline.defs.sensors``) and before
``ai-pipeline status`` reports; nothing here knows Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ai_pipeline.failures import Category
from ai_pipeline.processes import gone
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store
from ai_pipeline.store.documents import ConcurrentChange, utcnow

# Dagster run statuses after which a run holds nothing.
RUN_OVER = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
# The states of a document no run has started.
UNSTARTED = frozenset({State.PENDING, State.QUEUED})


@dataclass(frozen=True)
class Interrupted:
    document_id: str
    run_id: str | None
    reason: str


def reconcile(
    store: Store, run_status: Callable[[Sequence[str]], Mapping[str, str]]
) -> list[Interrupted]:
    """Move every RUNNING document whose run is over to FAILED (RUN_INTERRUPTED).

    ``run_status`` maps run ids to their status (``"STARTED"``, ``"FAILURE"``, …) for the runs it
    knows; a run it does not know is judged by its leases alone.
    """
    running = store.documents.rows_in_state(State.RUNNING)
    if not running:
        return []
    statuses = run_status(sorted({d.run_id for d in running if d.run_id}))
    leases = store.leases.of_documents([d.document_id for d in running])
    now = utcnow()
    out: list[Interrupted] = []
    for doc in running:
        status = statuses.get(doc.run_id) if doc.run_id else None
        live = [
            lease
            for lease in leases.get(doc.document_id, [])
            if lease.live(now) and not gone(lease.process)
        ]
        if status in RUN_OVER:
            reason = f"its run {doc.run_id} ended ({status}) before the document did"
        elif not live:
            reason = (
                f"its run {doc.run_id or '(unknown)'} stopped holding it (its process ended, "
                "or its claim expired: the process died or lost the database)"
            )
        else:
            continue
        reason += "; the next launch or `ai-pipeline backfill --failed` finishes it"
        try:
            store.documents.transition(
                doc.document_id,
                State.FAILED,
                category=Category.RUN_INTERRUPTED,
                error=reason,
                count_attempt=True,
                expected_run_id=doc.run_id,
            )
        except (ConcurrentChange, IllegalTransition):
            continue  # another run took it over meanwhile: it is not interrupted
        store.events.record_failure(
            doc.document_id,
            Category.RUN_INTERRUPTED,
            reason,
            task_id=doc.task_id,
            run_id=doc.run_id,
            attempt=doc.attempts + 1,
        )
        if doc.run_id and status in RUN_OVER:
            store.leases.release_owner(doc.run_id)
        out.append(Interrupted(doc.document_id, doc.run_id, reason))
    return out


def fail_unstarted(store: Store, run_id: str, document_ids: Sequence[str]) -> list[Interrupted]:
    """Move the documents of an ended run that it never started (PENDING or QUEUED) to FAILED,
    RUN_INTERRUPTED, retryable; one that another run has started or settled meanwhile is left
    to it."""
    reason = (
        f"its run {run_id} ended before starting it; the next launch or "
        "`ai-pipeline backfill --failed` runs it"
    )
    out: list[Interrupted] = []
    for doc in store.documents.rows(document_ids):
        if doc.state not in UNSTARTED:
            continue
        try:
            store.documents.transition(
                doc.document_id,
                State.FAILED,
                through=State.QUEUED,
                category=Category.RUN_INTERRUPTED,
                error=reason,
                run_id=run_id,
                expected=doc.state,
            )
        except (ConcurrentChange, IllegalTransition):
            continue  # a run took it meanwhile
        store.events.record_failure(
            doc.document_id,
            Category.RUN_INTERRUPTED,
            reason,
            task_id=doc.task_id,
            run_id=run_id,
            attempt=doc.attempts,
        )
        out.append(Interrupted(doc.document_id, run_id, reason))
    return out
