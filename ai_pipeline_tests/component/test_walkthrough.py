"""docs/own-analysis.md followed as written, in a fresh ``dg`` project against the simulator:
scaffold, ``dg check defs``, a bare ``dg dev`` (no DAGSTER_HOME exported), then the command line
with nothing exported. One instance and one results database are shared by all of them, no
document is paid for twice, none is called stale, and git sees only the team's files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.settings import Settings
from ai_pipeline_tests.dagster_procs import HOST, DagsterProcess, free_port, running, wait_for
from ai_pipeline_tests.dg_project import COMPONENT, PACKAGE, completed, defs_yaml, make_project

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# What a person's shell has that a test's must not pass on: where the walkthrough points them.
NOT_EXPORTED = (
    "DAGSTER_HOME",
    "AI_PIPELINE_DEFINITIONS",
    "AI_PIPELINE_ANALYSIS",
    "AI_PIPELINE_DATABASE_URL",
    "AI_PIPELINE_INBOX",
)


def in_project(root: Path, *argv: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """A command of this environment run in the project as the doc has it: nothing exported."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_EXPORTED + drop}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    env.update(PYTHONPATH=str(root / "src"))
    program = str(Path(sys.executable).parent / argv[0])
    return subprocess.run(
        [program, *argv[1:]], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_documented_path_shares_one_instance_and_pays_once(
    tmp_path: Path, simulator: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NOT_EXPORTED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "0")
    root = make_project(tmp_path / "support-desk")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("__pycache__/\n")  # as create-dagster writes one
    inbox = tmp_path / "tickets"
    inbox.mkdir()
    for ticket in (EXAMPLES / "inbox").glob("support-ticket-*"):
        shutil.copy(ticket, inbox)

    scaffolded = in_project(root, "dg", "scaffold", "defs", COMPONENT, "ticket_triage")
    assert scaffolded.returncode == 0, scaffolded.stderr
    spec = yaml.safe_load(defs_yaml(root, "ticket_triage").read_text())
    assert spec["type"] == COMPONENT
    assert spec["attributes"]["name"] == "ticket_triage"
    assert spec["attributes"]["output_model"] == f"{PACKAGE}.defs.ticket_triage.models:Output"
    # The model is declared: dg dev, the daemon and every command agree on what is current.
    assert spec["attributes"]["llm"] == {"name": Settings.load().model}
    home = root / ".dagster"
    assert (home / "dagster.yaml").is_file()
    env_file = (root / ".env").read_text()
    assert f"DAGSTER_HOME={home}" in env_file
    assert f"AI_PIPELINE_DEFINITIONS={PACKAGE}.definitions:defs" in env_file
    assert '"ai-pipeline"' in (root / "pyproject.toml").read_text()
    spec["attributes"]["inbox"] = str(inbox)
    defs_yaml(root, "ticket_triage").write_text(yaml.safe_dump(spec, sort_keys=False))

    # `dg dev`, bare (it checks every defs.yaml first): the project's .env gives it the instance,
    # and its inbox sensor analyses the tickets.
    port = free_port()
    dev = DagsterProcess(
        "dg dev", ["dg", "dev", "-h", HOST, "-p", str(port)], tmp_path / "dev.log", port=port
    )
    dev.cwd = root
    dev.env = {"PYTHONPATH": str(root / "src")}
    database = home / "ai_pipeline.ticket_triage.sqlite"
    with running(dev, home):
        dev.start()
        wait_for(dev, "3 tickets analysed", lambda: completed(database) == 3, 240)
    assert simulator.stats()["total"] == 3
    assert not list(root.glob(".tmp_dagster_home_*"))

    # The command line, nothing exported (AI_PIPELINE_MODEL neither): the same database, nothing
    # stale, nothing paid again.
    status = in_project(root, "ai-pipeline", "status", "--json", drop=("AI_PIPELINE_MODEL",))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"] == {
        "total": 3,
        "by_state": {"COMPLETED": 3},
        "by_category": {},
        "stale": 0,
    }
    again = in_project(root, "ai-pipeline", "run", "--inbox", str(inbox))
    assert again.returncode == 0, again.stderr
    assert simulator.stats()["total"] == 3
    assert [p.name for p in home.glob("ai_pipeline*.sqlite")] == [database.name]

    untracked = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(p for p in untracked if p != "??") == [
        ".gitignore",
        "pyproject.toml",
        f"src/{PACKAGE}/__init__.py",
        f"src/{PACKAGE}/definitions.py",
        f"src/{PACKAGE}/defs/__init__.py",
        f"src/{PACKAGE}/defs/ticket_triage/defs.yaml",
        f"src/{PACKAGE}/defs/ticket_triage/models.py",
    ]
