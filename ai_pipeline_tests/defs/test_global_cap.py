"""The global cap on LLM calls in flight (``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY``) across runs in
separate processes, counted where the calls arrive: at the simulator."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from ai_pipeline.defs.resources import LLMResource
from ai_pipeline.states import State
from ai_pipeline_tests.defs.test_one_owner import corpus, finish, start_cli
from ai_pipeline_tests.support import own_simulator, results_store, task_of

CAP = 3
PER_RUN = 8
DOCUMENTS = 24


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_unset_the_client_takes_no_slot(
    dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the setting a run's client has no cap (no statement per call); with it, each
    request holds one of N slots of the results database."""
    slots = results_store().call_slots
    monkeypatch.delenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", raising=False)
    assert LLMResource(api_key="k").client(call_slots=slots).global_cap is None
    monkeypatch.setenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", "5")
    cap = LLMResource(api_key="k").client(call_slots=slots).global_cap
    assert cap is not None and (cap.size, cap.slots) == (5, slots)


@pytest.mark.slow
def test_two_processes_never_have_more_calls_in_flight_than_the_cap(
    dagster_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``ai-pipeline run`` at once, each on 24 documents of its own with 8 calls in flight
    per run, under a global cap of 3: both call the endpoint at the same time, it never has more
    than 3 requests in flight (and has 3), every document completes and every slot is given
    back."""
    monkeypatch.setenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", str(CAP))
    with own_simulator(monkeypatch, latency_ms=400, concurrency=PER_RUN) as llm:
        (inbox_a, ids_a), (inbox_b, ids_b) = (
            corpus(tmp_path / "a", DOCUMENTS, 60_000),
            corpus(tmp_path / "b", DOCUMENTS, 61_000),
        )
        # The first CAP requests, whichever run sends them, are held (and then answered as
        # usual) until both runs have documents under way: from then on both wait for the same
        # slots, however much later the second process started (on a loaded machine the first
        # had done all its documents before the second called once).
        llm.set_faults([{"kind": "timeout", "times": CAP}])
        runs = [start_cli("run", "--inbox", str(inbox), "--json") for inbox in (inbox_a, inbox_b)]
        store = results_store()
        deadline = time.monotonic() + 120
        while not all(
            store.documents.count_by_state(ids).get(State.RUNNING) for ids in (ids_a, ids_b)
        ):
            assert all(run.poll() is None for run in runs), "a run ended before both began"
            assert time.monotonic() < deadline, "the two runs did not both begin in 120 s"
            time.sleep(0.1)
        llm.release_hangs()
        outcomes = [finish(run) for run in runs]
        stats = llm.stats()

    for code, report in outcomes:
        assert code == 0, report["counts"]
        assert report["counts"]["by_state"] == {"COMPLETED": DOCUMENTS}
    assert stats["total"] == 2 * DOCUMENTS
    assert stats["peak_in_flight"] == CAP

    def arrivals(ids: list[str]) -> tuple[datetime, datetime]:
        tasks = {task_of(d) for d in ids}
        at = [datetime.fromisoformat(r["at"]) for r in stats["requests"] if r["key"] in tasks]
        return min(at), max(at)

    first_a, last_a = arrivals(ids_a)
    first_b, last_b = arrivals(ids_b)
    print(f"calls over {(max(last_a, last_b) - min(first_a, first_b)).total_seconds():.1f} s")
    assert first_a < last_b and first_b < last_a, "the two runs called the endpoint at once"
    assert [s.holder for s in results_store().call_slots.of(CAP)] == [None] * CAP
