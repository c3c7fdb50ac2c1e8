"""``ai-pipeline batch-api``: documents sent through the simulator's Batch API, followed to their
checkpoints, listed, shown and cancelled; the ordinary ``run`` afterwards makes no call."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_pipeline.intake import register_files
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.support import make_inbox, results_store, run_cli, sample_text


@pytest.mark.slow
def test_documents_go_through_a_batch_and_the_run_after_makes_no_call(
    dagster_home: Path,
    simulator: SimulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """submit sends one job for the unsettled documents, follow ingests it, list and show report
    it, and ``run`` then completes every document from the checkpoints with no chat call."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(4)})
    store = results_store()
    register_files(store, sorted(inbox.iterdir()), max_bytes=1_000_000)

    code, sent = run_cli(capsys, "batch-api", "submit", "--json")
    assert code == 0 and sent["tasks"] == 4 and len(sent["jobs"]) == 1
    (job,) = sent["jobs"]
    assert job["status"] == "validating" and job["batch_id"].startswith("batch_")

    code, followed = run_cli(capsys, "batch-api", "follow", "--json")
    assert code == 0 and followed["answered"] == 4 and followed["open"] == []
    assert len(followed["documents"]) == 4

    code, listed = run_cli(capsys, "batch-api", "list", "--json")
    assert [j["intent_id"] for j in listed] == [job["intent_id"]]
    assert listed[0]["status"] == "ingested" and listed[0]["lines"] == {"answered": 4}
    code, shown = run_cli(capsys, "batch-api", "show", job["batch_id"], "--json")
    assert {line["state"] for line in shown["line_details"]} == {"answered"}

    code, again = run_cli(capsys, "batch-api", "submit", "--json")
    assert again["tasks"] == 0 and again["already_done"] == 4

    code, _ = run_cli(capsys, "run", "--inbox", str(inbox), "--json")
    assert code == 0
    assert simulator.stats()["total"] == 0, "the run found every answer in a checkpoint"
    assert simulator.calls_to("batches.create") == 1


def test_a_job_is_cancelled_by_its_batch_id(
    dagster_home: Path,
    simulator: SimulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A budget too small sends nothing; cancel cancels the remote batch; follow then releases
    its unanswered tasks."""
    simulator.set_batch_timing(seconds=3600)
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    register_files(results_store(), sorted(inbox.iterdir()), max_bytes=1_000_000)
    _, refused = run_cli(capsys, "batch-api", "submit", "--budget-tokens", "10", "--json")
    assert refused["tasks"] == 0 and refused["over_budget"] == 2
    assert "left" in refused["budget"]
    _, sent = run_cli(capsys, "batch-api", "submit", "--json")
    (job,) = sent["jobs"]

    code, cancelled = run_cli(capsys, "batch-api", "cancel", job["batch_id"], "--json")
    assert code == 0 and cancelled["status"] in ("cancelling", "cancelled")
    _, followed = run_cli(capsys, "batch-api", "follow", "--json")
    assert followed["open"] == [] and followed["answered"] == 0
    _, shown = run_cli(capsys, "batch-api", "show", job["intent_id"], "--json")
    assert shown["status"] == "ingested" and shown["lines"] == {"unanswered": 2}
