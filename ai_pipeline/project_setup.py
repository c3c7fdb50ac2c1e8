"""What a team's ``dg`` project needs beside its first analysis, written by the component's
scaffold: a Dagster instance of its own (``.dagster/dagster.yaml``), a ``.env`` that points
``dg dev``, its daemon and every ``ai-pipeline`` command at it, the product as a dependency, and
``.gitignore`` lines for what the product writes.

The rule: add only what is missing; never change a line the team wrote.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

INSTANCE_FOLDER = ".dagster"
ENV_FILE = ".env"
IGNORED = (f"{INSTANCE_FOLDER}/", ENV_FILE, ".tmp_dagster_home_*/")

# Dagster's own storage (SQLite files under DAGSTER_HOME), with what docs/operating.md relies on:
# a run queue, run monitoring and one retry of a run whose worker died.
INSTANCE_YAML = textwrap.dedent(
    """\
    # The project's Dagster instance (DAGSTER_HOME, set in ../.env). Storage: Dagster's own SQLite
    # files in this folder, beside the results databases (ai_pipeline.<analysis>.sqlite).
    run_coordinator:
      module: dagster._core.run_coordinator
      class: QueuedRunCoordinator
      config:
        max_concurrent_runs: 4
        dequeue_interval_seconds: 1
    # A run whose worker died is failed (not left STARTED) and re-executed once.
    run_launcher:
      module: ai_pipeline.defs.run_health
      class: HeartbeatCheckingRunLauncher
    run_monitoring:
      enabled: true
      start_timeout_seconds: 120
      poll_interval_seconds: 30
      max_resume_run_attempts: 0
    run_retries:
      enabled: true
      max_retries: 1
      retry_on_asset_or_op_failure: false
    """
)


def prepare(root: Path) -> list[str]:
    """Adds to the project at ``root`` what is missing of the above; returns what it wrote."""
    written = []
    env = _read_env(root / ENV_FILE)
    wanted = {}
    # A DAGSTER_HOME the team already has (in its shell or its .env) stays theirs.
    if "DAGSTER_HOME" not in env and not os.environ.get("DAGSTER_HOME"):
        home = root.resolve() / INSTANCE_FOLDER
        home.mkdir(exist_ok=True)
        if not (home / "dagster.yaml").exists():
            (home / "dagster.yaml").write_text(INSTANCE_YAML, encoding="utf-8")
            written.append(f"{INSTANCE_FOLDER}/dagster.yaml")
        wanted["DAGSTER_HOME"] = str(home)
    location = _code_location(root)
    if location and "AI_PIPELINE_DEFINITIONS" not in env:
        wanted["AI_PIPELINE_DEFINITIONS"] = location
    if wanted:
        _append(root / ENV_FILE, [f"{k}={v}" for k, v in wanted.items()])
        written.append(f"{ENV_FILE} ({', '.join(wanted)})")
    gitignore = root / ".gitignore"
    present = set(_lines(gitignore))
    missing = [line for line in IGNORED if line not in present and f"/{line}" not in present]
    if missing:
        _append(gitignore, missing)
        written.append(f".gitignore ({', '.join(missing)})")
    if _add_dependency(root / "pyproject.toml"):
        written.append("pyproject.toml (dependency ai-pipeline)")
    return written


def _read_env(path: Path) -> dict[str, str | None]:
    from dotenv import dotenv_values

    return dict(dotenv_values(path)) if path.is_file() else {}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []


def _append(path: Path, lines: list[str]) -> None:
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + "".join(f"{line}\n" for line in lines), encoding="utf-8")


def _pyproject(root: Path) -> dict:
    import tomlkit

    try:
        return tomlkit.parse((root / "pyproject.toml").read_text(encoding="utf-8")).unwrap()
    except (OSError, tomlkit.exceptions.ParseError):
        return {}


def _code_location(root: Path) -> str | None:
    """The project's definitions as ``AI_PIPELINE_DEFINITIONS`` names them (what ``dg`` loads)."""
    project = _pyproject(root).get("tool", {}).get("dg", {}).get("project", {})
    module = project.get("code_location_target_module") or (
        f"{project['root_module']}.definitions" if project.get("root_module") else None
    )
    return f"{module}:defs" if module else None


def _add_dependency(path: Path) -> bool:
    """``ai-pipeline`` added to ``[project] dependencies`` when it is not there, the file's
    formatting kept (tomlkit: ``dg`` edits pyproject files with it, so it is there when the
    scaffold runs)."""
    if not path.is_file():
        return False
    import tomlkit

    document = tomlkit.parse(path.read_text(encoding="utf-8"))
    project = document.get("project")
    if project is None:
        return False
    dependencies = project.setdefault("dependencies", tomlkit.array())
    names = {str(d).split(";")[0].strip().lower().replace("_", "-") for d in dependencies}
    if any(n.startswith("ai-pipeline") for n in names):
        return False
    dependencies.append("ai-pipeline")
    path.write_text(tomlkit.dumps(document), encoding="utf-8")
    return True
