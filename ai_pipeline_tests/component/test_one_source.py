"""The model an analysis declares is the model of every task id: the service's, the run's
checkpoint and the staleness ``status`` reports all read it from the declaration."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml
from fastapi.testclient import TestClient

from ai_pipeline.defs.launch import Launcher
from ai_pipeline.defs.location import load_definitions
from ai_pipeline.defs.site import site_named
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.reporting import status_report
from ai_pipeline.service.app import create_app
from ai_pipeline.service.tenants import Tenant, Tenants
from ai_pipeline.settings import Settings
from ai_pipeline.store import open_store
from ai_pipeline.tasks import ANALYSE_STEP, task_id
from ai_pipeline_tests.dg_project import PACKAGE, defs_yaml, make_project, write_analyses
from ai_pipeline_tests.support import TEST_MODEL, sample_text

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
DECLARED_MODEL = "sim-declared-2"


def test_the_declared_model_names_every_task_id(
    tmp_path: Path,
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set only on the declaration (AI_PIPELINE_MODEL says another), the model is in the task
    id the service hands out, in the one the run checkpoints under, and status finds nothing
    stale."""
    root = make_project(tmp_path / "team")
    write_analyses(root)
    path = defs_yaml(root, "ticket_triage")
    spec = yaml.safe_load(path.read_text())
    spec["attributes"]["llm"] = {"name": DECLARED_MODEL}
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.syspath_prepend(str(root / "src"))
    site = site_named(load_definitions(f"{PACKAGE}.definitions:defs"), "ticket_triage")
    settings = Settings.load(**site.settings_overrides)
    assert settings.model == TEST_MODEL and settings.analysis_model == DECLARED_MODEL

    app = create_app(settings, Tenants(by_key={"key-a": Tenant("acme")}))
    with TestClient(app) as client:
        response = client.post(
            "/api/v1/tasks",
            json={"text": sample_text(1), "name": "t.txt"},
            headers={"Authorization": "Bearer key-a"},
        )
    assert response.status_code == 202, response.text
    handed_out = response.json()["task_id"]
    store = open_store(settings)
    (document_id,) = [d.document_id for d in store.documents.rows()]
    declared = task_id(document_id, ANALYSE_STEP, settings.declaration.tag(), DECLARED_MODEL)
    assert handed_out == declared
    instance.add_dynamic_partitions(site.partitions, [document_id])
    defs = load_definitions(f"{PACKAGE}.definitions:defs")
    (run,) = Launcher(instance, defs, site=site).execute([document_id])
    assert run["success"], run
    assert simulator.requests_for(handed_out) == 1
    assert store.checkpoints.get(handed_out) is not None
    assert status_report(store)["counts"]["stale"] == 0
