"""A team's own ``dg`` project, made in a temporary folder as ``create-dagster project`` lays one
out, with this package as its dependency; and ``dg`` run against it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = "team_project"
COMPONENT = "ai_pipeline.component.Analysis"

# The team's own output model for its ticket triage: the test's, not the product's.
TICKET_MODEL = textwrap.dedent(
    """\
    from typing import Literal

    from pydantic import BaseModel, Field


    class Ticket(BaseModel):
        category: Literal["billing", "bug", "account", "other"]
        urgent: bool
        summary: str = Field(max_length=200)
        quotes: list[str] = Field(description="Passages of the ticket, exactly as written.")
        confidence: float = Field(ge=0, le=1)
    """
)


def make_project(root: Path) -> Path:
    """An empty ``dg`` project (``src/`` layout) at ``root``."""
    package = root / "src" / PACKAGE
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [project]
            name = "{PACKAGE}"
            version = "0.1.0"
            requires-python = ">=3.10"
            dependencies = ["ai-pipeline"]

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "{PACKAGE}"
            code_location_name = "{PACKAGE}"
            """
        )
    )
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(
        textwrap.dedent(
            """\
            from pathlib import Path

            import dagster as dg


            @dg.definitions
            def defs() -> dg.Definitions:
                return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
            """
        )
    )
    return root


def project_env(root: Path, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a command in the project: its package importable (as an installed
    project's is), the Dagster instance at ``home``."""
    env = dict(os.environ)
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(root / "src"),
        DAGSTER_HOME=str(home),
        AI_PIPELINE_DEFINITIONS=f"{PACKAGE}.definitions:defs",
        **extra,
    )
    env.pop("AI_PIPELINE_ANALYSIS", None)
    return env


def _in_project(
    program: str, root: Path, home: Path, args: tuple[str, ...], timeout: float
) -> subprocess.CompletedProcess[str]:
    """A command of this environment run in the project, as a user runs it there."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(Path(sys.executable).parent / program), *args],
        cwd=root,
        env=project_env(root, home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dg(
    root: Path, home: Path, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``dg ARGS`` in the project (the environment's own Python: no virtualenv of its own)."""
    return _in_project("dg", root, home, args, timeout)


def defs_yaml(root: Path, name: str) -> Path:
    return root / "src" / PACKAGE / "defs" / name / "defs.yaml"


def write_analyses(root: Path) -> None:
    """Two analyses in the project: the team's ticket triage and the built-in contract review."""
    import yaml

    triage = root / "src" / PACKAGE / "defs" / "ticket_triage"
    triage.mkdir(parents=True, exist_ok=True)
    (triage / "models.py").write_text(TICKET_MODEL)
    (triage / "defs.yaml").write_text(
        yaml.safe_dump(
            {
                "type": COMPONENT,
                "attributes": {
                    "name": "ticket_triage",
                    "instructions": "Triage the support ticket.",
                    "output_model": f"{PACKAGE}.defs.ticket_triage.models:Ticket",
                    "confidence_field": "confidence",
                    "grounded_fields": ["quotes"],
                },
            }
        )
    )
    contracts = root / "src" / PACKAGE / "defs" / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    (contracts / "defs.yaml").write_text(
        yaml.safe_dump({"type": COMPONENT, "attributes": {"analysis": "contract_review"}})
    )


def write_workspace(root: Path) -> Path:
    """A workspace.yaml that loads the project's code location (as ``dg dev`` does)."""
    path = root / "workspace.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            load_from:
              - python_module:
                  module_name: {PACKAGE}.definitions
                  attribute: defs
                  working_directory: {root / "src"}
                  location_name: {PACKAGE}
            """
        )
    )
    return path


def ai_pipeline(
    root: Path, home: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``ai-pipeline ARGS`` as a user runs it in the project (a process of its own)."""
    return _in_project("ai-pipeline", root, home, args, timeout)


def completed(database: Path) -> int:
    """Documents COMPLETED in an analysis's SQLite results database (0 before it has tables): a
    look that costs a test no process of its own."""
    if not database.exists():
        return 0
    with contextlib.closing(sqlite3.connect(database)) as db:
        try:
            (count,) = db.execute(
                "SELECT count(*) FROM documents WHERE state = 'COMPLETED'"
            ).fetchone()
        except sqlite3.OperationalError:  # its tables not created yet
            return 0
    return int(count)
