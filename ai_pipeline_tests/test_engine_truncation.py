"""Replies cut off at their token limit, at the engine on a real SQLite store against the
simulator (which stops a reply at ``max_tokens`` with ``finish_reason: "length"``): asked once
more with twice the limit, then reviewed as a truncated SCHEMA_VIOLATION. Also replies that are
not bare JSON, and documents too long for the model's context."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.batch import run_batch
from ai_pipeline.declaration import Declaration, ModelSettings
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import LLMClient
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.stages import StageDone, StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.truncation import larger_limit
from ai_pipeline_tests.support import TEST_API_KEY, TEST_MODEL, FakeTime, RecordingLog, sample_text

TEXT = sample_text(4)


def with_limit(limit: int | None) -> Declaration:
    model = DOCUMENT_ANALYSIS.model.model_copy(update={"max_output_tokens": limit})
    return DOCUMENT_ANALYSIS.model_copy(update={"model": model})


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Any]:
    made: list[Store] = []

    def make(limit: int | None) -> Store:
        s = Store(f"sqlite:///{tmp_path / f'{len(made)}.sqlite'}", analysis=with_limit(limit))
        made.append(s)
        return s

    yield make
    for s in made:
        s.db.dispose()


def analyse(store: Store, server: SimulatorServer, model: str = TEST_MODEL) -> tuple[str, list]:
    doc = parse_document(TEXT.encode("utf-8"), "inbox/doc.txt")
    store.documents.register(doc)
    fake = FakeTime()
    client = LLMClient(
        base_url=server.base_url,
        api_key=TEST_API_KEY,
        model=model,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    analyser = Analyser(store, client, store.results, log=RecordingLog(), run_id="run-1")
    ((_, events),) = list(run_batch(analyser, [doc.document_id]))
    return analyser.task_for(doc.document_id), events


def limits_sent(server: SimulatorServer, task: str) -> list[int | None]:
    return [r["max_tokens"] for r in server.stats()["requests"] if r["key"] == task]


def needed_tokens(stores: Any, server: SimulatorServer) -> int:
    """How many completion tokens the simulator's full reply to ``TEXT`` takes."""
    store = stores(None)
    task, _ = analyse(store, server)
    payload = store.checkpoints.get(task)
    assert payload is not None and payload["finish_reason"] == "stop"
    return int(payload["completion_tokens"])


def test_a_reply_cut_off_is_asked_again_with_twice_the_limit(
    stores: Any, simulator: SimulatorServer
) -> None:
    """A limit a little short of the reply: the first reply is cut off, the second call carries
    twice the limit under the same task id, and the document completes."""
    needed = needed_tokens(stores, simulator)
    limit = needed * 3 // 4
    store = stores(limit)
    simulator.reset()

    task, events = analyse(store, simulator)

    assert all(isinstance(e, StageDone) for e in events), events
    assert limits_sent(simulator, task) == [limit, 2 * limit]
    row = store.documents.get(events[0].document_id)
    assert row is not None and (row.state, row.attempts) == (State.COMPLETED, 0)


def test_a_reply_cut_off_twice_is_reviewed_as_truncated(
    stores: Any, simulator: SimulatorServer
) -> None:
    """A tiny limit: two calls (8, then 16 tokens), then SCHEMA_VIOLATION in the review queue
    with a reason that says the reply was truncated."""
    store = stores(8)

    task, events = analyse(store, simulator)

    assert limits_sent(simulator, task) == [8, 16]
    (failed,) = [e for e in events if isinstance(e, StageFailed)]
    assert failed.category == Category.SCHEMA_VIOLATION
    assert failed.error.startswith("truncated: the reply was cut off at the token limit")
    (item,) = store.reviews.items()
    assert item.category == Category.SCHEMA_VIOLATION


def test_an_empty_reply_after_reasoning_is_classified(stores: Any) -> None:
    """A reasoning model whose thought takes the whole limit answers "" (finish_reason=length)
    twice: a truncated SCHEMA_VIOLATION that says the reply is empty, not a crash."""
    with SimulatorServer(SimulatorConfig(openai_rules=True)) as server:
        store = stores(4)
        task, events = analyse(store, server, model="gpt-5-mini")
        assert limits_sent(server, task) == [4, 8]
    (failed,) = [e for e in events if isinstance(e, StageFailed)]
    assert failed.category == Category.SCHEMA_VIOLATION
    assert failed.error.startswith("truncated: the reply is empty")


@pytest.mark.parametrize(
    ("limit", "reserved", "expected"),
    [(100, None, 200), (None, None, 8192), (100, 150, 150), (100, 100, None), (100, 60, None)],
)
def test_the_larger_limit_stays_within_the_budget(
    limit: int | None, reserved: int | None, expected: int | None
) -> None:
    """Twice the limit (the family's default when none is set), cut to what the budget reserved
    for the call; no second call when the limit cannot grow."""
    larger = larger_limit("sim-analyst-1", ModelSettings(max_output_tokens=limit), reserved)
    assert (larger.max_output_tokens if larger else None) == expected


def test_a_fenced_reply_is_unwrapped_and_the_metadata_says_so(
    stores: Any, simulator: SimulatorServer
) -> None:
    """A stored reply whose JSON sits in a code fence completes the document; the llm_analysis
    metadata and the schema check's message record the unwrapping."""
    store = stores(None)
    task, _ = analyse(store, simulator)
    payload = store.checkpoints.get(task)
    assert payload is not None
    fenced = stores(None)
    doc = parse_document(TEXT.encode("utf-8"), "inbox/doc.txt")
    fenced.documents.register(doc)
    fenced.checkpoints.put(
        task,
        doc.document_id,
        "analyse",
        {**payload, "content": f"```json\n{payload['content']}\n```"},
    )

    _, events = analyse(fenced, simulator)

    assert all(isinstance(e, StageDone) for e in events), events
    (llm,) = [e for e in events if e.stage == "llm_analysis"]
    assert (
        llm.metadata["reply_unwrapped"] == "the JSON object was taken out of a code fence around it"
    )
    schema = next(c for c in llm.checks if c.name == "schema")
    assert "taken out of a code fence" in schema.message


LONG = "\n\n".join(sample_text(i) for i in range(6))


def analyse_long(store: Store, server: SimulatorServer) -> tuple[str, list]:
    doc = parse_document(LONG.encode("utf-8"), "inbox/long.txt")
    store.documents.register(doc)
    fake = FakeTime()
    client = LLMClient(
        base_url=server.base_url, api_key=TEST_API_KEY, model=TEST_MODEL, sleep=fake.sleep
    )
    analyser = Analyser(store, client, store.results, log=RecordingLog(), run_id="run-1")
    ((_, events),) = list(run_batch(analyser, [doc.document_id]))
    return analyser.task_for(doc.document_id), events


def test_a_document_too_long_for_the_context_is_cut_into_sections(tmp_path: Path) -> None:
    """400 context_length_exceeded for the whole document: an analysis with sections cuts it in
    halves and completes it from them; without sections it stays INPUT_QUALITY_ISSUE."""
    from ai_pipeline.rehearsal.analysis import estimate_tokens

    window = estimate_tokens(LONG) * 3 // 4
    with SimulatorServer(SimulatorConfig(context_tokens=window)) as server:
        store = Store(f"sqlite:///{tmp_path / 'sections.sqlite'}")
        task, events = analyse_long(store, server)
        assert all(isinstance(e, StageDone) for e in events), events
        assert [r["status"] for r in server.stats()["requests"] if r["key"] == task] == [400]
        (row,) = store.documents.rows()
        assert row.state == State.COMPLETED and (row.sections or 0) > 1
        store.db.dispose()

        plain = DOCUMENT_ANALYSIS.model_copy(update={"sections": None})
        store = Store(f"sqlite:///{tmp_path / 'plain.sqlite'}", analysis=plain)
        _, events = analyse_long(store, server)
        (failed,) = [e for e in events if isinstance(e, StageFailed)]
        assert failed.category == Category.INPUT_QUALITY_ISSUE
        assert "maximum context length" in failed.error
        store.db.dispose()
