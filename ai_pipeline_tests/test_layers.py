"""Dagster's private internals are imported by the accelerator alone (import-linter cannot tell
``dagster._core`` from ``dagster``, so this reads the imports itself)."""

from __future__ import annotations

import ast

from ai_pipeline_tests.support import REPO

PACKAGE = REPO / "ai_pipeline"
# What the command line still needs to create a backfill as the UI does (its docstring says why).
STILL_PRIVATE = {PACKAGE / "defs" / "dagster_private.py"}
PRIVATE_PACKAGES = ("dagster_shared", "dagster_postgres")


def private_imports(source: str) -> list[str]:
    """The modules of Dagster's internals that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found += [
            n for n in names if n.startswith("dagster._") or n.split(".")[0] in PRIVATE_PACKAGES
        ]
    return found


def test_dagster_internals_are_imported_only_by_the_accelerator() -> None:
    """No module outside ``ai_pipeline.accelerator`` imports ``dagster._*`` (nor dagster-shared,
    nor dagster-postgres, whose storages only the accelerator extends), but the one the command
    line still needs; and the check sees such an import where there is one."""
    assert private_imports("from dagster._core.events import DagsterEvent\nimport dagster._x")
    assert not private_imports("import dagster as dg\nfrom dagster import AssetKey")
    offenders = {
        str(path.relative_to(REPO)): imports
        for path in sorted(PACKAGE.rglob("*.py"))
        if (PACKAGE / "accelerator") not in path.parents and path not in STILL_PRIVATE
        for imports in [private_imports(path.read_text(encoding="utf-8"))]
        if imports
    }
    assert offenders == {}
