"""Spend end to end: Dagster range runs, the openai SDK over HTTP, the simulator counting the tokens
its replies reported. A budget stops calls before it is exceeded and a later launch with budget
continues; every attempt's usage is recorded, failed and retried ones included."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.defs.assets import LLM_ANALYSIS
from ai_pipeline.defs.dagster_private import repository_of
from ai_pipeline.endpoints import family_of
from ai_pipeline.failures import Category
from ai_pipeline.intake import BATCH_TAG, batch_key
from ai_pipeline.spend import Budget, batch_budget_key
from ai_pipeline.states import State
from ai_pipeline.store.rows import ReviewStatus
from ai_pipeline_tests.dagster_procs import DagsterProcess
from ai_pipeline_tests.support import (
    TEST_MODEL,
    cli,
    doc_id,
    latest_materialization,
    launcher,
    make_inbox,
    own_simulator,
    process_inbox,
    results_store,
    run_cli,
    sample_text,
    task_of,
)


def _used(store, task: str) -> int:
    return sum(a["prompt_tokens"] + a["completion_tokens"] for a in store.spend.attempts([task]))


def test_a_token_budget_stops_calls_before_it_is_exceeded_and_a_later_launch_continues(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AI_PIPELINE_COMPLETION_RESERVE_TOKENS", "300")
    texts = [sample_text(i) for i in range(12)]
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    budget = 2500

    first = process_inbox(inbox, budget=Budget(tokens=budget))

    spent_at_simulator = simulator.stats()["tokens"]
    assert 0 < spent_at_simulator <= budget
    store = results_store()
    docs = {d.document_id: d for d in store.documents.rows(ids)}
    done = [d for d in ids if docs[d].state == State.COMPLETED]
    held = [d for d in ids if docs[d].state != State.COMPLETED]
    assert done and held, "the budget should let some documents through and stop the others"
    for d in held:
        # Not sent, not an attempt, nobody's work: a later launch continues it.
        assert (docs[d].state, docs[d].category, docs[d].attempts) == (
            State.FAILED,
            Category.BUDGET_REACHED,
            0,
        )
        assert "budget" in (docs[d].last_error or "")
        assert simulator.requests_for(task_of(d)) == 0
    assert not [i for i in store.reviews.items(ReviewStatus.OPEN) if i.document_id in held]
    # The command's budget holds exactly what the simulator counted, and says what is left.
    assert first["budget"]["spent_tokens"] == spent_at_simulator
    assert first["budget"]["limit_tokens"] == budget
    assert first["spend"]["prompt_tokens"] + first["spend"]["completion_tokens"] == (
        spent_at_simulator
    )

    second = process_inbox(inbox, budget=Budget(tokens=100_000))

    assert second["counts"]["by_state"] == {"COMPLETED": len(ids)}
    for d in ids:
        assert simulator.requests_for(task_of(d)) == 1
        assert _used(store, task_of(d)) == simulator.tokens_for(task_of(d))
    assert second["budget"]["spent_tokens"] == simulator.stats()["tokens"] - spent_at_simulator


def test_budget_held_documents_wait_for_a_launch_with_budget(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Documents a budget stopped are not retried by the nightly tick nor by ``backfill
    --failed`` (no backfill, no call), nor by ``--category BUDGET_REACHED`` without a budget;
    with ``--budget-tokens`` the backfill's runs share that budget and complete them, one call
    each."""
    from datetime import datetime, timezone

    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.resources import ResultsStore
    from ai_pipeline.spend import BUDGET_TAG

    monkeypatch.setenv("AI_PIPELINE_COMPLETION_RESERVE_TOKENS", "300")
    texts = [sample_text(200 + i) for i in range(8)]
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    process_inbox(inbox, budget=Budget(tokens=1500))
    store = results_store()
    held = [d.document_id for d in store.documents.rows(ids) if d.state != State.COMPLETED]
    assert held and len(held) < len(ids)
    assert {store.documents.get(d).category for d in held} == {Category.BUDGET_REACHED}  # type: ignore[union-attr]
    calls = simulator.stats()["total"]

    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=datetime(2026, 3, 14, 2, 0, tzinfo=timezone.utc),
        resources={"results_store": ResultsStore()},
        repository_def=repository_of(defs, instance),
    )
    tick = repository_of(defs, instance).get_schedule_def("nightly_retry_schedule")(context)
    assert isinstance(tick, dg.RunRequest), tick  # nothing to retry: straight to the report
    code, out = run_cli(capsys, "backfill", "--failed", "--json")
    assert (code, out["selected"], out["backfill_id"]) == (0, [], None)
    assert sorted(d["document_id"] for d in out["skipped"]) == sorted(held)
    assert all("held by a budget" in d["skipped"] for d in out["skipped"])
    code, out = run_cli(capsys, "backfill", "--failed", "--category", "BUDGET_REACHED", "--json")
    assert (out["selected"], out["backfill_id"]) == ([], None)
    assert instance.get_backfills() == []
    assert simulator.stats()["total"] == calls

    code, out = run_cli(
        capsys,
        "backfill",
        "--failed",
        "--category",
        "BUDGET_REACHED",
        "--budget-tokens",
        "100000",
        "--json",
    )

    assert sorted(d["document_id"] for d in out["selected"]) == sorted(held)
    (backfill,) = instance.get_backfills()
    assert backfill.backfill_id == out["backfill_id"]
    key = backfill.tags[BUDGET_TAG]
    assert out["budget"]["key"] == key and out["budget"]["limit_tokens"] == 100_000
    # What the daemon's runs of this backfill do, under its tags, here in this process.
    launcher().execute(held, budget=key)
    assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}
    assert simulator.stats()["total"] == calls + len(held)
    assert all(simulator.requests_for(task_of(d)) == 1 for d in held)
    state = store.spend.budget(key)
    assert state is not None and state.reserved_tokens == 0
    assert state.spent_tokens == sum(simulator.tokens_for(task_of(d)) for d in held)


def test_under_a_budget_no_reply_is_longer_than_its_completion_reserve(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a budget each request carries ``max_tokens`` = the completion reserve, so a reply
    that would be longer is cut there (and fails its schema check) and costs no more than was
    reserved; without a budget the limit is the default of the model's family."""
    monkeypatch.setenv("AI_PIPELINE_COMPLETION_RESERVE_TOKENS", "20")
    free = make_inbox(tmp_path / "free", {"a.txt": sample_text(10)})
    process_inbox(free)
    (request,) = simulator.stats()["requests"]
    assert request["max_tokens"] == family_of(TEST_MODEL).default_limit
    (unlimited,) = results_store().spend.attempts([task_of(doc_id(sample_text(10)))])
    assert unlimited["completion_tokens"] > 20  # the reply the reserve would not cover
    simulator.reset()

    capped = make_inbox(tmp_path / "capped", {"b.txt": sample_text(11)})
    out = process_inbox(capped, budget=Budget(tokens=100_000))

    assert [r["max_tokens"] for r in simulator.stats()["requests"]] == [20]
    (doc,) = out["documents"]
    assert (doc["state"], doc["category"]) == ("FAILED", "SCHEMA_VIOLATION")
    (attempt,) = results_store().spend.attempts([task_of(doc_id(sample_text(11)))])
    assert attempt["outcome"] == "answer"
    assert 0 < attempt["completion_tokens"] <= 20
    assert out["budget"]["spent_tokens"] == simulator.stats()["tokens"]
    assert out["budget"]["reserved_tokens"] == 0


def test_a_reply_without_usage_is_settled_at_its_reservation(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that reports no usage is recorded as ``answer (estimated)`` at its reservation
    (prompt estimate + completion reserve), so the budget keeps binding: of two more such
    documents under a budget of one and a half reservations, one is sent and one is held."""
    monkeypatch.setenv("AI_PIPELINE_COMPLETION_RESERVE_TOKENS", "300")
    simulator.set_faults([{"kind": "no_usage"}])
    first = make_inbox(tmp_path / "first", {"a.txt": sample_text(20)})
    out = process_inbox(first, budget=Budget(tokens=100_000))
    assert out["counts"]["by_state"] == {"COMPLETED": 1}
    store = results_store()
    (attempt,) = store.spend.attempts([task_of(doc_id(sample_text(20)))])
    assert attempt["outcome"] == "answer (estimated)"
    assert attempt["completion_tokens"] == 300 and attempt["prompt_tokens"] > 0
    assert attempt["cost_usd"] > 0
    reservation = attempt["prompt_tokens"] + attempt["completion_tokens"]
    assert out["budget"]["spent_tokens"] == reservation
    assert out["spend"]["prompt_tokens"] + out["spend"]["completion_tokens"] == reservation

    texts = {"b.txt": sample_text(21), "c.txt": sample_text(22)}
    second = process_inbox(
        make_inbox(tmp_path / "second", texts), budget=Budget(tokens=reservation * 3 // 2)
    )

    assert second["counts"]["by_state"] == {"COMPLETED": 1, "FAILED": 1}
    assert second["counts"]["by_category"] == {"BUDGET_REACHED": 1}
    assert sum(simulator.requests_for(task_of(doc_id(t))) for t in texts.values()) == 1
    assert second["budget"]["spent_tokens"] == reservation
    assert store.spend.reanalyses().attempts == 0


def test_every_attempt_is_recorded_with_the_usage_the_simulator_reported(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """A refused answer, a low-confidence answer and two 503s before an answer: the tokens
    recorded per task equal the simulator's; the failed requests are attempts of their own; the
    materialization carries the document's cost over all its attempts."""
    texts = {f"d{i}.txt": sample_text(100 + i) for i in range(4)}
    make_inbox(tmp_path / "inbox", texts)
    refused, low, flaky, fine = (task_of(doc_id(t)) for t in texts.values())
    simulator.set_faults(
        [
            {"kind": "refuse", "match": refused},
            {"kind": "low_confidence", "match": low},
            {"kind": "status", "status": 503, "times": 2, "match": flaky},
        ]
    )

    report = process_inbox(tmp_path / "inbox")

    store = results_store()
    states = {d["document_id"]: d["category"] for d in report["documents"]}
    assert states[doc_id(texts["d0.txt"])] == "MODEL_REFUSAL"
    assert states[doc_id(texts["d1.txt"])] == "LOW_CONFIDENCE"
    for task in (refused, low, flaky, fine):
        assert _used(store, task) == simulator.tokens_for(task) > 0
    assert [a["outcome"] for a in store.spend.attempts([flaky])] == [
        "NETWORK_TIMEOUT",
        "NETWORK_TIMEOUT",
        "answer",
    ]
    assert [a["outcome"] for a in store.spend.attempts([refused])] == ["answer"]
    prices = store.spend.attempts([fine])[0]
    assert prices["cost_usd"] > 0
    failures = store.spend.by_category()
    assert set(failures) == {"MODEL_REFUSAL", "LOW_CONFIDENCE"}
    assert failures["MODEL_REFUSAL"].tokens == simulator.tokens_for(refused)
    event = latest_materialization(instance, LLM_ANALYSIS, doc_id(texts["d3.txt"]))
    metadata = event.asset_materialization.metadata
    assert metadata["cost_usd"].value == pytest.approx(prices["cost_usd"], abs=1e-6)
    assert metadata["llm_attempts"].value == 1
    assert report["spend"]["attempts"] == 6
    # The run's totals: an observation of llm_analysis in the UI.
    (record,) = instance.fetch_observations(LLM_ANALYSIS, limit=10).records
    observed = record.event_log_entry.asset_observation.metadata
    assert observed["run_llm_attempts"].value == 6
    assert observed["run_tokens"].value == sum(
        simulator.tokens_for(t) for t in (refused, low, flaky, fine)
    )


@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_concurrent_runs_of_one_batch_share_its_budget(
    instance: dg.DagsterInstance,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``submit --batch --budget-tokens N`` under a real daemon: the batch's backfill runs four
    runs at once, each reserving against the batch's one budget; the simulator's count stays
    within N, and re-submitting with a larger budget finishes the rest, one call each."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "4")
    monkeypatch.setenv("AI_PIPELINE_COMPLETION_RESERVE_TOKENS", "300")
    texts = [sample_text(300 + i) for i in range(16)]
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    budget = 3000
    with own_simulator(monkeypatch, latency_ms=4000, concurrency=1) as llm:
        daemon.start()
        submit = ["submit", str(inbox), "--batch", "capped", "--wait", "--json"]
        assert cli(*submit, "--budget-tokens", str(budget)) == 1

        assert 0 < llm.stats()["tokens"] <= budget
        runs = instance.get_runs(dg.RunsFilter(tags={BATCH_TAG: batch_key(ids)}))
        assert len(runs) == 4
        records = instance.get_run_records(dg.RunsFilter(run_ids=[r.run_id for r in runs]))
        store = results_store()
        # Runs that made calls, and overlapped: they reserved against the budget at once.
        paying = sorted(
            (r.start_time, r.end_time)
            for r in records
            if store.spend.for_run(r.dagster_run.run_id).attempts
        )
        assert len(paying) >= 2, paying
        assert any(b[0] < a[1] for a, b in zip(paying, paying[1:], strict=False)), paying
        docs = {d.document_id: d for d in store.documents.rows(ids)}
        held = [d for d in ids if docs[d].category == Category.BUDGET_REACHED]
        assert held and len(held) < len(ids)
        state = store.spend.budget(batch_budget_key(batch_key(ids)))
        assert state is not None and state.spent_tokens == llm.stats()["tokens"]
        assert state.reserved_tokens == 0

        assert cli(*submit, "--budget-tokens", str(budget * 10)) == 0
        assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}
        assert all(llm.requests_for(task_of(d)) == 1 for d in ids)
