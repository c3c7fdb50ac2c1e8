"""The review queue page in headless Chromium, under a real uvicorn server and a
real dagster-daemon: a PDF item shows its first page; Approve re-submits it under its task id
(the approvals sensor's run, one more call at the simulator); Reject with a reason records the
standard message and nothing downstream happens."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.review import REJECTION_EN
from ai_pipeline.states import State
from ai_pipeline_tests.browser import chromium_missing, chromium_page
from ai_pipeline_tests.dagster_procs import DagsterProcess, wait_for
from ai_pipeline_tests.service.conftest import OPERATOR_KEY
from ai_pipeline_tests.support import REPO, doc_id, process_inbox, results_store, task_of

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
UI_TIMEOUT_MS = 60_000
PDF = REPO / "examples" / "inbox" / "q3-report-northwind.pdf"
BLURRED = "Blurred scan from Vega Instruments in Oslo. The totals cannot be read at all."


@pytest.mark.ui
@pytest.mark.daemon
@pytest.mark.slow
def test_review_page_thumbnail_approve_and_reject(
    service: DagsterProcess,
    daemon: DagsterProcess,
    simulator: SimulatorServer,
    tmp_path: Path,
) -> None:
    if chromium_missing():
        pytest.skip(chromium_missing())
    from playwright.sync_api import expect

    from ai_pipeline.documents import content_id

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(PDF, inbox / PDF.name)
    (inbox / "blurred.txt").write_text(BLURRED)
    pdf_doc, text_doc = content_id(PDF.read_bytes()), doc_id(BLURRED)
    # The endpoint refuses both inputs (400): INPUT_QUALITY_ISSUE, in front of a person.
    simulator.set_faults(
        [
            {"kind": "status", "status": 400, "match": "Northwind Traders"},
            {"kind": "status", "status": 400, "match": "Blurred scan"},
        ]
    )
    first = process_inbox(inbox)
    assert {d["category"] for d in first["documents"]} == {"INPUT_QUALITY_ISSUE"}
    simulator.set_faults([])
    assert (
        simulator.requests_for(task_of(pdf_doc)) == simulator.requests_for(task_of(text_doc)) == 1
    )

    # The page asks for an operator key.
    assert httpx.get(f"{service.url}/review", timeout=30).status_code == 401
    tenant_key = {"Authorization": "Bearer acme-key-1"}
    assert httpx.get(f"{service.url}/review", headers=tenant_key, timeout=30).status_code == 401
    png = httpx.get(
        f"{service.url}/review/{pdf_doc}/thumbnail.png", auth=("alice", OPERATOR_KEY), timeout=30
    )
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")

    daemon.start()
    shots = tmp_path / "shots"
    shots.mkdir()
    credentials = {"username": "alice", "password": OPERATOR_KEY}
    with chromium_page(shots / "profile", UI_TIMEOUT_MS, http_credentials=credentials) as page:
        page.goto(f"{service.url}/review")
        pdf_row = page.locator(f'tr[data-document="{pdf_doc}"]')
        text_row = page.locator(f'tr[data-document="{text_doc}"]')
        expect(pdf_row.locator("img.thumbnail")).to_be_visible()
        width = pdf_row.locator("img.thumbnail").evaluate("img => img.naturalWidth")
        assert width > 100, width
        expect(text_row.locator("pre.thumbnail")).to_contain_text("Blurred scan")
        expect(pdf_row).to_contain_text("INPUT_QUALITY_ISSUE")
        page.screenshot(path=str(shots / "1-queue.png"), full_page=True)

        text_row.get_by_label(f"Reason for {text_doc}").fill("文件损坏")
        text_row.get_by_role("button", name="Reject").click()
        expect(page.get_by_role("status")).to_contain_text(f"rejected {text_doc}")
        pdf_row = page.locator(f'tr[data-document="{pdf_doc}"]')
        pdf_row.get_by_role("button", name="Approve").click()
        expect(page.get_by_role("status")).to_contain_text(f"approved {pdf_doc}")
        expect(page.locator("tr[data-document]")).to_have_count(0)
        page.screenshot(path=str(shots / "2-decided.png"), full_page=True)

    store = results_store()
    wait_for(
        daemon,
        "the approved PDF re-submitted and completed",
        lambda: store.documents.get(pdf_doc).state == State.COMPLETED,  # type: ignore[union-attr]
        timeout=120,
    )
    # Under its task id: one more call for that task, and nothing for the rejected one.
    assert simulator.requests_for(task_of(pdf_doc)) == 2
    assert [r.document_id for r in store.results.get([pdf_doc, text_doc])] == [pdf_doc]
    (message,) = store.reviews.messages(text_doc)
    assert message.message_en == REJECTION_EN.format(reason="文件损坏")
    rejected = store.documents.get(text_doc)
    assert rejected is not None and rejected.rejected_by_reviewer
    time.sleep(12)  # two more sensor intervals: still nothing for the rejected document
    assert simulator.requests_for(task_of(text_doc)) == 1
    assert store.documents.get(text_doc).state != State.COMPLETED  # type: ignore[union-attr]


@pytest.mark.daemon
@pytest.mark.slow
def test_a_pdf_submitted_over_the_api_shows_its_first_page_in_review(
    service: DagsterProcess, daemon: DagsterProcess, simulator: SimulatorServer
) -> None:
    """A PDF uploaded with POST /api/v1/tasks that the endpoint refuses (400) is in the review
    queue with a thumbnail of its first page, rendered from the bytes as uploaded (no file on
    disk holds them and its id covers the tenant, so it is not their content id)."""
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Northwind Traders"}])
    response = httpx.post(
        f"{service.url}/api/v1/tasks",
        files={"file": (PDF.name, PDF.read_bytes(), "application/pdf")},
        headers={"Authorization": "Bearer acme-key-1"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    task = response.json()["task_id"]
    store = results_store()
    submitted = store.tasks.get("acme", task)
    assert submitted is not None
    document_id = submitted.document_id
    assert store.tasks.original(document_id) == PDF.read_bytes()
    daemon.start()
    wait_for(
        daemon,
        "the refused PDF in front of a person",
        lambda: store.reviews.get(document_id) is not None,
        timeout=120,
    )
    assert simulator.requests_for(task) == 1
    item = store.reviews.get(document_id)
    assert item is not None and item.category.value == "INPUT_QUALITY_ISSUE"
    assert item.snapshot.source == f"api:acme/{PDF.name}"

    operator = ("alice", OPERATOR_KEY)
    png = httpx.get(f"{service.url}/review/{document_id}/thumbnail.png", auth=operator, timeout=30)
    assert png.status_code == 200, png.text
    assert png.headers["content-type"] == "image/png"
    # Fitted to 240 x 320: this A4 page is as tall as the budget allows.
    width, height = Image.open(io.BytesIO(png.content)).size
    assert width <= 240 and height == 320, (width, height)
    page = httpx.get(f"{service.url}/review", auth=operator, timeout=30)
    assert page.status_code == 200
    assert f'src="{service.url}/review/{document_id}/thumbnail.png"' in page.text
