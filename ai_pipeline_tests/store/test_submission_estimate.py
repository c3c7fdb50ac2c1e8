"""The submission service's ``estimated_seconds``: from the measured call time and the queue."""

from __future__ import annotations

from ai_pipeline.documents import parse_document
from ai_pipeline.service.estimate import DEFAULT_CALL_SECONDS, START_SECONDS, Estimator
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.tasks import ANALYSE_STEP, NOTIFY_STEP, section_step


def _queue(store: Store, n: int, state: State) -> None:
    docs = [parse_document(f"document {state.value} {i}".encode(), f"{i}.txt") for i in range(n)]
    store.documents.register_many(docs)
    ids = [d.document_id for d in docs]
    if state != State.PENDING:
        store.documents.queue(ids)
    if state == State.RUNNING:
        for i in ids:
            store.documents.transition(i, State.RUNNING)


def test_the_estimate_follows_the_measured_calls_and_the_documents_ahead(store: Store) -> None:
    clock = [0.0]
    estimator = Estimator(store, concurrency=4, section_chars=100, clock=lambda: clock[0])
    # Nothing measured, nothing ahead: one wave of the default call time.
    assert estimator.seconds("short") == START_SECONDS + DEFAULT_CALL_SECONDS

    for i, (step, ms) in enumerate(
        [(ANALYSE_STEP, 1000), (ANALYSE_STEP, 3000), (section_step(1), 2000), (NOTIFY_STEP, 9)]
    ):
        store.checkpoints.put(f"t{i}", "d", step, {"latency_ms": ms} if ms != 9 else {})
    _queue(store, 5, State.QUEUED)
    _queue(store, 2, State.RUNNING)
    _queue(store, 3, State.PENDING)  # registered, not launched: not ahead
    # The call time is read again only after refresh_seconds.
    assert estimator.seconds("short") == START_SECONDS + 2 * DEFAULT_CALL_SECONDS
    clock[0] = 31.0
    # Median of 1, 3 and 2 s (the notice's checkpoint has no latency); 7 ahead + 1 = 2 waves.
    assert estimator.seconds("short") == START_SECONDS + 2 * 2
    # A document of three sections: 7 + 3 = 10 calls, 3 waves of 4.
    long_text = "\n\n".join(f"{k}. " + "clause text " * 7 for k in range(1, 4))
    assert estimator.seconds(long_text) == START_SECONDS + 3 * 2
    assert store.documents.count_in([State.QUEUED, State.RUNNING]) == 7
