"""The example project's own analysis, rehearsed offline: the simulator answers its declaration."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.defs.launch import Launcher
from ai_pipeline.defs.location import load_definitions
from ai_pipeline.defs.site import site_named
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.states import State

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_ticket_triage_analyses_the_sample_tickets(
    tmp_path: Path,
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three sample tickets through ticket_triage: one call each, every check passed, one row
    each with the team's fields as columns; a rerun pays nothing."""
    monkeypatch.syspath_prepend(str(EXAMPLES / "support_desk" / "src"))
    defs = load_definitions("support_desk.definitions:defs")
    inbox = tmp_path / "tickets"
    inbox.mkdir()
    for ticket in (EXAMPLES / "inbox").glob("support-ticket-*"):
        shutil.copy(ticket, inbox)
    launcher = Launcher(instance, defs, site=site_named(defs, "ticket_triage"))

    launcher.process_inbox(inbox)
    store = launcher.store
    docs = store.documents.rows()
    assert {d.state for d in docs} == {State.COMPLETED}, [(d.source, d.last_error) for d in docs]
    assert simulator.stats()["total"] == 3
    rows = store.results.get()
    assert len(rows) == 3
    assert all(r.output["queue"] in ("billing", "shipping", "account", "other") for r in rows)
    assert {"queue", "urgent", "reason", "quotes"} <= {c.name for c in store.results.table.columns}

    launcher.process_inbox(inbox)
    assert simulator.stats()["total"] == 3
