"""Review decisions across processes and restarts, and what they tell the submitter: a form drawn
by one ``serve`` process is decided through another, and after a restart; a decision sent twice is
the decision taken; a rejection reaches the submitter's GET and event stream; redirects name an
item, never carry text; cancel and review agree."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import httpx
import pytest

from ai_pipeline.defs.sensors import approvals_sensor
from ai_pipeline.review import REJECTION_EN, REJECTION_ZH, WEB_REVIEWER, approve
from ai_pipeline.states import State
from ai_pipeline.store.rows import ReviewStatus
from ai_pipeline_tests.dagster_procs import DagsterProcess
from ai_pipeline_tests.service.conftest import (
    OPERATOR_KEY,
    auth,
    failed_into_review,
    serving,
    submit_text,
)
from ai_pipeline_tests.service.test_api import read_stream, sse_events
from ai_pipeline_tests.support import results_store, sample_text

SQLITE = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
OPERATOR = ("alice", OPERATOR_KEY)


def review_forms(url: str) -> dict[str, dict[str, str]]:
    """The open items of the review page: document id → {"approve": action, "reject": action,
    "token": token}, as a browser would read them."""
    page = httpx.get(f"{url}/review", auth=OPERATOR, timeout=30)
    assert page.status_code == 200, page.text
    # The queue names the analysis whose documents it holds.
    assert "<h1>Review queue <small>document_analysis</small></h1>" in page.text
    forms: dict[str, dict[str, str]] = {}
    for action, token in re.findall(
        r'<form method="post" action="([^"]+)">\s*<input type="hidden" name="token" '
        r'value="([^"]+)">',
        page.text,
    ):
        document_id, verb = action.rsplit("/", 2)[-2:]
        forms.setdefault(document_id, {"token": token})[verb] = action
    return forms


def post(url: str, action: str, **fields: str) -> httpx.Response:
    """A form sent to ``url`` (another process, perhaps) as the page's ``action`` says."""
    path = action.split("/review/", 1)[1]
    return httpx.post(f"{url}/review/{path}", data=fields, auth=OPERATOR, timeout=30)


def test_a_form_drawn_by_one_process_is_decided_through_another_and_after_a_restart(
    tmp_path: Path, dagster_home: Path, tenants_file: Path
) -> None:
    """Two ``serve`` processes on one results database (SQLite, PostgreSQL): an item's Reject
    form drawn by the first is decided through the second, and sending it again (through
    either) answers the same redirect; a page drawn before a restart still approves an item through the restarted
    process, and an Approve sent twice is the one approval."""
    with serving(tmp_path / "a.log") as a, serving(tmp_path / "b.log") as b:
        first = submit_text(a.url, "acme", sample_text(8001))
        rejected = failed_into_review("acme", first)
        forms = review_forms(a.url)
        reject_form = forms[rejected]
        decided = post(b.url, reject_form["reject"], token=reject_form["token"], reason="模糊")
        assert decided.status_code == 303, decided.text
        location = decided.headers["location"]
        assert location == f"{b.url}/review?done=rejected&item={rejected}"
        for again_through in (b.url, a.url):
            again = post(
                again_through, reject_form["reject"], token=reject_form["token"], reason="模糊"
            )
            assert (again.status_code, again.headers.get("location")) == (
                303,
                f"{again_through}/review?done=rejected&item={rejected}",
            )
        store = results_store()
        assert [m.reason for m in store.reviews.messages(rejected)] == ["模糊"]

        second = submit_text(a.url, "acme", sample_text(8002))
        approved = failed_into_review("acme", second)
        drawn = review_forms(b.url)[approved]
        # A forged or foreign token is still refused.
        forged = post(a.url, drawn["approve"], token="9999999999." + "0" * 64)
        assert forged.status_code == 403

    with serving(tmp_path / "a2.log") as restarted:
        decided = post(restarted.url, drawn["approve"], token=drawn["token"])
        assert decided.status_code == 303, decided.text
        assert decided.headers["location"] == (
            f"{restarted.url}/review?done=approved&item={approved}"
        )
        twice = post(restarted.url, drawn["approve"], token=drawn["token"])
        assert (twice.status_code, twice.headers.get("location")) == (
            303,
            decided.headers["location"],
        )
        notice = httpx.get(decided.headers["location"], auth=OPERATOR, timeout=30)
        assert f"approved {approved} (retry): re-submitted under task {second}" in notice.text
    item = results_store().reviews.get(approved)
    assert item is not None and item.status == ReviewStatus.APPROVED


@SQLITE
def test_a_rejection_reaches_the_submitter_through_get_and_the_event_stream(
    service: DagsterProcess,
) -> None:
    """After an operator rejects the item on the review page, the task's GET and its event
    stream carry the standard message (Chinese and English) and say that a person decided; the
    model's error is no longer what the submitter is told."""
    task = submit_text(service.url, "acme", sample_text(8003))
    document_id = failed_into_review("acme", task, error="HTTP 400 from the endpoint")
    before = httpx.get(f"{service.url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30)
    assert before.json()["error"] == "HTTP 400 from the endpoint"
    assert before.json()["review"] is None

    form = review_forms(service.url)[document_id]
    decided = post(service.url, form["reject"], token=form["token"], reason="扫描不清")
    assert decided.status_code == 303, decided.text

    zh, en = REJECTION_ZH.format(reason="扫描不清"), REJECTION_EN.format(reason="扫描不清")
    state = httpx.get(f"{service.url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30)
    body = state.json()
    assert body["status"] == "FAILED"
    assert body["error"] == f"{zh} / {en}"
    review = body["review"]
    assert (review["decision"], review["decided_by"]) == ("rejected", "person")
    assert (review["message"], review["message_en"]) == (zh, en)
    assert zh == "您的材料存在扫描不清问题，请修正后重新提交"

    events = sse_events(service.url, "acme", task)
    assert [e["event"] for e in events] == ["status", "error"]
    assert events[0]["data"]["review"] == review
    final = events[-1]["data"]
    assert final["message"] == f"{zh} / {en}" and final["review"] == review
    listed = httpx.get(f"{service.url}/api/v1/tasks", headers=auth("acme"), timeout=30).json()
    assert listed["tasks"][0]["review"] == review


@SQLITE
def test_redirects_name_the_item_and_notices_come_from_a_fixed_set(
    service: DagsterProcess,
) -> None:
    """A 100 KB reason is refused on the page (nothing recorded, no redirect); a rejection's
    redirect is short and carries no reason; ``done=`` with any other text shows no notice, and
    the notice for a real decision is the page's own sentence."""
    task = submit_text(service.url, "acme", sample_text(8004))
    document_id = failed_into_review("acme", task)
    form = review_forms(service.url)[document_id]
    huge = post(service.url, form["reject"], token=form["token"], reason="x" * 100_000)
    assert huge.status_code == 400 and "location" not in huge.headers
    assert "at most 2,000 characters" in huge.text
    assert results_store().reviews.messages(document_id) == []

    decided = post(service.url, form["reject"], token=form["token"], reason="secret-reason-text")
    location = decided.headers["location"]
    assert "secret-reason-text" not in location and len(location) < 200

    phishing = "Your account is locked: call +1 555 0100"
    page = httpx.get(f"{service.url}/review", params={"done": phishing}, auth=OPERATOR, timeout=30)
    assert page.status_code == 200 and "555 0100" not in page.text
    assert 'role="status"' not in page.text
    faked = httpx.get(
        f"{service.url}/review",
        params={"done": "approved", "item": document_id},
        auth=OPERATOR,
        timeout=30,
    )
    assert 'role="status"' not in faked.text  # it was rejected, not approved
    shown = httpx.get(location, auth=OPERATOR, timeout=30)
    assert f"rejected {document_id}; the submitter was told: " in shown.text
    assert "secret-reason-text" in shown.text  # from the store: the message the submitter got


@SQLITE
def test_cancelling_a_task_closes_its_review_item(
    service: DagsterProcess, instance: dg.DagsterInstance
) -> None:
    """A FAILED task whose item is open, cancelled by its submitter: CANCELLED, the item leaves
    the page, an Approve from the page drawn before is refused. An item approved and then
    cancelled before its run is closed by the approvals sensor, never re-submitted."""
    task = submit_text(service.url, "acme", sample_text(8005))
    document_id = failed_into_review("acme", task)
    form = review_forms(service.url)[document_id]
    cancelled = httpx.delete(f"{service.url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    store = results_store()
    item = store.reviews.get(document_id)
    assert item is not None and item.status == ReviewStatus.CANCELLED
    assert document_id not in review_forms(service.url)
    late = post(service.url, form["approve"], token=form["token"])
    assert late.status_code == 400 and "no open review item" in late.text

    other = submit_text(service.url, "acme", sample_text(8006))
    approved = failed_into_review("acme", other)
    approve(store, approved, decision=None, by=f"{WEB_REVIEWER}alice")
    # Cancelled while a run held it (the run stopped it): the item is still APPROVED.
    store.documents.transition(approved, State.QUEUED)
    store.documents.transition(approved, State.CANCELLED)
    assert store.reviews.get(approved).status == ReviewStatus.APPROVED  # type: ignore[union-attr]
    from ai_pipeline.defs.resources import ResultsStore

    for _ in range(2):
        result = approvals_sensor(
            dg.build_sensor_context(instance=instance, resources={"results_store": ResultsStore()})
        )
        assert isinstance(result, dg.SkipReason), result
    assert store.reviews.get(approved).status == ReviewStatus.CANCELLED  # type: ignore[union-attr]


@SQLITE
@pytest.mark.parametrize("serve_args", [["--heartbeat-seconds", "1"]])
def test_last_event_id_beyond_the_end_is_nothing_new(service: DagsterProcess) -> None:
    """A queued task's stream resumed with a ``Last-Event-ID`` past its events (a stale id, a
    made-up one) sends its status and stays open (heartbeats), with nothing repeated, instead of
    ending at once (which makes a browser reconnect in a loop)."""
    task = submit_text(service.url, "acme", sample_text(8007))
    for stale in ("50", "1000", "99999"):
        events, comments = read_stream(
            service.url,
            "acme",
            task,
            last_event_id=stale,
            enough=lambda events: len(events) >= 2,
            until_comment=True,
        )
        assert [e["event"] for e in events] == ["status"], (stale, events)
        assert comments, stale
