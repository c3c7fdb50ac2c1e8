"""One service process in front of a code location with two analyses (``two_analyses``): a
submission names its analysis or goes to the first; it lands in that analysis's results database
under the engine's own task id for it, where that analysis's submissions sensor (and no other)
turns it into a run; a task is found whichever analysis it is for; the review page shows and
decides the items of both."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import httpx
import pytest

from ai_pipeline.analyses import CONTRACT_REVIEW, DOCUMENT_ANALYSIS
from ai_pipeline.defs.dagster_private import repository_of
from ai_pipeline.defs.location import load_definitions
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.settings import Settings
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.rows import ReviewStatus
from ai_pipeline.tasks import ANALYSE_STEP, task_id
from ai_pipeline_tests.dagster_procs import DagsterProcess, running
from ai_pipeline_tests.service.client import sse_events, submit, task_state
from ai_pipeline_tests.service.conftest import OPERATOR_KEY, auth, failed_into_review
from ai_pipeline_tests.service.test_api import wait_until
from ai_pipeline_tests.service.two_analyses import LOCATION
from ai_pipeline_tests.support import REPO, sample_text

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
OPERATOR = ("alice", OPERATOR_KEY)


@pytest.fixture
def two_analyses(dagster_home: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    """The code location of two analyses, named by AI_PIPELINE_DEFINITIONS (before the service
    starts: ask for this fixture first)."""
    monkeypatch.setenv("AI_PIPELINE_DEFINITIONS", LOCATION)
    return load_definitions(LOCATION)


def store_of(defs: dg.Definitions, prefix: str | None) -> Store:
    """An analysis's results database as its runs open it: through its own resource."""
    name = f"{prefix}__results_store" if prefix else "results_store"
    return defs.resources[name].get()  # type: ignore[no-any-return]


def engine_task(declaration_name: str, document_id: str) -> str:
    """The task id the engine gives the document under this analysis: its tag, its model."""
    config = Settings.load(analysis=declaration_name)
    tag = config.declaration.tag()
    return task_id(document_id, ANALYSE_STEP, tag, config.analysis_model)


def test_a_submission_names_its_analysis_or_goes_to_the_first(
    two_analyses: dg.Definitions, service: DagsterProcess
) -> None:
    """Named ``contract_review``, a submission lands in the contract review's database under its
    task id there; unnamed, in the document analysis's; an unknown name is a 422 that names the
    analyses served; a GET, the list and ``?analysis=`` find each task with its analysis."""
    url = service.url
    text = sample_text(8101)
    contract = submit(url, "acme", text, "deal.txt", analysis="contract_review")
    plain = submit(url, "acme", text, "deal.txt")
    assert contract.status_code == plain.status_code == 202, (contract.text, plain.text)
    assert contract.json()["analysis"] == "contract_review"
    assert plain.json()["analysis"] == "document_analysis"

    contracts, documents = store_of(two_analyses, "contract_review"), store_of(two_analyses, None)
    assert contracts.analysis.name == "contract_review"
    (in_contracts,) = contracts.tasks.listing("acme", None, 10, 0)[0]
    (in_documents,) = documents.tasks.listing("acme", None, 10, 0)[0]
    # The same tenant and content: the same document, a task of each analysis for it.
    assert in_contracts.document_id == in_documents.document_id
    document_id = in_contracts.document_id
    assert in_contracts.task_id == contract.json()["task_id"]
    assert in_contracts.task_id == engine_task(CONTRACT_REVIEW.name, document_id)
    assert in_documents.task_id == plain.json()["task_id"]
    assert in_documents.task_id == engine_task(DOCUMENT_ANALYSIS.name, document_id)
    assert in_contracts.task_id != in_documents.task_id
    for store in (contracts, documents):
        doc = store.documents.get(document_id)
        assert doc is not None and doc.state == State.PENDING

    # A multipart submission names it in a field of its own.
    other = sample_text(8102).encode()
    multipart = httpx.post(
        f"{url}/api/v1/tasks",
        files={"file": ("other.txt", other)},
        data={"analysis": "contract_review"},
        headers=auth("acme"),
        timeout=30,
    )
    assert multipart.status_code == 202, multipart.text
    assert contracts.tasks.by_task_id(multipart.json()["task_id"]) is not None
    assert documents.tasks.by_task_id(multipart.json()["task_id"]) is None

    unknown = submit(url, "acme", sample_text(8103), analysis="ticket_triage")
    assert unknown.status_code == 422
    detail = unknown.json()["detail"]
    assert "ticket_triage" in detail and "document_analysis, contract_review" in detail
    assert contracts.tasks.listing("acme", None, 10, 0)[1] == 2
    assert documents.tasks.listing("acme", None, 10, 0)[1] == 1

    for answered in (contract, plain, multipart):
        task = task_state(url, "acme", answered.json()["task_id"])
        assert (task["task_id"], task["analysis"], task["status"]) == (
            answered.json()["task_id"],
            answered.json()["analysis"],
            "QUEUED",
        )
    # Another tenant finds neither.
    hidden = httpx.get(contract.json()["poll_url"], headers=auth("globex"), timeout=30)
    assert hidden.status_code == 404

    listed = httpx.get(f"{url}/api/v1/tasks", headers=auth("acme"), timeout=30).json()
    assert listed["total"] == 3
    assert sorted(t["analysis"] for t in listed["tasks"]) == [
        "contract_review",
        "contract_review",
        "document_analysis",
    ]
    # Newest first across both analyses' databases, a page at a time.
    second = httpx.get(
        f"{url}/api/v1/tasks",
        params={"limit": 1, "offset": 1},
        headers=auth("acme"),
        timeout=30,
    ).json()
    assert second["total"] == 3
    assert [t["task_id"] for t in second["tasks"]] == [plain.json()["task_id"]]
    only = httpx.get(
        f"{url}/api/v1/tasks",
        params={"analysis": "contract_review", "limit": 1, "offset": 1},
        headers=auth("acme"),
        timeout=30,
    ).json()
    assert only["total"] == 2
    assert [t["task_id"] for t in only["tasks"]] == [contract.json()["task_id"]]
    served = httpx.get(f"{url}/api/v1/analyses", headers=auth("acme"), timeout=30).json()
    assert served == {
        "analyses": ["document_analysis", "contract_review"],
        "default": "document_analysis",
    }

    # Cancelling acts on the task's own analysis: the other's task of the document stays.
    cancelled = httpx.delete(contract.json()["poll_url"], headers=auth("acme"), timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    assert contracts.documents.get(document_id).state == State.CANCELLED  # type: ignore[union-attr]
    assert documents.documents.get(document_id).state == State.PENDING  # type: ignore[union-attr]
    # Its event stream is the contract review's task's: CANCELLED, and over.
    (status, *_) = sse_events(url, "acme", contract.json()["task_id"])
    assert status["event"] == "status"
    assert (status["data"]["analysis"], status["data"]["status"]) == (
        "contract_review",
        "CANCELLED",
    )


def test_each_analysis_submissions_sensor_runs_its_own_submissions_only(
    two_analyses: dg.Definitions, service: DagsterProcess, dagster_home: Path
) -> None:
    """The contract review's submissions sensor asks its own job to run the task submitted to it,
    the document analysis's sensor its own: neither sees the other's."""
    contract = submit(service.url, "acme", sample_text(8201), analysis="contract_review")
    plain = submit(service.url, "acme", sample_text(8202))
    contract_doc = store_of(two_analyses, "contract_review").tasks.by_task_id(
        contract.json()["task_id"]
    )
    plain_doc = store_of(two_analyses, None).tasks.by_task_id(plain.json()["task_id"])
    assert contract_doc is not None and plain_doc is not None

    with dg.DagsterInstance.get() as instance:
        # Built against this instance: a context variable may still name an instance another
        # test of this worker closed.
        repository = repository_of(two_analyses, instance)
        for sensor, job, document in (
            (
                "contract_review__submissions_sensor",
                "contract_review__analyse_documents_job",
                contract_doc,
            ),
            ("submissions_sensor", "analyse_documents_job", plain_doc),
        ):
            with dg.build_sensor_context(
                instance=instance, resources=dict(two_analyses.resources or {})
            ) as context:
                result = repository.get_sensor_def(sensor)(context)
            assert isinstance(result, dg.SensorResult), (sensor, result)
            assert {r.job_name for r in result.run_requests or []} == {job}
            (added,) = result.dynamic_partitions_requests or []
            assert list(added.partition_keys) == [document.document_id], sensor


def test_the_review_page_shows_and_decides_the_items_of_every_analysis(
    two_analyses: dg.Definitions, service: DagsterProcess
) -> None:
    """An item of each analysis is on the page, each naming its analysis; approving the contract
    review's item approves it in its own database and leaves the document analysis's item of the
    same document open."""
    text = sample_text(8301)
    contracts, documents = store_of(two_analyses, "contract_review"), store_of(two_analyses, None)
    contract = submit(service.url, "acme", text, analysis="contract_review").json()["task_id"]
    plain = submit(service.url, "acme", text).json()["task_id"]
    document_id = failed_into_review("acme", contract, store=contracts)
    assert failed_into_review("acme", plain, store=documents) == document_id

    page = httpx.get(f"{service.url}/review", auth=OPERATOR, timeout=30)
    assert page.status_code == 200, page.text
    assert "<h1>Review queue <small>document_analysis, contract_review</small></h1>" in page.text
    rows = re.findall(
        r'<tr data-document="([^"]+)" data-analysis="([^"]+)">\s*<td>.*?</td>\s*'
        r'<td class="analysis">([^<]+)</td>',
        page.text,
        re.S,
    )
    assert sorted(rows) == [
        (document_id, "contract_review", "contract_review"),
        (document_id, "document_analysis", "document_analysis"),
    ]
    forms = re.findall(
        r'<form method="post" action="([^"]+)">\s*<input type="hidden" name="token" '
        r'value="([^"]+)">',
        page.text,
    )
    approve = {a: t for a, t in forms if "/approve" in a}
    contract_action = f"{service.url}/review/{document_id}/approve?analysis=contract_review"
    assert set(approve) == {contract_action, f"{service.url}/review/{document_id}/approve"}

    # A form of one analysis's item does not decide the other's item of the same document.
    plain_token = approve[f"{service.url}/review/{document_id}/approve"]
    forged = httpx.post(contract_action, data={"token": plain_token}, auth=OPERATOR, timeout=30)
    assert forged.status_code == 403

    decided = httpx.post(
        contract_action, data={"token": approve[contract_action]}, auth=OPERATOR, timeout=30
    )
    assert decided.status_code == 303, decided.text
    assert "analysis=contract_review" in decided.headers["location"]
    contract_item, plain_item = (
        contracts.reviews.get(document_id),
        documents.reviews.get(document_id),
    )
    assert contract_item is not None and contract_item.status == ReviewStatus.APPROVED
    assert contract_item.task_id == contract
    assert plain_item is not None and plain_item.status == ReviewStatus.OPEN
    after = httpx.get(decided.headers["location"], auth=OPERATOR, timeout=30)
    assert f"approved {document_id}" in after.text and f"task {contract}" in after.text


@pytest.fixture
def two_daemon(
    two_analyses: dg.Definitions, tmp_path: Path, dagster_home: Path
) -> Iterator[DagsterProcess]:
    """A ``dagster-daemon`` over the code location of the two analyses, for the test to start
    (after the service: stopped before it; the ``daemon`` fixture the service holds then checks
    that nothing of the instance is left running)."""
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_module:\n"
        f"      module_name: {LOCATION.partition(':')[0]}\n"
        "      attribute: defs\n"
        f"      working_directory: {REPO}\n"
    )
    with dg.DagsterInstance.from_config(str(dagster_home)):
        pass
    process = DagsterProcess.daemon(tmp_path / "two-daemon.log", workspace=workspace)
    with running(process):
        yield process


CONTRACT = (
    "1. Harbor Supplies delivers the goods to Lisbon within 30 days of each order.\n"
    "2. Ana Ribeiro pays each invoice within 14 days of delivery.\n"
)


@pytest.mark.daemon
@pytest.mark.slow
def test_each_analysis_runs_its_submissions_under_the_task_ids_handed_out(
    two_analyses: dg.Definitions,
    service: DagsterProcess,
    two_daemon: DagsterProcess,
    simulator: SimulatorServer,
) -> None:
    """Under a real daemon, a task submitted to the contract review and one to the document
    analysis are each run by their own analysis's job, and each run works under exactly the
    task id the service handed out: the results are each analysis's own."""
    contract = submit(service.url, "acme", CONTRACT, "deal.txt", analysis="contract_review")
    plain = submit(service.url, "acme", sample_text(8401))
    two_daemon.start()
    for answered in (contract, plain):
        task = answered.json()["task_id"]
        done = wait_until(two_daemon, service.url, "acme", task, ["COMPLETED"])
        assert done["analysis"] == done["result"]["analysis"] == answered.json()["analysis"]

    with dg.DagsterInstance.get() as instance:
        for answered, prefix, job in (
            (contract, "contract_review", "contract_review__analyse_documents_job"),
            (plain, None, "analyse_documents_job"),
        ):
            store = store_of(two_analyses, prefix)
            submitted = store.tasks.by_task_id(answered.json()["task_id"])
            assert submitted is not None
            doc = store.documents.get(submitted.document_id)
            assert doc is not None and doc.state == State.COMPLETED
            # The engine's own task id for the document is the one handed out.
            assert doc.task_id == answered.json()["task_id"]
            assert len(store.results.get([doc.document_id])) == 1
            run = instance.get_run_by_id(doc.run_id) if doc.run_id else None
            assert run is not None and run.job_name == job
    assert simulator.requests_for(plain.json()["task_id"]) == 1
