"""Stale analyses: made under another prompt version or model than now. ``status`` and ``report``
count them, ``backfill --stale`` re-runs exactly them (one new call each, nothing else called),
and the analysis each replaces stays in the results history."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.defs.assets import LLM_ANALYSIS
from ai_pipeline.reporting import build_report
from ai_pipeline.tasks import ANALYSE_STEP, task_id
from ai_pipeline_tests.dagster_procs import DagsterProcess, wait_for
from ai_pipeline_tests.support import (
    TEST_MODEL,
    doc_id,
    latest_materialization,
    launcher,
    make_inbox,
    new_release,
    process_inbox,
    results_store,
    run_cli,
    sample_text,
    task_of,
)

LAUNCH_RUN = """
mutation($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


def _corpus(tmp_path: Path, simulator) -> tuple[Path, list[str], str]:
    """Four documents that complete and one that fails (a 400), analysed once."""
    texts = {f"d{i}.txt": sample_text(400 + i) for i in range(4)}
    texts["bad.txt"] = "Poison request for Vega Instruments in Oslo. " + sample_text(499)
    inbox = make_inbox(tmp_path / "inbox", texts)
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Poison request"}])
    report = process_inbox(inbox)
    assert report["counts"]["by_state"] == {"COMPLETED": 4, "FAILED": 1}
    simulator.set_faults([])
    done = sorted(doc_id(texts[f"d{i}.txt"]) for i in range(4))
    return inbox, done, doc_id(texts["bad.txt"])


def test_a_prompt_version_bump_makes_exactly_the_completed_documents_stale(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inbox, done, bad = _corpus(tmp_path, simulator)
    store = results_store()
    old = {r.document_id: r for r in store.results.get(done)}
    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert code == 0 and plan["selected"] == []

    new_release(monkeypatch, version="v2")

    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert code == 0
    assert sorted(d["document_id"] for d in plan["selected"]) == done
    assert {d["prompt_version"] for d in plan["selected"]} == {"v1"}
    assert plan["backfill_id"] is None
    code, status = run_cli(capsys, "status", "--json")
    assert status["counts"]["stale"] == 4
    assert build_report(store)["stale"] == {f"v1 / {TEST_MODEL}": 4}

    # What the backfill's runs do, here in this process (the prompt changed in this process).
    before = simulator.stats()["total"]
    launcher().execute([d["document_id"] for d in plan["selected"]])

    assert simulator.stats()["total"] == before + 4
    for d in done:
        new_task = task_id(d, ANALYSE_STEP, "v2", TEST_MODEL)
        assert simulator.requests_for(new_task) == 1
        assert simulator.requests_for(task_of(d)) == 1  # the v1 call, made once
        (row,) = store.results.get([d])
        assert (row.task_id, row.prompt_version) == (new_task, "v2")
        (earlier,) = store.results.history(d)
        assert (earlier["task_id"], earlier["summary"]) == (
            old[d].task_id,
            old[d].output["summary"],
        )
        assert earlier["replaced_by_task"] == new_task
        assert store.documents.get(d).task_id == new_task  # type: ignore[union-attr]
    assert store.results.get([bad]) == []
    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert plan["selected"] == []
    # In the UI: each re-analysed document's llm_analysis names the analysis it replaced.
    for d in done:
        metadata = latest_materialization(instance, LLM_ANALYSIS, d).asset_materialization.metadata
        assert metadata["prompt_version"].value == "v2"
        assert metadata["task_id"].value == task_id(d, ANALYSE_STEP, "v2", TEST_MODEL)
        assert metadata["replaces_task"].value == old[d].task_id


def test_the_analysis_assets_code_version_is_the_prompt_version() -> None:
    """Every stage the prompt shapes carries the prompt version as its code version (what the
    UI shows beside each materialization); reading the file does not depend on it."""
    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.assets import ANALYSIS_KEYS

    graph = defs.get_repository_def().asset_graph
    versions = {key.to_user_string(): graph.get(key).code_version for key in ANALYSIS_KEYS}
    version = DOCUMENT_ANALYSIS.version
    assert versions == {
        "document_text": None,
        "llm_analysis": version,
        "validated_analysis": version,
        "analysis_results": version,
        "completion_notice": version,
    }


@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_model_change_is_backfilled_by_the_daemon_one_call_each(
    instance: dg.DagsterInstance,
    simulator,
    daemon: DagsterProcess,
    webserver: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After AI_PIPELINE_MODEL changed, the canary job launched as the UI launches it tries two
    documents and shows its table in the run's metadata; then ``backfill --stale --wait`` under
    a real daemon makes one call for each other completed document under its new task id (the
    canary's two none again), the failed one none."""
    webserver.start()  # it loads while the documents are run
    inbox, done, bad = _corpus(tmp_path, simulator)
    monkeypatch.setenv("AI_PIPELINE_MODEL", "sim-analyst-2")
    daemon.start()
    webserver.wait_ready(locations_loaded=True)
    total = simulator.stats()["total"]

    launched = webserver.graphql(
        LAUNCH_RUN,
        {
            "executionParams": {
                "selector": {
                    "repositoryLocationName": "ai_pipeline",
                    "repositoryName": "__repository__",
                    "jobName": "canary_job",
                },
                "runConfigData": {"ops": {"canary": {"config": {"sample": 2, "seed": 3}}}},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    wait_for(daemon, "the canary run", lambda: instance.get_run_by_id(run_id).is_finished)
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS
    (output,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_OUTPUT)
    metadata = output.dagster_event.event_specific_data.metadata
    assert "| summary | 100% |" in metadata["report"].value
    assert "2 more documents" in metadata["report"].value
    assert metadata["chart"].value.startswith("![agreement per field](data:image/png;base64,")
    assert simulator.stats()["total"] == total + 2

    code, out = run_cli(capsys, "backfill", "--stale", "--wait", "--json")

    assert code == 0, out
    assert out["status"] == "COMPLETED_SUCCESS"
    assert out["canary"]["sample"] == 2
    assert simulator.stats()["total"] == total + 4
    store = results_store()
    for d in done:
        assert simulator.requests_for(task_id(d, ANALYSE_STEP, "v1", "sim-analyst-2")) == 1
        (row,) = store.results.get([d])
        assert row.model == "sim-analyst-2"
        assert [h["model"] for h in store.results.history(d)] == [TEST_MODEL]
    assert simulator.requests_for(task_id(bad, ANALYSE_STEP, "v1", "sim-analyst-2")) == 0
    code, status = run_cli(capsys, "status", "--json")
    assert status["counts"]["stale"] == 0


def test_a_dated_served_model_name_leaves_nothing_stale(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An endpoint that answers under a dated model name (OpenAI: ``gpt-4o-mini`` →
    ``gpt-4o-mini-2024-07-18``) leaves no analysis stale after a normal run — the name is kept
    for display — while a prompt-version bump still makes exactly the completed ones stale."""
    monkeypatch.setattr(simulator.config, "served_model_suffix", "-2024-07-18")
    inbox, done, bad = _corpus(tmp_path, simulator)
    store = results_store()
    assert {r.model for r in store.results.get(done)} == {f"{TEST_MODEL}-2024-07-18"}

    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert code == 0 and plan["selected"] == []
    code, status = run_cli(capsys, "status", "--json")
    assert status["counts"]["stale"] == 0
    assert not any(d["stale"] for d in status["documents"])
    assert build_report(store)["stale"] == {}
    calls = simulator.stats()["total"]
    code, out = run_cli(capsys, "backfill", "--stale", "--json")
    assert code == 0 and out["backfill_id"] is None
    assert simulator.stats()["total"] == calls

    new_release(monkeypatch, version="v2")

    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert sorted(d["document_id"] for d in plan["selected"]) == done
    assert build_report(store)["stale"] == {f"v1 / {TEST_MODEL}-2024-07-18": 4}
    code, status = run_cli(capsys, "status", "--json")
    assert status["counts"]["stale"] == 4
