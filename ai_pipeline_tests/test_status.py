"""``ai-pipeline status``: counts of every document, and a bounded list of those not completed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.cli import main
from ai_pipeline_tests.support import make_inbox, process_inbox, sample_text


def status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["status", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_status_counts_everything_and_lists_only_what_is_not_done(
    instance: dg.DagsterInstance, simulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default the completed documents are counted, not listed; --state and --limit choose
    what is listed and ``omitted`` says how many more match; --all lists every document."""
    files = {f"ok{i}.txt": sample_text(300 + i) for i in range(4)}
    inbox = make_inbox(tmp_path / "inbox", {**files, "empty.txt": ""})
    process_inbox(inbox)

    code, default = status(capsys)
    assert code == 0
    assert default["counts"] == {
        "total": 5,
        "by_state": {"COMPLETED": 4, "FAILED": 1},
        "by_category": {"INPUT_QUALITY_ISSUE": 1},
        "stale": 0,
    }
    assert [Path(d["source"]).name for d in default["documents"]] == ["empty.txt"]
    assert default["omitted"] == 0

    _, completed = status(capsys, "--state", "COMPLETED", "--limit", "3")
    assert len(completed["documents"]) == 3 and completed["omitted"] == 1
    assert {d["state"] for d in completed["documents"]} == {"COMPLETED"}
    assert all(d["summary"] for d in completed["documents"])

    _, everything = status(capsys, "--all")
    assert len(everything["documents"]) == 5 and everything["omitted"] == 0

    capsys.readouterr()
    assert main(["status", "--state", "COMPLETED", "--limit", "1"]) == 0
    assert "(3 more not shown" in capsys.readouterr().out

    assert main(["status", "--state", "DONE"]) == 2
    assert "unknown state 'DONE'" in capsys.readouterr().err
