"""The batch engine without Dagster: ``Analyser`` and ``run_batch`` on a real SQLite store, with
the openai SDK over HTTP against the simulator."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ai_pipeline.batch import run_batch
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import LLMClient
from ai_pipeline.outcomes import requeue, start
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.review import reject
from ai_pipeline.stages import STAGES, Stage, StageDone, StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.documents import ConcurrentChange
from ai_pipeline.store.rows import ResultRow, ReviewStatus
from ai_pipeline_tests.support import (
    TEST_API_KEY,
    TEST_MODEL,
    FakeTime,
    RecordingLog,
    doc_id,
    sample_text,
    task_of,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'engine.sqlite'}")
    yield s
    s.db.dispose()


def register(store: Store, texts: Sequence[str]) -> list[str]:
    ids = []
    for i, text in enumerate(texts):
        doc = parse_document(text.encode("utf-8"), f"inbox/doc-{i}.txt")
        store.documents.register(doc)
        ids.append(doc.document_id)
    return ids


def analyser(
    store: Store,
    simulator: SimulatorServer,
    *,
    log: RecordingLog | None = None,
    results: object | None = None,
    retry_budget: int = 3,
    max_concurrency: int = 4,
) -> Analyser:
    fake = FakeTime()
    client = LLMClient(
        base_url=simulator.base_url,
        api_key=TEST_API_KEY,
        model=TEST_MODEL,
        max_concurrency=max_concurrency,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    return Analyser(
        store,
        client,
        results or store.results,  # type: ignore[arg-type]
        log=log or RecordingLog(),
        run_id="run-1",
        retry_budget=retry_budget,
    )


def run(a: Analyser, ids: Sequence[str]) -> dict[str, list[StageDone | StageFailed]]:
    return dict(run_batch(a, ids))


def test_a_batch_completes_every_document_once(store: Store, simulator: SimulatorServer) -> None:
    """Every document of a batch gets one call, one results row, COMPLETED, and its stages."""
    ids = register(store, [sample_text(i) for i in range(6)])

    events = run(analyser(store, simulator), ids)

    assert set(events) == set(ids)
    for d in ids:
        assert [e.stage for e in events[d]] == list(STAGES)
        assert all(isinstance(e, StageDone) for e in events[d])
        assert simulator.requests_for(task_of(d)) == 1
    assert [r.document_id for r in store.results.get()] == sorted(ids)
    assert {d.state for d in store.documents.rows()} == {State.COMPLETED}
    assert store.events.failures() == []


def test_a_checkpointed_answer_is_never_bought_again(
    store: Store, simulator: SimulatorServer
) -> None:
    """A second batch over completed documents makes no call and still reports every stage."""
    ids = register(store, [sample_text(i) for i in range(3)])
    run(analyser(store, simulator), ids)

    again = run(analyser(store, simulator), ids)

    assert simulator.stats()["total"] == 3
    llm = [e for d in ids for e in again[d] if e.stage == "llm_analysis"]
    assert [e.metadata["from_checkpoint"] for e in llm] == [True] * 3  # type: ignore[union-attr]
    assert store.results.count() == 3


def test_one_failure_fails_that_document_alone(store: Store, simulator: SimulatorServer) -> None:
    """A 400 for one document fails it (INPUT_QUALITY_ISSUE, a review item with a snapshot);
    the others complete, and every line about it carries its task id."""
    bad_text = "Poison request for Vega Instruments in Oslo. " + sample_text(99)
    ids = register(store, [sample_text(1), bad_text, sample_text(2)])
    bad = doc_id(bad_text)
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Poison request"}])
    log = RecordingLog()

    events = run(analyser(store, simulator, log=log), ids)

    (failure,) = [e for e in events[bad] if isinstance(e, StageFailed)]
    assert (failure.stage, failure.category, failure.task_id) == (
        "llm_analysis",
        Category.INPUT_QUALITY_ISSUE,
        task_of(bad),
    )
    assert [e.stage for e in events[bad] if isinstance(e, StageDone)] == ["document_text"]
    row = store.documents.get(bad)
    assert row is not None
    assert (row.state, row.category, row.attempts) == (State.FAILED, failure.category, 1)
    item = store.reviews.get(bad)
    assert item is not None and item.status == ReviewStatus.OPEN
    assert item.snapshot.first_characters.startswith("Poison request")
    assert [e.category for e in store.events.failures(bad)] == [Category.INPUT_QUALITY_ISSUE]
    assert {d for d in ids if d != bad} == {r.document_id for r in store.results.get()}
    about_bad = [line for line in log.lines if bad in line]
    assert about_bad and all(line.startswith(f"[TASK:{task_of(bad)}]") for line in about_bad)


def test_retryable_failures_end_in_the_dead_letter(
    store: Store, simulator: SimulatorServer
) -> None:
    """A document that fails retryably ``retry_budget`` times moves to DEAD_LETTER; requeue puts
    it back with its attempts reset."""
    (d,) = register(store, [sample_text(5)])
    simulator.set_faults([{"kind": "status", "status": 503}])
    for attempt in (1, 2):
        run(analyser(store, simulator, retry_budget=2), [d])
        row = store.documents.get(d)
        assert row is not None and row.attempts == attempt
    row = store.documents.get(d)
    assert row is not None and row.state == State.DEAD_LETTER
    assert [h.event for h in store.events.history(d)] == ["DEAD_LETTER"]
    assert simulator.requests_for(task_of(d)) == 6, "three requests per run, two runs"

    assert requeue(store, d, by="ops") is True
    row = store.documents.get(d)
    assert row is not None and (row.state, row.attempts) == (State.QUEUED, 0)
    assert requeue(store, d, by="ops") is False
    with pytest.raises(KeyError):
        requeue(store, "unknown", by="ops")


def test_a_rejected_document_is_never_processed(store: Store, simulator: SimulatorServer) -> None:
    """A document a reviewer rejected makes no call and is reported failed with the rejection."""
    (d,) = register(store, [sample_text(7)])
    simulator.set_faults([{"kind": "status", "status": 422}])
    run(analyser(store, simulator), [d])
    reject(store, d, reason="文件损坏", by="qa")
    simulator.set_faults([])
    calls = simulator.stats()["total"]

    events = run(analyser(store, simulator), [d])

    (failure,) = events[d]
    assert isinstance(failure, StageFailed) and "rejected by a reviewer" in failure.error
    assert simulator.stats()["total"] == calls
    assert store.results.count() == 0


@pytest.mark.parametrize(
    ("error", "category", "message"),
    [
        (ZeroDivisionError("a bug"), Category.INTERNAL_ERROR, "ZeroDivisionError: a bug"),
        (
            StoreUnavailable("the results database is unreachable"),
            Category.DATABASE_UNAVAILABLE,
            "the results database is unreachable",
        ),
    ],
    ids=["bug", "database-outage"],
)
def test_a_failure_while_storing_one_document_fails_it_alone_at_analysis_results(
    store: Store, simulator: SimulatorServer, error: Exception, category: Category, message: str
) -> None:
    """An exception while one document's row is written (a bug, or the database gone past its
    retries) fails that document alone, at analysis_results, in the exception's category."""
    ids = register(store, [sample_text(10), sample_text(11)])
    broken = ids[0]

    class Writer:
        def upsert(self, rows: Sequence[ResultRow]) -> int:
            if rows[0].document_id == broken:
                raise error
            return store.results.upsert(rows)

    events = run(analyser(store, simulator, results=Writer()), ids)

    (failure,) = [e for e in events[broken] if isinstance(e, StageFailed)]
    assert failure.category == category
    assert failure.stage == Stage.ANALYSIS_RESULTS
    assert message in failure.error
    done = store.documents.get(ids[1])
    assert done is not None and done.state == State.COMPLETED


def test_an_unregistered_document_is_an_internal_error(
    store: Store, simulator: SimulatorServer
) -> None:
    """Asking for a document the store does not know fails it without a call."""
    events = run(analyser(store, simulator), ["0" * 20])
    (failure,) = events["0" * 20]
    assert isinstance(failure, StageFailed) and failure.category == Category.INTERNAL_ERROR
    assert simulator.stats()["total"] == 0


def test_log_lines_reach_the_callers_thread(store: Store, simulator: SimulatorServer) -> None:
    """Lines written while documents run on the worker thread are logged on the caller's."""
    ids = register(store, [sample_text(20), sample_text(21)])
    threads: set[str] = set()

    class ThreadLog(RecordingLog):
        def info(self, msg: str) -> None:
            threads.add(threading.current_thread().name)
            super().info(msg)

    log = ThreadLog()
    run(analyser(store, simulator, log=log), ids)
    assert threads == {threading.current_thread().name}
    assert any(line.endswith("completed") for line in log.infos)


def test_closing_the_batch_early_cancels_the_rest(store: Store) -> None:
    """Stopping after the first finished document cancels the documents still waiting: with one
    call at a time, none goes out after the close, each call made was answered and its answer
    kept (the documents that had not completed stop at their checkpoint), and the documents still
    waiting were never called. How many were called depends on how long the caller took to
    close, and how many of those completed on how far each got after its answer: neither is the
    engine's to promise."""
    ids = register(store, [sample_text(30 + i) for i in range(16)])
    with SimulatorServer(SimulatorConfig(latency_ms=200)) as slow:
        # One client for the calls and for the stop: the analyser's own.
        a = analyser(store, slow, max_concurrency=1)
        batch = run_batch(a, ids)
        first, _ = next(batch)
        batch.close()
        assert first in ids
        calls = slow.stats()["total"]
        time.sleep(0.3)  # a call sent after the close would have been answered by now
        stats = slow.stats()
        assert stats["total"] == calls, "no call goes out after the close"
    assert stats["peak_in_flight"] == 1, "one call at a time"
    requests = stats["requests"]
    assert [r["status"] for r in requests] == [200] * calls, "none was abandoned"
    answered = {r["key"] for r in requests}
    assert len(answered) == calls, "a call per document"
    assert {t for t in answered if store.checkpoints.get(t) is not None} == answered
    completed = {d.document_id for d in store.documents.rows() if d.state == State.COMPLETED}
    assert first in completed
    assert len(completed) <= calls
    assert calls < len(ids), "the documents still waiting were never called"


def test_closing_the_batch_while_calls_are_in_flight_keeps_their_answers(store: Store) -> None:
    """A batch closed while calls are in flight (a Dagster step that failed, a run terminated)
    lets those calls come in and checkpoints their answers before it ends: every answer the
    endpoint gave is kept, so no rerun buys it again; no call goes out after the close."""
    ids = register(store, [sample_text(40 + i) for i in range(12)])
    with SimulatorServer(SimulatorConfig(latency_ms=400)) as slow:
        a = analyser(store, slow)
        batch = run_batch(a, ids)
        next(batch)  # the probe call's document; the next calls are now in flight
        batch.close()
        requests = slow.stats()["requests"]
        time.sleep(0.6)  # anything sent after the close would have been answered by now
        assert slow.stats()["total"] == len(requests), "no call goes out after the close"
    assert len(requests) > 1, "calls were in flight at the close"
    assert [r["status"] for r in requests] == [200] * len(requests), "none was abandoned"
    answered = {r["key"] for r in requests}
    assert {t for t in answered if store.checkpoints.get(t) is not None} == answered
    completed = {d.document_id for d in store.documents.rows() if d.state == State.COMPLETED}
    assert len(completed) == 1, "the stopped ones go no further than their checkpoint"


def test_two_runs_over_the_same_documents_pay_once(store: Store) -> None:
    """Two runs started together on the same documents: each document is called for once, by
    whichever run claimed it; the other waits and re-reports it from the checkpoint."""
    texts = [sample_text(60 + i) for i in range(12)]
    ids = register(store, texts)
    outcomes: dict[str, dict[str, list[StageDone | StageFailed]]] = {}
    with SimulatorServer(SimulatorConfig(latency_ms=300)) as slow:

        def one_run(run_id: str) -> None:
            a = analyser(store, slow)
            a.run_id = run_id
            a.claims.owner = run_id
            a.claims.poll_seconds = 0.05
            outcomes[run_id] = run(a, ids)

        runs = [threading.Thread(target=one_run, args=(f"run-{i}",)) for i in (1, 2)]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        assert {slow.requests_for(task_of(d)) for d in ids} == {1}
        assert slow.stats()["total"] == len(ids)
    for events in outcomes.values():
        assert set(events) == set(ids)
        assert not [e for es in events.values() for e in es if not isinstance(e, StageDone)]
    assert {d.state for d in store.documents.rows()} == {State.COMPLETED}
    assert store.results.count() == len(ids)
    assert store.leases.of_documents(ids) == {}, "every claim given up"


def test_a_batch_works_on_a_window_of_documents_not_on_all_of_them_at_once(
    store: Store, simulator: SimulatorServer
) -> None:
    """A document is claimed (and its bookkeeping done) only when its turn is near: at most two
    per call that can be in flight, so the first calls do not wait for the whole batch's."""
    ids = register(store, [sample_text(i) for i in range(30)])
    a = analyser(store, simulator)  # 4 calls in flight: a window of 8 documents
    held: list[int] = []
    take = a.claims.take

    async def counting_take(*args: object, **kwargs: object) -> str | None:
        holder = await take(*args, **kwargs)  # type: ignore[arg-type]
        held.append(len(a.claims.held))
        return holder

    a.claims.take = counting_take  # type: ignore[method-assign]

    events = run(a, ids)

    assert set(events) == set(ids) and store.results.count() == 30
    assert len(held) == 30
    assert 4 < max(held) <= 8, held


def test_a_document_waiting_for_another_runs_claim_leaves_its_place_in_the_window(
    store: Store, simulator: SimulatorServer
) -> None:
    """Three documents another live run holds come first in a batch whose window has two places:
    while they wait for that run, the other documents go through, and only then are the three
    left to it."""
    ids = register(store, [sample_text(i) for i in range(9)])
    held_elsewhere, free = ids[:3], ids[3:]
    for d in held_elsewhere:
        assert store.leases.claim(task_of(d), d, "other-run", 600)
    client = LLMClient(
        base_url=simulator.base_url, api_key=TEST_API_KEY, model=TEST_MODEL, max_concurrency=1
    )
    a = Analyser(
        store,
        client,
        store.results,
        log=RecordingLog(),
        run_id="run-1",
        lease_seconds=3,  # asks again every 0.3 s
        claim_wait_seconds=2,
    )

    order = [d for d, _ in run_batch(a, ids)]

    assert sorted(order[:6]) == sorted(free), order
    assert sorted(order[6:]) == sorted(held_elsewhere)
    assert {d: simulator.requests_for(task_of(d)) for d in ids} == {
        **{d: 0 for d in held_elsewhere},
        **{d: 1 for d in free},
    }
    assert store.results.count() == 6


def test_a_run_starting_a_document_the_reconciler_moves_at_that_instant_starts_it_anyway(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry of a lost run takes a document left RUNNING by the dead run while the reconcile
    sensor moves it to FAILED, RUN_INTERRUPTED: the retry's compare-and-set loses (seen in the
    lost-host scale-out test: INTERNAL_ERROR "changed state concurrently"). It reads the document
    again and starts it from FAILED."""
    (doc_id,) = register(store, [sample_text(7)])
    store.documents.transition(doc_id, State.RUNNING, through=State.QUEUED, run_id="dead")
    stale = store.documents.load(doc_id)
    assert stale is not None and stale.state == State.RUNNING
    documents = store.documents
    real = documents.transition
    raced: list[str] = []

    def transition(document_id: str, target: State, **kw: object) -> State:
        if not raced:
            # The reconciler's move lands between this update's read and its write.
            raced.append(document_id)
            real(
                document_id, State.FAILED, category=Category.RUN_INTERRUPTED, expected_run_id="dead"
            )
            raise ConcurrentChange(f"document {document_id} changed state concurrently")
        return real(document_id, target, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(documents, "transition", transition)

    assert start(store, stale, "retry") == State.FAILED
    now = store.documents.get(doc_id)
    assert now is not None and (now.state, now.run_id) == (State.RUNNING, "retry")
