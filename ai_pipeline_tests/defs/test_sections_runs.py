"""Long documents in sections through real Dagster runs against the simulator over HTTP: one
call and one checkpoint per section, a merged analysis, nothing paid again on a rerun, and a
failing section that a reviewer's retry calls again alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.tasks import section_step, task_id
from ai_pipeline_tests.support import (
    TEST_MODEL,
    by_id,
    cli,
    doc_id,
    make_inbox,
    process_inbox,
    results_store,
    task_of,
)

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def contract(clauses: int) -> str:
    return "\n".join(
        f"{i}. Clause {i}: Harbor Supplies delivers order {i} to Lisbon and Ana Ribeiro "
        f"confirms the excellent packaging of shipment {i}."
        for i in range(1, clauses + 1)
    )


def section_task(document_id: str, index: int) -> str:
    return task_id(document_id, section_step(index), DOCUMENT_ANALYSIS.version, TEST_MODEL)


def test_a_long_document_is_analysed_section_by_section_and_merged(
    instance: object, simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = contract(12)
    one_clause = max(len(line) for line in text.splitlines())
    monkeypatch.setenv("AI_PIPELINE_SECTION_CHARS", str(2 * one_clause + 2))
    inbox = make_inbox(tmp_path / "inbox", {"contract.txt": text})
    d = doc_id(text)
    first = process_inbox(inbox)
    assert by_id(first)[d]["state"] == "COMPLETED"
    # Twelve clauses, two to a section: six calls, one per section task, none for the document.
    tasks = [section_task(d, k) for k in range(1, 7)]
    assert [simulator.requests_for(t) for t in tasks] == [1] * 6
    assert simulator.requests_for(section_task(d, 7)) == 0
    assert simulator.requests_for(task_of(d)) == 0
    store = results_store()
    (row,) = store.results.get([d])
    assert row.task_id == task_of(d)
    assert "Harbor Supplies" in row.output["entities"] and len(row.output["summary"]) <= 200
    doc = store.documents.get(d)
    assert doc is not None and doc.sections == 6
    assert store.checkpoints.count_for(d, "analyse.s") == 6
    # A rerun pays for nothing.
    process_inbox(inbox)
    assert simulator.stats()["total"] == 6


def test_a_failing_section_fails_the_document_and_a_retry_calls_it_alone(
    instance: object, simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = contract(8).replace("order 5 to Lisbon", "order 5 to Lisbon. Blurred scan")
    one_clause = max(len(line) for line in text.splitlines())
    monkeypatch.setenv("AI_PIPELINE_SECTION_CHARS", str(one_clause + 1))
    inbox = make_inbox(tmp_path / "inbox", {"contract.txt": text})
    d = doc_id(text)
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Blurred scan"}])
    first = process_inbox(inbox)
    failed = by_id(first)[d]
    assert (failed["state"], failed["category"]) == ("FAILED", "INPUT_QUALITY_ISSUE")
    store = results_store()
    item = store.reviews.get(d)
    assert item is not None and item.task_id == section_task(d, 5)
    assert [simulator.requests_for(section_task(d, k)) for k in range(1, 9)] == [1] * 8
    simulator.set_faults([])
    assert cli("review", "approve", d) == 0
    # Only the failed section is called again; the seven others come from their checkpoints.
    assert [simulator.requests_for(section_task(d, k)) for k in range(1, 9)] == [
        1,
        1,
        1,
        1,
        2,
        1,
        1,
        1,
    ]
    assert store.documents.get(d).state.value == "COMPLETED"  # type: ignore[union-attr]
