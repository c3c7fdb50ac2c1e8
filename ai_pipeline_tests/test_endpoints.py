"""Requests each model accepts: the table of model families, and a batch for OpenAI's reasoning
models against the simulator refusing exactly what OpenAI refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ai_pipeline.batch import run_batch
from ai_pipeline.documents import parse_document
from ai_pipeline.endpoints import family_of, request_parameters
from ai_pipeline.engine import Analyser
from ai_pipeline.llm import LLMClient
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.spend import Meter, Prices
from ai_pipeline.stages import StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline_tests.support import TEST_API_KEY, FakeTime, RecordingLog, sample_text


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-5-mini", {"max_completion_tokens": 16384}),
        ("o4-mini-2025-04-16", {"max_completion_tokens": 16384}),
        ("openai/gpt-5", {"max_completion_tokens": 16384}),
        ("gpt-5-chat-latest", {"temperature": 0.0, "max_completion_tokens": 4096}),
        ("gpt-4o-mini", {"temperature": 0.0, "max_completion_tokens": 4096}),
        ("SmolLM2-135M-Instruct", {"temperature": 0.0, "max_tokens": 4096}),
    ],
)
def test_each_family_gets_the_parameters_it_accepts(model: str, expected: dict) -> None:
    """No temperature for a reasoning model, the limit under the name each family knows, and
    always a limit."""
    assert request_parameters(model, temperature=0.0, max_output_tokens=None) == expected


def test_overrides_win_over_the_table_and_effort_goes_only_to_reasoning_models() -> None:
    """An analysis's overrides replace the table's choice; reasoning_effort is sent to a model
    that reasons and to one the table does not know, never to gpt-4o."""
    assert request_parameters(
        "my-local-model",
        temperature=0.2,
        max_output_tokens=300,
        limit_parameter="max_completion_tokens",
        send_temperature=False,
    ) == {"max_completion_tokens": 300}
    assert "reasoning_effort" in request_parameters(
        "o3", temperature=0, max_output_tokens=10, reasoning_effort="low"
    )
    assert "reasoning_effort" not in request_parameters(
        "gpt-4o", temperature=0, max_output_tokens=10, reasoning_effort="low"
    )
    assert family_of("gpt-5-nano").name == "openai-reasoning"


@pytest.fixture
def openai_like() -> Iterator[SimulatorServer]:
    """The simulator refusing what OpenAI refuses, serving OpenAI's model names."""
    with SimulatorServer(SimulatorConfig(openai_rules=True)) as server:
        yield server


@pytest.mark.parametrize("budgeted", [False, True])
def test_a_reasoning_model_completes_a_batch_with_and_without_a_budget(
    tmp_path: Path, openai_like: SimulatorServer, budgeted: bool
) -> None:
    """gpt-5-mini at an endpoint that refuses temperature=0 and max_tokens as OpenAI does: 20 of
    20 documents complete, none in review, no request refused."""
    store = Store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    try:
        ids = []
        for i in range(20):
            doc = parse_document(sample_text(900 + i).encode(), f"inbox/{i}.txt")
            store.documents.register(doc)
            ids.append(doc.document_id)
        keys = (
            [store.spend.set_budget("launch:test", tokens=10_000_000, usd=None).key]
            if budgeted
            else []
        )
        fake = FakeTime()
        client = LLMClient(
            base_url=openai_like.base_url,
            api_key=TEST_API_KEY,
            model="gpt-5-mini",
            max_concurrency=4,
            sleep=fake.sleep,
            clock=fake.clock,
            meter=Meter(store, Prices.load(), budget_keys=keys, completion_reserve=2000),
        )
        analyser = Analyser(store, client, store.results, log=RecordingLog(), run_id="run-r")
        events = dict(run_batch(analyser, ids))
        failed = [e for ev in events.values() for e in ev if isinstance(e, StageFailed)]
        assert failed == []
        assert all(store.documents.get(d).state == State.COMPLETED for d in ids)  # type: ignore[union-attr]
        assert store.reviews.items() == []
        assert openai_like.stats()["total"] == 20
    finally:
        store.db.dispose()
