"""Two analyses of one project over the same documents, under a real ``dagster-daemon``: each pays
once per document, keeps its own results and checks, and goes stale on its own."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.settings import default_database_url
from ai_pipeline_tests.dagster_procs import DagsterProcess, running, wait_for
from ai_pipeline_tests.dg_project import (
    PACKAGE,
    TICKET_MODEL,
    ai_pipeline,
    completed,
    make_project,
    project_env,
    write_analyses,
    write_workspace,
)
from ai_pipeline_tests.support import make_inbox, sample_text

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.slow,
    pytest.mark.parametrize("backend", ["sqlite"], indirect=True),
]
DOCUMENTS = 10
ANALYSES = ("ticket_triage", "contract_review")


@pytest.fixture
def project(tmp_path: Path, dagster_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_project(tmp_path / "team")
    write_analyses(root)
    inbox = make_inbox(tmp_path / "inbox", {f"t{i}.txt": sample_text(i) for i in range(DOCUMENTS)})
    monkeypatch.setenv("AI_PIPELINE_INBOX", str(inbox))
    monkeypatch.setenv("AI_PIPELINE_SENSOR_INTERVAL", "2")
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "5")
    return root


@pytest.fixture
def team_daemon(project: Path, tmp_path: Path, dagster_home: Path) -> Iterator[DagsterProcess]:
    with dg.DagsterInstance.from_config(str(dagster_home)):
        pass
    env = project_env(project, dagster_home)
    process = DagsterProcess.daemon(
        tmp_path / "daemon.log", env=env, workspace=write_workspace(project)
    )
    with running(process, dagster_home):
        yield process


def status(project: Path, home: Path, analysis: str) -> dict:
    done = ai_pipeline(project, home, "status", "--analysis", analysis, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def calls_by_analysis(simulator: SimulatorServer) -> Counter[str]:
    """The calls the simulator answered, by the analysis their task id names."""
    counts: Counter[str] = Counter()
    for key, n in simulator.stats()["by_key"].items():
        counts[next((a for a in ANALYSES if a in key), "other")] += n
    return counts


def test_two_analyses_pay_once_each_and_go_stale_on_their_own(
    project: Path,
    team_daemon: DagsterProcess,
    dagster_home: Path,
    simulator: SimulatorServer,
) -> None:
    team_daemon.start()

    def settled(analysis: str) -> bool:
        return (
            completed(Path(default_database_url(analysis).removeprefix("sqlite:///"))) == DOCUMENTS
        )

    def answered() -> bool:
        counts = calls_by_analysis(simulator)
        return counts["ticket_triage"] >= DOCUMENTS and counts["contract_review"] >= 2 * DOCUMENTS

    # The calls first, counted in this process; then the states, read in each results database;
    # then what the command line says of them.
    wait_for(team_daemon, "the calls of both analyses", answered)
    for analysis in ANALYSES:
        wait_for(team_daemon, f"{analysis} done", lambda a=analysis: settled(a))
        counts = status(project, dagster_home, analysis)["counts"]
        assert counts["by_state"] == {"COMPLETED": DOCUMENTS}, (analysis, counts)
    first = calls_by_analysis(simulator)
    # One call per ticket; per contract one per clause and one report (no call twice).
    assert first["ticket_triage"] == DOCUMENTS, first
    assert first["contract_review"] >= 2 * DOCUMENTS, first
    assert set(simulator.stats()["by_key"].values()) == {1}
    assert first["other"] == 0, first

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        evaluations = instance.get_event_records(
            dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        )
        checked: dict[str, set[str]] = {a: set() for a in ANALYSES}
        for record in evaluations:
            data = record.event_log_entry.dagster_event.event_specific_data
            checked[data.asset_key.path[0]].add(data.partition)
    assert {a: len(docs) for a, docs in checked.items()} == {a: DOCUMENTS for a in ANALYSES}

    # A rerun of either analysis pays nothing.
    for analysis in ANALYSES:
        inbox = os.environ["AI_PIPELINE_INBOX"]
        rerun = ai_pipeline(
            project, dagster_home, "run", "--inbox", inbox, "--analysis", analysis, "--json"
        )
        assert rerun.returncode == 0, rerun.stderr
    assert calls_by_analysis(simulator) == first

    # A field added to the ticket model: exactly the tickets are stale, and only they are paid.
    models = project / "src" / PACKAGE / "defs" / "ticket_triage" / "models.py"
    models.write_text(
        TICKET_MODEL.replace("    urgent: bool\n", "    urgent: bool\n    language: str\n")
    )
    for analysis, stale in (("ticket_triage", DOCUMENTS), ("contract_review", 0)):
        plan = ai_pipeline(
            project,
            dagster_home,
            "backfill",
            "--stale",
            "--dry-run",
            "--analysis",
            analysis,
            "--json",
        )
        assert plan.returncode == 0, plan.stderr
        assert len(json.loads(plan.stdout)["selected"]) == stale, (analysis, plan.stdout)
    simulator.reset()
    done = ai_pipeline(
        project,
        dagster_home,
        "backfill",
        "--stale",
        "--wait",
        "--analysis",
        "ticket_triage",
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    again = calls_by_analysis(simulator)
    assert again["ticket_triage"] == DOCUMENTS and again["contract_review"] == 0, again
