"""What the scaffold adds to a team's project: only what is missing, never twice, never over a
line the team wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_pipeline.project_setup import prepare
from ai_pipeline_tests.dg_project import PACKAGE, make_project


def test_a_fresh_project_gets_an_instance_an_env_file_ignores_and_the_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    root = make_project(tmp_path / "p")
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml").read_text().replace('dependencies = ["ai-pipeline"]', "")
    )
    (root / ".gitignore").write_text("__pycache__/")

    written = prepare(root)

    home = (root / ".dagster").resolve()
    assert "run_coordinator:" in (home / "dagster.yaml").read_text()
    assert (root / ".env").read_text().splitlines() == [
        f"DAGSTER_HOME={home}",
        f"AI_PIPELINE_DEFINITIONS={PACKAGE}.definitions:defs",
    ]
    assert (root / ".gitignore").read_text().splitlines() == [
        "__pycache__/",
        ".dagster/",
        ".env",
        ".tmp_dagster_home_*/",
    ]
    assert 'dependencies = ["ai-pipeline"]' in (root / "pyproject.toml").read_text()
    assert len(written) == 4

    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert prepare(root) == []
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_what_the_team_set_stays_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An instance of its own (DAGSTER_HOME in the shell), a .env of its own, a dependency
    pinned: nothing is added over them."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "theirs"))
    root = make_project(tmp_path / "p")
    (root / ".env").write_text("OPENAI_API_KEY=sk-x\nAI_PIPELINE_DEFINITIONS=pkg.defs:defs")
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml")
        .read_text()
        .replace('dependencies = ["ai-pipeline"]', 'dependencies = ["ai_pipeline>=0.1"]')
    )
    pyproject = (root / "pyproject.toml").read_text()

    prepare(root)

    assert not (root / ".dagster").exists()
    assert (
        root / ".env"
    ).read_text() == "OPENAI_API_KEY=sk-x\nAI_PIPELINE_DEFINITIONS=pkg.defs:defs"
    assert (root / "pyproject.toml").read_text() == pyproject
