"""The analysis as a component in a team's own ``dg`` project: scaffolded, checked, listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ai_pipeline_tests.dg_project import (
    COMPONENT,
    PACKAGE,
    TICKET_MODEL,
    defs_yaml,
    dg,
    make_project,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A project with two analyses: ticket triage (its own model) and the built-in contract
    review."""
    root = make_project(tmp_path_factory.mktemp("team"))
    home = root / "home"
    for name in ("ticket_triage", "contracts"):
        done = dg(root, home, "scaffold", "defs", COMPONENT, name)
        assert done.returncode == 0, done.stderr
    triage = defs_yaml(root, "ticket_triage")
    (triage.parent / "models.py").write_text(TICKET_MODEL)
    spec = yaml.safe_load(triage.read_text())
    spec["attributes"].update(
        output_model=f"{PACKAGE}.defs.ticket_triage.models:Ticket",
        instructions="Triage the support ticket.",
    )
    triage.write_text(yaml.safe_dump(spec))
    contracts = defs_yaml(root, "contracts")
    contracts.write_text(
        yaml.safe_dump({"type": COMPONENT, "attributes": {"analysis": "contract_review"}})
    )
    return root, home


def test_the_component_is_listed_in_the_environment(project: tuple[Path, Path]) -> None:
    """``dg list components`` names the analysis component (through its entry point)."""
    root, home = project
    listed = dg(root, home, "list", "components", "--json")
    assert listed.returncode == 0, listed.stderr
    assert COMPONENT in [c["key"] for c in json.loads(listed.stdout)["items"]]


def test_two_analyses_check_and_list_side_by_side(project: tuple[Path, Path]) -> None:
    """Both instances load, each with its own assets, checks, jobs, sensors and resources."""
    root, home = project
    checked = dg(root, home, "check", "defs")
    assert checked.returncode == 0, checked.stderr
    listed = dg(root, home, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assets = {a["asset_key"] for a in defs["assets"]}
    checks = {c["key"] for c in defs["asset_checks"]}
    sensors = {s["name"] for s in defs["sensors"]}
    jobs = {j["name"] for j in defs["jobs"]}
    for prefix in ("ticket_triage", "contract_review"):
        assert {f"{prefix}/llm_analysis", f"{prefix}/analysis_results"} <= assets, assets
        assert f"{prefix}/llm_analysis:schema" in checks, checks
        assert {f"{prefix}__inbox_sensor", f"{prefix}__submissions_sensor"} <= sensors
        assert f"{prefix}__analyse_documents_job" in jobs
    # What each declares, each checks: ticket triage its confidence and its grounded quotes.
    assert {
        "ticket_triage/llm_analysis:confidence",
        "ticket_triage/llm_analysis:grounding",
    } <= checks


def failed_check(project: tuple[Path, Path], instance: str, **attributes: str) -> str:
    """What ``dg check defs`` says, failing, with these attributes set in an instance's
    defs.yaml (put back afterwards)."""
    root, home = project
    path = defs_yaml(root, instance)
    good = path.read_text()
    spec = yaml.safe_load(good)
    spec["attributes"].update(attributes)
    path.write_text(yaml.safe_dump(spec))
    try:
        checked = dg(root, home, "check", "defs")
    finally:
        path.write_text(good)
    out = checked.stdout + checked.stderr
    assert checked.returncode != 0, out
    return out


@pytest.mark.parametrize("instance", ["ticket_triage", "contracts"])
def test_a_misspelt_attribute_fails_the_check_naming_its_file(
    project: tuple[Path, Path], instance: str
) -> None:
    """A misspelt attribute in either defs.yaml fails ``dg check defs``, naming that file."""
    out = failed_check(project, instance, confidense_field="confidence")
    assert f"{instance}/defs.yaml" in out and "confidense_field" in out, out


def test_a_declaration_that_cannot_work_names_the_field(project: tuple[Path, Path]) -> None:
    """A confidence field that is not a number is refused when the project loads."""
    out = failed_check(project, "ticket_triage", confidence_field="summary")
    assert "confidence_field: Ticket.summary is not a number" in out, out


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support_desk"


def test_the_example_project_checks(tmp_path: Path) -> None:
    """examples/support_desk, a team's project with its own ticket triage, loads as it stands."""
    checked = dg(EXAMPLE, tmp_path / "home", "check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
