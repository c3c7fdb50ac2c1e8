"""The second built-in analysis, contract_review, through the engine: one call per clause and one
report call, each behind its own checkpoint, against the simulator over HTTP."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from ai_pipeline.analyses import CONTRACT_REVIEW
from ai_pipeline.batch import run_batch
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.llm import LLMClient
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.stages import StageDone, StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.tasks import ANALYSE_STEP, REDUCE_STEP, section_step, task_id
from ai_pipeline_tests.support import TEST_API_KEY, TEST_MODEL, FakeTime, RecordingLog

TOPICS = [
    "Term",
    "Services",
    "Fees",
    "Payment",
    "Confidentiality",
    "Liability",
    "Indemnity",
    "Termination",
    "Notices",
    "Assignment",
    "Governing Law",
    "Disputes",
]


def contract() -> str:
    """A 12-clause service agreement between two named parties."""
    lines = [
        "SERVICE AGREEMENT between Northwind Traders Ltd. and Harbor Supplies GmbH.",
        "",
    ]
    for i, topic in enumerate(TOPICS, start=1):
        lines.append(
            f"{i}. {topic}. Harbor Supplies GmbH shall meet the {topic.lower()} obligations "
            f"towards Northwind Traders Ltd. within {i * 5} days of written notice."
        )
        lines.append("")
    return "\n".join(lines)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'contracts.sqlite'}", analysis=CONTRACT_REVIEW)
    yield s
    s.db.dispose()


def analyser(store: Store, simulator: SimulatorServer) -> Analyser:
    fake = FakeTime()
    client = LLMClient(
        base_url=simulator.base_url,
        api_key=TEST_API_KEY,
        model=TEST_MODEL,
        max_concurrency=4,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    return Analyser(store, client, store.results, log=RecordingLog(), run_id="run-c")


def clause_task(document_id: str, index: int) -> str:
    return task_id(document_id, section_step(index), CONTRACT_REVIEW.tag(reduce=False), TEST_MODEL)


def report_task(document_id: str) -> str:
    return task_id(document_id, REDUCE_STEP, CONTRACT_REVIEW.tag(), TEST_MODEL)


def register(store: Store) -> str:
    doc = parse_document(contract().encode(), "inbox/service-agreement.txt")
    store.documents.register(doc)
    return doc.document_id


def test_a_contract_costs_one_call_per_clause_and_one_report(
    store: Store, simulator: SimulatorServer
) -> None:
    """12 clauses: 12 clause calls under their own task ids and 1 report call; the results row
    holds the report and the 12 clause reviews; a rerun makes no call."""
    document_id = register(store)
    events = dict(run_batch(analyser(store, simulator), [document_id]))[document_id]

    assert not [e for e in events if isinstance(e, StageFailed)], events
    assert simulator.stats()["total"] == 13
    for i in range(1, 13):
        assert simulator.requests_for(clause_task(document_id, i)) == 1
    assert simulator.requests_for(report_task(document_id)) == 1

    (row,) = store.results.get([document_id])
    assert set(row.output) == {"overall_risk", "summary", "confidence"}
    assert row.output["overall_risk"] in ("high", "medium", "low")
    assert row.sections is not None and [s["index"] for s in row.sections] == list(range(1, 13))
    assert all(s["output"]["risk_level"] in ("high", "medium", "low") for s in row.sections)
    assert row.task_id == task_id(document_id, ANALYSE_STEP, CONTRACT_REVIEW.tag(), TEST_MODEL)
    doc = store.documents.get(document_id)
    assert doc is not None and doc.state == State.COMPLETED and doc.sections == 12
    checks = next(e for e in events if isinstance(e, StageDone) and e.stage == "llm_analysis")
    assert [c.name for c in checks.checks] == ["refusal", "schema", "confidence"]
    assert checks.metadata["response_format"] == "json_schema"

    dict(run_batch(analyser(store, simulator), [document_id]))
    assert simulator.stats()["total"] == 13


def test_a_contract_interrupted_after_some_clauses_pays_only_for_the_rest(
    store: Store, simulator: SimulatorServer
) -> None:
    """With the first 6 clause calls checkpointed (a run killed there), the rerun makes the 6
    missing clause calls and the report call, nothing more."""
    document_id = register(store)
    dict(run_batch(analyser(store, simulator), [document_id]))
    answered = {i: store.checkpoints.get(clause_task(document_id, i)) for i in range(1, 7)}
    # Another deployment's database with only those six answers: a run killed after them.
    other = Store(
        str(store.url).replace("contracts.sqlite", "killed.sqlite"), analysis=CONTRACT_REVIEW
    )
    try:
        other.documents.register(parse_document(contract().encode(), "inbox/agreement.txt"))
        for i, payload in answered.items():
            assert payload is not None
            other.checkpoints.put(clause_task(document_id, i), document_id, "analyse.s", payload)
        simulator.reset()
        events = dict(run_batch(analyser(other, simulator), [document_id]))[document_id]
        assert not [e for e in events if isinstance(e, StageFailed)], events
        assert simulator.stats()["total"] == 7
        for i in range(1, 7):
            assert simulator.requests_for(clause_task(document_id, i)) == 0
        for i in range(7, 13):
            assert simulator.requests_for(clause_task(document_id, i)) == 1
        assert simulator.requests_for(report_task(document_id)) == 1
        assert (
            store.results.get([document_id])[0].output == other.results.get([document_id])[0].output
        )
    finally:
        other.db.dispose()


def test_a_submitter_follows_a_contract_clause_by_clause(store: Store) -> None:
    """While a run works on a submitted contract, its task says which clause is being reviewed:
    six clauses checkpointed of twelve is "analysing clause 7/12"."""
    from ai_pipeline.service.progress import view
    from ai_pipeline.tasks import SUBMITTED

    doc = parse_document(contract().encode(), "contract.txt")
    doc = dataclasses.replace(doc, source=f"{SUBMITTED}acme/contract.txt")
    task = task_id(doc.document_id, ANALYSE_STEP, CONTRACT_REVIEW.tag(), TEST_MODEL)
    row, _ = store.tasks.submit("acme", task, doc, "contract.txt")
    store.documents.transition(doc.document_id, State.RUNNING, through=State.QUEUED)
    store.documents.set_sections(doc.document_id, 12)
    for i in range(1, 7):
        store.checkpoints.put(clause_task(doc.document_id, i), doc.document_id, "analyse.s", {})
    current = view(store, row)
    assert current.current_step == "analysing clause 7/12"
    assert current.sections_done == 6


def test_a_text_without_numbered_clauses_still_gets_its_report(
    store: Store, simulator: SimulatorServer
) -> None:
    """A text of one section: one clause call and the report call; the row is the report."""
    doc = parse_document(b"The supplier delivers the goods to Acme Ltd by May.", "inbox/note.txt")
    store.documents.register(doc)
    events = dict(run_batch(analyser(store, simulator), [doc.document_id]))[doc.document_id]

    assert not [e for e in events if isinstance(e, StageFailed)], events
    assert simulator.stats()["total"] == 2
    assert simulator.requests_for(clause_task(doc.document_id, 1)) == 1
    assert simulator.requests_for(report_task(doc.document_id)) == 1
    (row,) = store.results.get([doc.document_id])
    assert set(row.output) == {"overall_risk", "summary", "confidence"}


def test_the_command_line_shows_which_clause_a_contract_is_at(store: Store) -> None:
    """The live line of a run over a contract names the clause it is at: six of twelve
    checkpointed is "clause 7/12"."""
    from ai_pipeline.defs.launch import _sections_line

    document_id = register(store)
    store.documents.transition(document_id, State.RUNNING, through=State.QUEUED)
    store.documents.set_sections(document_id, 12)
    for i in range(1, 7):
        store.checkpoints.put(clause_task(document_id, i), document_id, "analyse.s", {})
    assert _sections_line(store, [document_id]) == " · clause 7/12"


def test_a_canary_of_another_model_compares_each_clause_field(
    store: Store, simulator: SimulatorServer
) -> None:
    """Reviewed under one model, then tried under another: the canary calls each clause and the
    report once under the new task ids, and compares the report's fields and each clause's
    fields (paired by clause number) with the stored ones."""
    import asyncio

    from ai_pipeline.analyses.contract_review import ClauseReview, ContractReport
    from ai_pipeline.canary import run_canary
    from ai_pipeline.settings import Settings

    document_id = register(store)
    dict(run_batch(analyser(store, simulator), [document_id]))
    before = simulator.stats()["total"]
    settings = Settings.load(
        database_url=str(store.url), analysis=CONTRACT_REVIEW.name, model="sim-analyst-2"
    )
    client = LLMClient(base_url=simulator.base_url, api_key=TEST_API_KEY, model="sim-analyst-2")

    async def canary() -> dict:
        try:
            return await run_canary(store, client, settings, size=5)
        finally:
            await client.aclose()

    report = asyncio.run(canary())

    assert simulator.stats()["total"] == before + 13  # 12 clauses and the report, once each
    assert (report["sample"], report["stale"], report["sample_calls"]) == (1, 1, 1)
    assert set(report["fields"]) == set(ContractReport.model_fields)
    clauses = report["sections"]
    assert (clauses["label"], clauses["compared"], clauses["recut_documents"]) == ("clause", 12, 0)
    assert set(clauses["fields"]) == set(ClauseReview.model_fields)
    # The simulator answers by the text alone: under another model name, every field agrees.
    assert {f["agreement"] for f in clauses["fields"].values()} == {1.0}
    (row,) = store.results.get([document_id])
    assert row.task_id == task_id(document_id, ANALYSE_STEP, CONTRACT_REVIEW.tag(), TEST_MODEL)
