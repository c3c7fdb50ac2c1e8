"""A mistake in a team's ``defs.yaml`` is one line naming the file and the line, and exit 2 from
every command: never a stack trace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ai_pipeline_tests.dg_project import (
    TICKET_MODEL,
    ai_pipeline,
    defs_yaml,
    make_project,
    write_analyses,
)


@pytest.mark.parametrize(
    ("mistake", "key", "says"),
    [
        ({"llm": {"name": "m", "temprature": 0.2}}, "temprature", "llm.temprature: Extra inputs"),
        ({"summary_field": "sumary"}, "summary_field", "Ticket has no field 'sumary'"),
        ({"confidence_field": "summary"}, "confidence_field", "Ticket.summary is not a number"),
        ({"min_confidence": 7}, "min_confidence", "min_confidence: Input should be less than"),
    ],
    ids=["misspelt-llm-key", "no-such-summary-field", "confidence-not-a-number", "threshold"],
)
def test_a_mistake_in_a_defs_yaml_is_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, mistake: dict[str, Any], key: str, says: str
) -> None:
    root = make_project(tmp_path / "team")
    write_analyses(root)
    path = defs_yaml(root, "ticket_triage")
    (path.parent / "models.py").write_text(TICKET_MODEL)
    spec = yaml.safe_load(path.read_text())
    spec["attributes"].update(mistake)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if f"{key}:" in text)

    done = ai_pipeline(root, tmp_path / "home", "status", timeout=120)

    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (error,) = [text for text in done.stderr.splitlines() if text.strip()]
    assert re.match(rf"ai-pipeline: error: {re.escape(str(path))}:{line}: ", error), error
    assert says in error


def test_an_environment_naming_another_model_than_the_declaration_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declaration's model is the one used (task ids, staleness); a command says so when
    AI_PIPELINE_MODEL names another, and goes on."""
    root = make_project(tmp_path / "team")
    write_analyses(root)
    path = defs_yaml(root, "ticket_triage")
    spec = yaml.safe_load(path.read_text())
    spec["attributes"]["llm"] = {"name": "declared-model"}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.setenv("AI_PIPELINE_MODEL", "exported-model")

    done = ai_pipeline(
        root, tmp_path / "home", "status", "--json", "--analysis", "ticket_triage", timeout=120
    )

    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "AI_PIPELINE_MODEL" in line]
    assert said == [
        "ai-pipeline: AI_PIPELINE_MODEL=exported-model is not the model analysis "
        "'ticket_triage' declares (declared-model, its llm.name): declared-model is used"
    ]
