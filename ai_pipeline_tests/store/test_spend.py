"""Budgets and prices: reservations never pass a limit, however many reserve at once; settling
moves an estimate into what was spent; the price table and its override."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from ai_pipeline.spend import Meter, Price, Prices, PricesError, estimate_text_tokens
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


def test_cached_prompt_tokens_are_priced_at_the_cached_price_and_reasoning_as_output(
    tmp_path: Path,
) -> None:
    """cost = uncached prompt × prompt price + cached × cached price + completion (reasoning
    included) × completion price; a model without a cached price pays the prompt price."""
    prices = Prices.load()
    # gpt-4o-mini: 0.15 prompt, 0.075 cached, 0.60 completion (USD per million tokens).
    assert prices.cost("gpt-4o-mini", 2_000_000, 1_000_000, cached_tokens=1_500_000) == (
        pytest.approx(0.5 * 0.15 + 1.5 * 0.075 + 1.0 * 0.60)
    )
    # A dated name takes its prefix's cached price too.
    assert prices.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0, 1_000_000) == pytest.approx(0.075)
    assert prices.cost("gpt-4.1", 1_000_000, 0, 1_000_000) == pytest.approx(0.50)
    assert prices.cost("gpt-3.5-turbo", 1_000_000, 0, 1_000_000) == pytest.approx(0.50)
    # Every packaged cached price is a discount, never above the prompt price.
    for name, price in prices.models.items():
        cached = price.cached_prompt_per_million
        assert cached is None or 0 < cached < price.prompt_per_million, name
    # More cached tokens than prompt tokens (a confused server) are capped at the prompt's.
    assert Price(1.0, 2.0, 0.5).cost(100, 0, 400) == pytest.approx(100 * 0.5 / 1e6)

    override = tmp_path / "prices.yaml"
    override.write_text(
        "models:\n  local: {prompt: 1.0, cached_prompt: 0.1, completion: 2.0}\n"
        "  plain: {prompt: 1.0, completion: 2.0}\n"
    )
    prices = Prices.load(str(override))
    assert prices.cost("local", 1_000_000, 0, 600_000) == pytest.approx(0.4 + 0.06)
    assert prices.cost("plain", 1_000_000, 0, 600_000) == pytest.approx(1.0)
    override.write_text("models:\n  broken: {prompt: 1.0, completion: 2.0, cached_prompt: x}\n")
    with pytest.raises(PricesError, match="cached_prompt"):
        Prices.load(str(override))


def test_an_attempts_cached_and_reasoning_tokens_are_recorded_and_summed(store: Store) -> None:
    """The meter records the cached and reasoning tokens an endpoint reported, prices the
    cached ones lower, and the totals add them up; an endpoint that reports neither leaves them
    NULL (counted 0)."""
    meter = Meter(store, Prices.load())
    task = "d1-analyse-v1-x"
    reservation = meter.reserve(task, "o4-mini", [{"content": "short"}])
    usage = meter.settle(
        reservation,
        model="o4-mini-2025-04-16",
        prompt_tokens=2000,
        completion_tokens=700,
        cached_tokens=1536,
        reasoning_tokens=512,
    )
    assert usage.cost_usd == pytest.approx((464 * 1.10 + 1536 * 0.275 + 700 * 4.40) / 1e6)
    plain = meter.settle(
        meter.reserve("d2-analyse-v1-x", "o4-mini", [{"content": "short"}]),
        prompt_tokens=100,
        completion_tokens=10,
    )
    assert plain.cost_usd == pytest.approx((100 * 1.10 + 10 * 4.40) / 1e6)

    rows = store.spend.attempts([task, "d2-analyse-v1-x"])
    assert [(r["cached_tokens"], r["reasoning_tokens"]) for r in rows] == [
        (1536, 512),
        (None, None),
    ]
    assert rows[0]["cost_usd"] == pytest.approx(usage.cost_usd)
    total = store.spend.total()
    assert (total.cached_tokens, total.reasoning_tokens) == (1536, 512)
    assert total.as_dict()["cached_tokens"] == 1536
    assert store.spend.total([document_of(task)]).reasoning_tokens == 512


def test_a_reservation_covers_the_completion_limit_the_request_carries(store: Store) -> None:
    """A reasoning model's ``max_completion_tokens`` counts its reasoning: the reservation is
    for the limit sent, priced at the uncached prompt price, and the budget refuses a call
    whose limit does not fit."""
    store.spend.set_budget("run:r", tokens=5000, usd=None)
    meter = Meter(store, Prices.load(), budget_keys=["run:r"], completion_reserve=4000)
    reservation = meter.reserve(
        "d1-analyse-v1-x", "o4-mini", [{"content": "short"}], completion_tokens=3000
    )
    assert reservation.completion_tokens == 3000
    assert reservation.usd == pytest.approx((reservation.prompt_tokens * 1.10 + 3000 * 4.40) / 1e6)
    # Without a limit given, the meter's reserve: 4,000 more do not fit in what is left.
    with pytest.raises(Exception, match="BUDGET_REACHED"):
        meter.reserve("d2-analyse-v1-x", "o4-mini", [{"content": "short"}])
    state = store.spend.budget("run:r")
    assert state is not None and state.reserved_tokens == reservation.tokens


def test_a_structured_outputs_schema_counts_in_the_prompt_estimate(store: Store) -> None:
    """OpenAI bills a json_schema response format as prompt tokens: the estimate counts it."""
    meter = Meter(store, Prices.load())
    messages = [{"role": "user", "content": "Summarise this contract in JSON."}]
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"summary": {"type": "string"}, "parties": {"type": "array"}},
                "required": ["summary", "parties"],
                "additionalProperties": False,
            },
        },
    }
    plain = meter.reserve("d1-analyse-v1-x", "gpt-4o-mini", messages)
    with_schema = meter.reserve("d1-analyse-v1-x", "gpt-4o-mini", messages, response_format=schema)
    json_mode = meter.reserve(
        "d1-analyse-v1-x", "gpt-4o-mini", messages, response_format={"type": "json_object"}
    )
    assert with_schema.prompt_tokens > plain.prompt_tokens + 20
    assert json_mode.prompt_tokens == plain.prompt_tokens


def test_a_usage_table_from_before_the_billed_details_gains_them(tmp_path: Path) -> None:
    """A results database whose ``llm_usage`` predates the cached and reasoning columns gains
    them on open; its rows read NULL and its totals count them 0."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE llm_usage (id INTEGER PRIMARY KEY, task_id VARCHAR(128) NOT NULL,"
                " document_id VARCHAR(64) NOT NULL, step VARCHAR(32) NOT NULL,"
                " run_id VARCHAR(64), model VARCHAR(128) NOT NULL, outcome VARCHAR(32) NOT NULL,"
                " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
                " cost_usd FLOAT NOT NULL, created_at DATETIME NOT NULL)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO llm_usage VALUES (1, 'd1-analyse-v1-x', 'd1', 'analyse', NULL,"
                " 'gpt-4o-mini', 'answer', 100, 20, 0.001, '2026-01-01')"
            )
        )
    engine.dispose()

    store = Store(url)
    try:
        (row,) = store.spend.attempts(["d1"])
        assert (row["cached_tokens"], row["reasoning_tokens"]) == (None, None)
        total = store.spend.total()
        assert (total.tokens, total.cached_tokens, total.reasoning_tokens) == (120, 0, 0)
        store.spend.settle([], 0, 0.0, _usage("d1-analyse-v2-x", 50))
        assert store.spend.total().attempts == 2
    finally:
        store.db.dispose()


# Counted by OpenAI's published encodings (their files' SHA-256 checked by tiktoken on load).
_OFFLINE_PROBE = """
import json, os
from ai_pipeline.spend import _encoding, count_tokens
sentence = "The quick brown fox jumps over the lazy dog."
print(json.dumps({
    "o200k": count_tokens("gpt-4o-mini", sentence),
    "o200k_ids": _encoding("gpt-4o-mini-2024-07-18").encode("hello world"),
    "reasoning": count_tokens("o4-mini", sentence),
    "cl100k_ids": _encoding("gpt-3.5-turbo").encode("hello world"),
    "cache_dir": os.environ.get("TIKTOKEN_CACHE_DIR"),
}))
"""


def test_token_counts_use_the_shipped_encodings_with_the_network_unreachable(
    tmp_path: Path,
) -> None:
    """In a process whose every HTTP request goes to a closed port, with no tiktoken cache of
    its own (an empty temporary folder), counts are tiktoken's exact ones for o200k_base and
    cl100k_base, not the estimate from characters, and the environment is left as it was."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", "NO_PROXY", "no_proxy")
    }
    closed = "http://127.0.0.1:9"
    env.update(
        HTTP_PROXY=closed,
        HTTPS_PROXY=closed,
        http_proxy=closed,
        https_proxy=closed,
        TMPDIR=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, "-c", _OFFLINE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout)
    assert "estimating tokens from characters" not in out.stderr
    assert counts == {
        "o200k": 10,  # the estimate from characters would say 15
        "o200k_ids": [24912, 2375],
        "reasoning": 10,
        "cl100k_ids": [15339, 1917],
        "cache_dir": None,
    }
    assert list(tmp_path.iterdir()) == []  # nothing downloaded nor cached
