"""Budgets and prices: reservations never pass a limit, however many reserve at once; settling
moves an estimate into what was spent; the price table and its override."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ai_pipeline.spend import Meter, Prices, PricesError, estimate_text_tokens
from ai_pipeline.store import Store
from ai_pipeline.store.spend import Usage
from ai_pipeline.tasks import document_of, step_of


def _usage(task: str, tokens: int, cost: float = 0.0) -> Usage:
    return Usage(task, document_of(task), step_of(task), "m", "answer", tokens, 0, cost)


def test_concurrent_reservations_never_pass_the_limit(store: Store, db_url: str) -> None:
    """40 threads, each with its own Store (its own connections), reserve 100 tokens against a
    1,000-token budget at once: exactly 10 get through."""
    store.spend.set_budget("batch:b", tokens=1000, usd=None)
    stores = [Store(db_url) for _ in range(8)]
    start = threading.Barrier(40)
    refused: list[bool] = []

    def reserve(i: int) -> None:
        start.wait()
        refused.append(stores[i % 8].spend.reserve(["batch:b"], 100, 0.0) is not None)

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.db.dispose()
    assert refused.count(False) == 10
    state = store.spend.budget("batch:b")
    assert state is not None and state.reserved_tokens == 1000


def test_a_refused_reservation_reserves_nothing_anywhere(store: Store) -> None:
    store.spend.set_budget("run:r", tokens=10_000, usd=None)
    store.spend.set_budget("batch:b", tokens=None, usd=0.01)
    assert store.spend.reserve(["run:r", "batch:b"], 500, 0.004) is None
    refused = store.spend.reserve(["run:r", "batch:b"], 500, 0.007)
    assert refused is not None and refused.key == "batch:b"
    assert "left" in refused.describe()
    run = store.spend.budget("run:r")
    assert run is not None and run.reserved_tokens == 500  # the second one rolled back

    store.spend.settle(["run:r", "batch:b"], 500, 0.004, _usage("d1-analyse-v1-x", 320, 0.003))
    run, batch = store.spend.budget("run:r"), store.spend.budget("batch:b")
    assert run is not None and (run.reserved_tokens, run.spent_tokens) == (0, 320)
    assert batch is not None and batch.spent_usd == pytest.approx(0.003)
    assert store.spend.total().tokens == 320
    # New limits keep what was spent.
    assert store.spend.set_budget("run:r", tokens=20_000, usd=None).spent_tokens == 320


def test_reanalyses_are_the_answers_after_a_steps_first(store: Store) -> None:
    for task, tokens in [
        ("d1-analyse-v1-x", 100),
        ("d1-analyse-v2-x", 110),  # a new prompt version: a re-analysis
        ("d2-analyse.s001-v1-x", 50),
        ("d2-analyse.s002-v1-x", 60),  # another section: not one
    ]:
        store.spend.settle([], 0, 0.0, _usage(task, tokens))
    assert store.spend.reanalyses().tokens == 110


def test_prices_packaged_prefixed_overridden_and_fallback(tmp_path: Path) -> None:
    prices = Prices.load(per_1k_prompt=0.001, per_1k_completion=0.002)
    assert prices.cost("gpt-4o-mini", 1_000_000, 0) == pytest.approx(0.15)
    # A dated name takes its longest listed prefix (gpt-4o-mini, not gpt-4o).
    assert prices.cost("gpt-4o-mini-2024-07-18", 0, 1_000_000) == pytest.approx(0.60)
    assert prices.cost("local-llama", 1000, 1000) == pytest.approx(0.003)

    override = tmp_path / "prices.yaml"
    override.write_text("models:\n  local-llama: {prompt: 1.0, completion: 2.0}\n")
    prices = Prices.load(str(override))
    assert prices.cost("local-llama", 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert prices.cost("gpt-4o", 1_000_000, 0) == pytest.approx(2.5)

    override.write_text("models:\n  broken: {prompt: cheap}\n")
    with pytest.raises(PricesError, match="broken"):
        Prices.load(str(override))


def test_the_estimate_errs_high_and_a_refused_call_says_why(store: Store) -> None:
    english = "The quarterly report of Northwind Traders shows growth. " * 20
    # English averages about four characters a token: three is the high side.
    assert estimate_text_tokens(english) >= len(english) / 4
    assert estimate_text_tokens("深圳办公室租赁合同") == 9
    store.spend.set_budget("launch:l", tokens=200, usd=None)
    meter = Meter(store, Prices.load(), budget_keys=["launch:l"], completion_reserve=150)
    reservation = meter.reserve("d1-analyse-v1-x", "gpt-4o-mini", [{"content": "short"}])
    assert reservation.tokens > 150
    with pytest.raises(Exception, match="BUDGET_REACHED.*launch:l"):
        meter.reserve("d2-analyse-v1-x", "gpt-4o-mini", [{"content": "short"}])
    meter.settle(reservation, prompt_tokens=20, completion_tokens=30)
    state = store.spend.budget("launch:l")
    assert state is not None and (state.spent_tokens, state.reserved_tokens) == (50, 0)
