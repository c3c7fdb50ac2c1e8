"""A run whose settings the endpoint refuses, at the engine (``Analyser`` + ``run_batch``) on a
real SQLite store, against the simulator in OpenAI rules mode: the run stops after at most its
concurrency in calls, and its documents stay as they were for the next run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ai_pipeline.batch import run_batch
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import LLMClient
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.reporting import status_report
from ai_pipeline.stages import StageDone, StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline_tests.support import TEST_API_KEY, FakeTime, RecordingLog, sample_text

CONCURRENCY = 4
SERVED = ("gpt-4o-mini",)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'engine.sqlite'}")
    yield s
    s.db.dispose()


@pytest.fixture(scope="module")
def openai_like() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(openai_rules=True, models=SERVED)) as server:
        yield server


def register(store: Store, n: int) -> list[str]:
    ids = []
    for i in range(n):
        doc = parse_document(sample_text(i).encode("utf-8"), f"inbox/doc-{i}.txt")
        store.documents.register(doc)
        ids.append(doc.document_id)
    return ids


def run(store: Store, server: SimulatorServer, model: str, ids: Sequence[str]) -> dict:
    fake = FakeTime()
    client = LLMClient(
        base_url=server.base_url,
        api_key=TEST_API_KEY,
        model=model,
        max_concurrency=CONCURRENCY,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    analyser = Analyser(store, client, store.results, log=RecordingLog(), run_id=f"run-{model}")
    return dict(run_batch(analyser, ids))


def test_a_model_that_does_not_exist_stops_the_run_and_leaves_the_documents(
    store: Store, openai_like: SimulatorServer
) -> None:
    """20 documents under a misspelt model: at most the run's concurrency in calls, every
    document QUEUED with the one message naming the model, 0 in review, 0 attempts counted;
    a rerun with the right model completes them all."""
    openai_like.reset()
    ids = register(store, 20)

    events = run(store, openai_like, "gpt-4o-mnii", ids)

    assert openai_like.stats()["total"] <= CONCURRENCY
    failed = [e for evs in events.values() for e in evs if isinstance(e, StageFailed)]
    assert len(failed) == 20
    assert {f.category for f in failed} == {Category.CONFIGURATION}
    rows = store.documents.rows(ids)
    assert {r.state for r in rows} == {State.QUEUED}
    assert {r.attempts for r in rows} == {0}
    assert {r.category for r in rows} == {Category.CONFIGURATION}
    (message,) = {r.last_error for r in rows}
    assert message is not None
    assert "the endpoint has no model 'gpt-4o-mnii' (404 model_not_found)" in message
    assert "AI_PIPELINE_MODEL" in message
    assert store.reviews.items() == []
    assert status_report(store, ids)["stopped"] == message

    openai_like.reset()
    events = run(store, openai_like, "gpt-4o-mini", ids)

    assert all(isinstance(e, StageDone) for evs in events.values() for e in evs)
    rows = store.documents.rows(ids)
    assert {r.state for r in rows} == {State.COMPLETED}
    assert {r.attempts for r in rows} == {0}
    assert status_report(store, ids)["stopped"] is None
    assert openai_like.stats()["total"] == 20


def test_a_failed_document_held_by_a_stop_keeps_its_attempts(
    store: Store, openai_like: SimulatorServer
) -> None:
    """A document that had failed once before is taken by a run that stops on its settings: its
    attempt count is what it was, and it is not in the dead letter."""
    openai_like.reset()
    (d,) = register(store, 1)
    store.documents.transition(d, State.RUNNING, through=State.QUEUED)
    store.documents.transition(
        d, State.FAILED, category=Category.NETWORK_TIMEOUT, error="earlier", count_attempt=True
    )

    run(store, openai_like, "gpt-4o-mnii", [d])

    row = store.documents.get(d)
    assert row is not None
    assert (row.state, row.category, row.attempts) == (State.QUEUED, Category.CONFIGURATION, 1)
