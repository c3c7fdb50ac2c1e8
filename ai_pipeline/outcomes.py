"""Where a run takes a document up (RUNNING) and where it leaves it: its final state, its failure
events, a person's queue, the dead letter — or, when the run stopped on its own settings, back in
the queue as it was; and a person's ``requeue`` out of the dead letter.

``ai_pipeline.engine`` decides what happened to a document; this records it, along the state
machine of ``ai_pipeline.states``.
"""

from __future__ import annotations

from typing import Protocol

from ai_pipeline.failures import Category
from ai_pipeline.redaction import redact
from ai_pipeline.retry import Log
from ai_pipeline.review import send_to_review
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store
from ai_pipeline.store.documents import ConcurrentChange
from ai_pipeline.store.rows import StoredDocument


class Failure(Protocol):
    """How a document failed (``ai_pipeline.stages.StageFailed``)."""

    @property
    def stage(self) -> str: ...
    @property
    def category(self) -> Category: ...
    @property
    def error(self) -> str: ...
    @property
    def task_id(self) -> str | None: ...


# How many times a run starting a document reads it again after a concurrent move.
START_ATTEMPTS = 3


def start(store: Store, doc: StoredDocument, run_id: str | None) -> State:
    """Move a document (whose claim the caller holds, just loaded) to RUNNING along the legal path,
    in one update; returns the state it was in. COMPLETED and CANCELLED documents keep their
    state: a rerun only re-reports their checkpoints.

    The claim keeps other runs away, not the reconciler: a document left RUNNING by a run that
    died (a lost worker host) may be moved to FAILED, RUN_INTERRUPTED, between this update's read
    and its write — the retry of that run meeting the reconcile sensor. The update's
    compare-and-set then fails; the document is read again and started from where it is now."""
    for attempt in range(1, START_ATTEMPTS + 1):
        if doc.state in (State.COMPLETED, State.CANCELLED):
            return doc.state
        try:
            # From PENDING, FAILED or DEAD_LETTER through QUEUED; or RUNNING left behind by a run
            # that died.
            return store.documents.transition(
                doc.document_id,
                State.RUNNING,
                through=State.QUEUED,
                run_id=run_id,
                likely=doc.state,
            )
        except ConcurrentChange:
            fresh = store.documents.load(doc.document_id)
            if fresh is None or attempt == START_ATTEMPTS:
                raise
            doc = fresh
    raise AssertionError("unreachable")


class Outcomes:
    """The records of one run's document outcomes."""

    def __init__(self, store: Store, *, run_id: str | None, retry_budget: int):
        self.store = store
        self.run_id = run_id
        self.retry_budget = retry_budget

    def settle(self, document_id: str, target: State, **values: object) -> None:
        """Move a document this run holds to its final state; if the reconciler moved it to FAILED
        meanwhile (this run's claim expired while the database was away), take it back first."""
        try:
            self.store.documents.transition(  # RUNNING, started by this run: moved without a read
                document_id,
                target,
                likely=State.RUNNING,
                **values,  # type: ignore[arg-type]
            )
        except IllegalTransition:
            self.store.documents.transition(document_id, State.QUEUED)
            self.store.documents.transition(document_id, State.RUNNING, run_id=self.run_id)
            self.store.documents.transition(document_id, target, **values)  # type: ignore[arg-type]

    def hold(self, doc: StoredDocument, failure: Failure, reason: str, log: Log) -> None:
        """A run stopped by its own settings lets go of the document as it found it: back to
        QUEUED for the next run, no attempt counted, no review; the reason is on it and in the
        failure events. Every document held carries the one message of the stop."""
        document_id = doc.document_id
        try:
            self.store.documents.transition(
                document_id, State.QUEUED, category=failure.category, error=redact(reason)
            )
        except IllegalTransition:
            return  # the reconciler took it meanwhile (this run's claim expired): it is settled
        self.store.events.record_failure(
            document_id,
            failure.category,
            failure.error,
            task_id=failure.task_id,
            run_id=self.run_id,
            attempt=doc.attempts,
        )
        log.warning(f"not analysed, the run stopped ({failure.category.value}): {reason}")

    def fail(self, doc: StoredDocument, failure: Failure, log: Log) -> None:
        """Record a document's failure: its state, a failure event, and a person's queue if due."""
        document_id, task = doc.document_id, failure.task_id
        # A call the budget stopped was never made: not an attempt, never the dead letter.
        unsent = failure.category == Category.BUDGET_REACHED
        self.settle(
            document_id,
            State.FAILED,
            category=failure.category,
            error=failure.error,
            task_id=task,
            count_attempt=not unsent,
        )
        after = self.store.documents.get(document_id)
        attempts = after.attempts if after else 1
        self.store.events.record_failure(
            document_id,
            failure.category,
            failure.error,
            task_id=task,
            run_id=self.run_id,
            attempt=attempts,
        )
        if failure.category.needs_person:
            send_to_review(self.store, doc, failure.category, failure.error, task)
        log.error(f"failed at {failure.stage}: {failure.category.value}: {failure.error}")
        if failure.category.retryable and attempts >= self.retry_budget and not unsent:
            self.store.documents.transition(document_id, State.DEAD_LETTER)
            detail = f"{attempts} retryable failures (budget {self.retry_budget})"
            self.store.events.add_history(document_id, "DEAD_LETTER", detail, task_id=task)
            log.error(f"moved to DEAD_LETTER after {detail}; `ai-pipeline requeue` puts it back")


def requeue(store: Store, document_id: str, *, by: str) -> bool:
    """Take a document out of the dead letter (attempts reset) so that the next backfill picks it
    up; False when it is not in the dead letter. Raises KeyError for an unknown document."""
    doc = store.documents.get(document_id)
    if doc is None:
        raise KeyError(document_id)
    if doc.state != State.DEAD_LETTER:
        return False
    store.documents.transition(document_id, State.QUEUED, reset_attempts=True)
    store.events.add_history(document_id, "REQUEUED", f"by {by}")
    return True
