"""The analyses one service serves, without a server: the default one, names refused with those
served, a task found in its own analysis's database, and a list merged across them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ai_pipeline.documents import parse_document
from ai_pipeline.service.served import Analyses, Served, UnknownAnalysis, load_analyses
from ai_pipeline.settings import Settings
from ai_pipeline_tests.support import sample_text

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
NAMES = ("document_analysis", "contract_review")


def two(default: str | None = None) -> Analyses:
    return load_analyses(
        Settings.load(), {name: Settings.load(analysis=name) for name in NAMES}, default
    )


def submitted(served: Served, tenant: str, text: str) -> str:
    doc = parse_document(text.encode(), "doc.txt")
    task = served.task_id(doc.document_id)
    served.store.tasks.submit(tenant, task, doc, "doc.txt")
    return task


def test_the_default_is_the_first_or_the_one_named(dagster_home: Path) -> None:
    """Without a name the first analysis is the default; a named default is that one; a default
    that is not served is refused naming those that are."""
    analyses = two()
    assert analyses.default.name == "document_analysis"
    assert analyses.named(None) is analyses.default
    assert two("contract_review").default.name == "contract_review"
    with pytest.raises(UnknownAnalysis, match="document_analysis, contract_review"):
        two("ticket_triage")
    with pytest.raises(UnknownAnalysis, match="'ticket_triage'.*document_analysis"):
        two().named("ticket_triage")


def test_a_task_is_found_in_its_own_analysis_and_the_list_merges_them(
    dagster_home: Path,
) -> None:
    """Each analysis's task is in its own database and found from either; another tenant finds
    none; the list of every analysis is newest first across both, paged, with their total."""
    served = two()
    documents, contracts = served.named("document_analysis"), served.named("contract_review")
    tasks = []
    for i, analysis in enumerate((documents, contracts, documents, contracts)):
        tasks.append((analysis.name, submitted(analysis, "acme", sample_text(9000 + i))))
        time.sleep(0.01)  # distinct creation times
    for name, task in tasks:
        found = served.find("acme", task)
        assert found is not None and found[0].name == name and found[1].task_id == task
        assert served.find("globex", task) is None
    assert contracts.store.tasks.by_task_id(tasks[0][1]) is None

    newest_first = [task for _, task in reversed(tasks)]
    page, total = served.listing("acme", None, 2, 1)
    assert total == 4 and [t.task_id for _, t in page] == newest_first[1:3]
    assert [s.name for s, _ in page] == ["document_analysis", "contract_review"]
    page, total = served.listing("acme", None, 10, 0, "contract_review")
    assert total == 2 and [t.task_id for _, t in page] == [tasks[3][1], tasks[1][1]]
    with pytest.raises(UnknownAnalysis):
        served.listing("acme", None, 10, 0, "ticket_triage")
