"""``ai-pipeline run`` against an endpoint that does not have the configured model: a real
process in a temporary DAGSTER_HOME, the simulator answering as OpenAI does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.support import REPO, TEST_API_KEY, make_inbox, results_store, sample_text

CONCURRENCY = 4


@pytest.fixture
def openai_like() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(openai_rules=True, models=("gpt-4o-mini",))) as server:
        yield server


def run(inbox: Path, server: SimulatorServer, model: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": TEST_API_KEY,
        "AI_PIPELINE_MODEL": model,
        "AI_PIPELINE_LLM_CONCURRENCY": str(CONCURRENCY),
    }
    return subprocess.run(
        [sys.executable, "-m", "ai_pipeline.cli", "run", "--inbox", str(inbox), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_run_with_a_model_that_does_not_exist_exits_2_and_leaves_the_documents(
    dagster_home: Path, openai_like: SimulatorServer, tmp_path: Path
) -> None:
    """A misspelt AI_PIPELINE_MODEL: at most the concurrency in calls, exit 2 with one line naming
    the model, no document FAILED or in review, no attempt counted; the same command with the
    right model then completes every document."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(8)})

    stopped = run(inbox, openai_like, "gpt-4o-mnii")

    assert stopped.returncode == 2, stopped.stderr[-3000:]
    (line,) = [ln for ln in stopped.stderr.splitlines() if ln.startswith("ai-pipeline: error:")]
    assert "the endpoint has no model 'gpt-4o-mnii' (404 model_not_found)" in line
    assert "check AI_PIPELINE_MODEL" in line
    assert openai_like.stats()["total"] <= CONCURRENCY
    report = json.loads(stopped.stdout)
    assert report["stopped"] and "gpt-4o-mnii" in report["stopped"]
    store = results_store()
    rows = store.documents.rows()
    assert len(rows) == 8
    assert {r.state.value for r in rows} == {"QUEUED"}
    assert {r.attempts for r in rows} == {0}
    assert store.reviews.items() == []
    # Dagster: the run failed with the stop's message and its category in the step's metadata.
    (failure,) = dg.DagsterInstance.get().all_logs(
        report["runs"][0]["run_id"], of_type=dg.DagsterEventType.STEP_FAILURE
    )
    assert failure.dagster_event is not None
    data = failure.dagster_event.step_failure_data.user_failure_data
    assert data is not None and data.metadata["category"].value == "CONFIGURATION"
    assert "gpt-4o-mnii" in (data.description or "")

    openai_like.reset()
    rerun = run(inbox, openai_like, "gpt-4o-mini")

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout)["counts"]["by_state"] == {"COMPLETED": 8}
    assert openai_like.stats()["total"] == 8


def test_every_waiting_command_exits_2_on_a_stopped_run() -> None:
    """The exit code of run and backfill --wait (``exit_code``) and of submit --wait
    (``stopped``) is the usage error naming the stop, whatever the documents' states."""
    from ai_pipeline.cli.common import UsageError, exit_code, stopped

    completed = {"documents": [{"state": "COMPLETED"}], "stopped": None}
    assert exit_code(completed) == 0
    with pytest.raises(UsageError, match="no model 'x'"):
        exit_code({**completed, "stopped": "the endpoint has no model 'x'"})
    with pytest.raises(UsageError, match="no model 'x'"):
        stopped({"failed": 0, "pending": 3, "stopped": "the endpoint has no model 'x'"})
