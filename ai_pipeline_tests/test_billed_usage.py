"""Usage as billed: the cached prompt tokens and the reasoning tokens read from the openai SDK's
usage objects (each absent or None on servers that do not report it), recorded and priced per
attempt against the simulator reporting them as OpenAI does, within budgets that reserve for a
reasoning model's thought."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types import CompletionUsage
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails

from ai_pipeline.batch import run_batch
from ai_pipeline.declaration import ModelSettings
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import LLMClient
from ai_pipeline.llm_access import billed_details
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.openai_rules import reasoning_tokens
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.spend import Budget, Meter, Prices, Reservation
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline_tests.support import TEST_API_KEY, FakeTime, RecordingLog, sample_text


def test_cached_and_reasoning_tokens_are_read_from_the_sdks_usage() -> None:
    """OpenAI's usage block gives both; the SDK parses it into its detail objects."""
    usage = CompletionUsage(
        prompt_tokens=2006,
        completion_tokens=300,
        total_tokens=2306,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=1920, audio_tokens=0),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=128, audio_tokens=0),
    )
    assert billed_details(usage) == (1920, 128)


def test_details_a_server_leaves_out_or_nulls_are_none() -> None:
    """vLLM, Ollama and older servers send no details, or details with nulls: nothing is made up,
    and a reply without usage has none."""
    bare = CompletionUsage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    assert billed_details(bare) == (None, None)
    nulls = CompletionUsage.model_validate(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": None,
            "completion_tokens_details": {"reasoning_tokens": None},
        }
    )
    assert billed_details(nulls) == (None, None)
    cached_only = CompletionUsage.model_validate(
        {
            "prompt_tokens": 1300,
            "completion_tokens": 5,
            "total_tokens": 1305,
            "prompt_tokens_details": {"cached_tokens": 1152},
        }
    )
    assert billed_details(cached_only) == (1152, None)
    assert billed_details(None) == (None, None)


# --- end to end: the simulator reporting usage as OpenAI does ---------------------------------

# A shared opening of more than 1,024 tokens: OpenAI caches it from the second document on.
PREAMBLE = " ".join(sample_text(7000 + k) for k in range(30))


@pytest.fixture
def openai_like() -> Iterator[SimulatorServer]:
    """The simulator in OpenAI rules mode: reasoning models report reasoning tokens, every reply
    its cached prompt tokens."""
    with SimulatorServer(SimulatorConfig(openai_rules=True)) as server:
        yield server


class RecordingMeter(Meter):
    """The run's meter, keeping every reservation it made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reservations: dict[str, Reservation] = {}

    def reserve(self, task_id: str, *args: Any, **kwargs: Any) -> Reservation:
        reservation = super().reserve(task_id, *args, **kwargs)
        self.reservations[task_id] = reservation
        return reservation


def _analyse(
    store: Store,
    server: SimulatorServer,
    texts: list[str],
    *,
    model: str,
    budget: Budget,
    completion_reserve: int,
) -> tuple[list[str], str, RecordingMeter]:
    ids = []
    for i, text in enumerate(texts):
        doc = parse_document(text.encode(), f"inbox/{i}.txt")
        store.documents.register(doc)
        ids.append(doc.document_id)
    key = store.spend.set_budget("launch:billed", tokens=budget.tokens, usd=budget.usd).key
    fake = FakeTime()
    meter = RecordingMeter(
        store, Prices.load(), budget_keys=[key], completion_reserve=completion_reserve
    )
    client = LLMClient(
        base_url=server.base_url,
        api_key=TEST_API_KEY,
        model=model,
        max_concurrency=1,  # one at a time: each later document finds the preamble cached
        sleep=fake.sleep,
        clock=fake.clock,
        meter=meter,
    )
    analyser = Analyser(store, client, store.results, log=RecordingLog(), run_id="run-billed")
    dict(run_batch(analyser, ids))
    return ids, key, meter


def test_a_reasoning_model_with_a_cached_prompt_is_recorded_and_priced_as_billed(
    tmp_path: Path, openai_like: SimulatorServer
) -> None:
    """o4-mini on documents sharing a long opening: every attempt records the reasoning tokens
    the simulator thought and the cached tokens it served; its cost is the price table's for
    exactly that usage; the tokens match the simulator's count and the budget holds them."""
    texts = [f"{PREAMBLE} {sample_text(500 + i)}" for i in range(4)]
    store = Store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    try:
        ids, key, _ = _analyse(
            store,
            openai_like,
            texts,
            model="o4-mini",
            budget=Budget(tokens=1_000_000, usd=1.0),
            completion_reserve=2000,
        )

        assert {store.documents.get(d).state for d in ids} == {State.COMPLETED}  # type: ignore[union-attr]
        prices = Prices.load()
        attempts = store.spend.attempts(ids)
        assert len(attempts) == len(ids) == openai_like.stats()["total"]
        for a in attempts:
            thought = reasoning_tokens(openai_like.text_for(a["task_id"]) or "")
            assert a["reasoning_tokens"] == thought > 0
            assert a["completion_tokens"] > a["reasoning_tokens"]
            assert a["prompt_tokens"] + a["completion_tokens"] == openai_like.tokens_for(
                a["task_id"]
            )
            assert a["cost_usd"] == pytest.approx(
                prices.cost(
                    a["model"], a["prompt_tokens"], a["completion_tokens"], a["cached_tokens"]
                )
            )
        first, *later = attempts
        assert first["cached_tokens"] == 0
        for a in later:
            # Cached from 1,024 tokens on, in steps of 128, never more than the prompt.
            assert 1024 <= a["cached_tokens"] <= a["prompt_tokens"]
            assert a["cached_tokens"] % 128 == 0
            uncached = prices.cost(a["model"], a["prompt_tokens"], a["completion_tokens"])
            assert a["cost_usd"] < uncached
        total = store.spend.total(ids)
        assert total.cached_tokens == sum(a["cached_tokens"] for a in attempts)
        assert total.reasoning_tokens == sum(a["reasoning_tokens"] for a in attempts)
        state = store.spend.budget(key)
        assert state is not None and state.reserved_tokens == 0
        assert state.spent_tokens == openai_like.stats()["tokens"] == total.tokens
        assert state.spent_usd == pytest.approx(total.cost_usd)
    finally:
        store.db.dispose()


@pytest.mark.parametrize(("reserve", "budget_tokens"), [(400, 4000), (120, 2500)])
def test_a_budget_covers_a_reasoning_models_thought_and_is_never_exceeded(
    tmp_path: Path, openai_like: SimulatorServer, reserve: int, budget_tokens: int
) -> None:
    """gpt-5-mini under a token budget that cannot hold every document: each request's
    max_completion_tokens is the completion part reserved for it, the reasoning counts within
    it (with 120 it takes most or all of the limit and the reply is cut), and what the simulator
    counted never passes the budget."""
    texts = [sample_text(600 + i) * 3 for i in range(12)]
    store = Store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    try:
        ids, key, meter = _analyse(
            store,
            openai_like,
            texts,
            model="gpt-5-mini",
            budget=Budget(tokens=budget_tokens),
            completion_reserve=reserve,
        )

        requests = openai_like.stats()["requests"]
        assert requests and all(r["max_tokens"] == reserve for r in requests)
        # What each request asked for at most is what was reserved for its completion.
        assert {r["key"]: r["max_tokens"] for r in requests} == {
            task: reservation.completion_tokens for task, reservation in meter.reservations.items()
        }
        attempts = store.spend.attempts(ids)
        assert len(attempts) == len(requests)
        for a in attempts:
            assert 0 < a["reasoning_tokens"] <= a["completion_tokens"] <= reserve
        if reserve == 120:
            assert any(a["reasoning_tokens"] == a["completion_tokens"] for a in attempts)
        held = [d for d in store.documents.rows(ids) if d.category == Category.BUDGET_REACHED]
        assert held and len(held) < len(ids)
        state = store.spend.budget(key)
        assert state is not None and state.reserved_tokens == 0
        assert 0 < openai_like.stats()["tokens"] == state.spent_tokens <= budget_tokens
    finally:
        store.db.dispose()


@pytest.mark.parametrize(
    ("analysis_limit", "budgeted", "sent"),
    [(60, True, 60), (None, True, 400), (None, False, 16384)],
)
def test_the_reservation_is_the_limit_the_request_carries(
    tmp_path: Path,
    openai_like: SimulatorServer,
    analysis_limit: int | None,
    budgeted: bool,
    sent: int,
) -> None:
    """The completion part reserved is the limit sent: an analysis's smaller limit under a
    budget, else the meter's reserve; without a budget, the model family's default."""
    store = Store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    keys = [store.spend.set_budget("run:r", tokens=1_000_000, usd=None).key] if budgeted else []
    meter = RecordingMeter(store, Prices.load(), budget_keys=keys, completion_reserve=400)
    client = LLMClient(
        base_url=openai_like.base_url, api_key=TEST_API_KEY, model="o4-mini", meter=meter
    )
    messages = [{"role": "user", "content": "Answer in JSON: " + sample_text(1)}]

    async def call() -> None:
        try:
            await client.analyse(
                "d1-analyse-v1-x",
                messages,
                settings=ModelSettings(max_output_tokens=analysis_limit),
                response_format={"type": "json_object"},
            )
        finally:
            await client.aclose()

    try:
        asyncio.run(call())
        (request,) = openai_like.stats()["requests"]
        assert request["max_tokens"] == sent
        assert meter.reservations["d1-analyse-v1-x"].completion_tokens == sent
    finally:
        store.db.dispose()
