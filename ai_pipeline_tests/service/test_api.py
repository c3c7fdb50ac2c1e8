"""The submission API under a real uvicorn server, a real dagster-daemon and the simulator over
HTTP (one submission followed to COMPLETED is ``test_api_followed``): tenants kept apart; one task and one LLM call for 100 concurrent submissions of one
file; cancel; bad uploads refused with nothing recorded."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.states import State
from ai_pipeline.store.tables import tenant_requests
from ai_pipeline_tests.dagster_procs import DagsterProcess, wait_for
from ai_pipeline_tests.service.client import sse_events, submit, task_state
from ai_pipeline_tests.service.conftest import auth, serving
from ai_pipeline_tests.support import own_simulator, results_store, sample_text

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
DONE_SECONDS = 120


def wait_until(
    server: DagsterProcess, url: str, tenant: str, task: str, states: Sequence[str]
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        state = task_state(url, tenant, task)
        return state if state["status"] in states else None

    return wait_for(server, f"task {task} in {states}", reached, timeout=DONE_SECONDS)  # type: ignore[no-any-return]


@contextmanager
def dagster_storage_held(home: Path) -> Iterator[None]:
    """Dagster's run, schedule and event-log index databases in ``home`` held for writing until
    the block ends: a write to any of them waits until then (Dagster's processes wait up to 30 s
    for the lock), while reads go on, as SQLite lets them."""
    files = [
        home / "history" / "runs.db",
        home / "schedules" / "schedules.db",
        home / "storage" / "index.db",
    ]
    held = [sqlite3.connect(file, timeout=30, isolation_level=None) for file in files]
    try:
        for conn in held:
            conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        for conn in held:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()


@pytest.fixture
def one_call_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One LLM call in flight per run, for the service (its estimate) and the runs alike; asked
    for before ``service`` so that the service starts with it."""
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "1")


@pytest.mark.slow
@pytest.mark.daemon
def test_submissions_stay_fast_while_runs_are_queued(
    one_call_at_a_time: None,
    service: DagsterProcess,
    daemon: DagsterProcess,
    instance: dg.DagsterInstance,
    dagster_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With runs waiting in the queue, a submission still answers 202: the service writes the
    results database and nothing of Dagster's, and waits for no run; the estimate counts the queue
    ahead. Every task then completes with one call. The submissions are made while this test
    holds Dagster's databases for writing, so a submission that wrote to Dagster's storage, or
    waited for anything Dagster has to write first (a run's start, a sensor's tick), would not
    answer until the lock was released after it — it times out instead, on a fast machine or a
    loaded one. How fast a submission answers, idle against queued, is
    benchmarks/submit_latency.py's to measure. One run at a time (this instance's queue) and one
    document per run: while the first run works, the other two wait, whatever the speed of the
    machine."""
    config = dagster_home / "dagster.yaml"
    config.write_text(
        config.read_text().replace("max_concurrent_runs: 4", "max_concurrent_runs: 1")
    )
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "1")
    with own_simulator(monkeypatch, latency_ms=2000, concurrency=1) as llm:
        first = [submit(service.url, "acme", sample_text(7100 + i)) for i in range(3)]
        assert [r.status_code for r in first] == [202] * 3
        daemon.start()

        def runs(status: dg.DagsterRunStatus) -> list[dg.DagsterRun]:
            return list(instance.get_runs(filters=dg.RunsFilter(statuses=[status])))

        def one_started_two_queued() -> bool:
            return (
                bool(runs(dg.DagsterRunStatus.STARTED))
                and len(runs(dg.DagsterRunStatus.QUEUED)) == 2
            )

        wait_for(daemon, "a run started, two queued", one_started_two_queued, DONE_SECONDS)
        later = []
        with dagster_storage_held(dagster_home):
            for i in range(2):
                response = submit(service.url, "acme", sample_text(7200 + i))
                assert response.status_code == 202, response.text
                later.append(response.json())
        assert runs(dg.DagsterRunStatus.QUEUED), "the queue emptied while submitting"
        # Submitted behind the queue: the estimate says so.
        assert later[-1]["estimated_seconds"] > first[0].json()["estimated_seconds"]
        for task in [r.json()["task_id"] for r in first] + [b["task_id"] for b in later]:
            wait_until(service, service.url, "acme", task, ["COMPLETED"])
            assert llm.requests_for(task) == 1


@pytest.mark.slow
@pytest.mark.daemon
def test_100_concurrent_submissions_of_one_file_make_one_task_and_one_call(
    service: DagsterProcess, daemon: DagsterProcess, simulator: SimulatorServer
) -> None:
    text = sample_text(7002)

    def one(_: int) -> httpx.Response:
        return httpx.post(
            f"{service.url}/api/v1/tasks",
            files={"file": ("same.txt", text.encode())},
            headers=auth("acme"),
            timeout=60,
        )

    with ThreadPoolExecutor(max_workers=100) as pool:
        responses = list(pool.map(one, range(100)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 99 + [202], codes
    (task,) = {r.json()["task_id"] for r in responses}
    daemon.start()
    wait_until(service, service.url, "acme", task, ["COMPLETED"])
    assert simulator.requests_for(task) == 1
    assert simulator.stats()["total"] == 1
    listed = httpx.get(f"{service.url}/api/v1/tasks", headers=auth("acme"), timeout=30).json()
    assert [t["task_id"] for t in listed["tasks"]] == [task] and listed["total"] == 1


def test_tenants_never_see_each_others_tasks(
    service: DagsterProcess, simulator: SimulatorServer
) -> None:
    """Another tenant's task id answers 404 as an unknown one does (status, events, cancel); its
    list never shows it; the same content from two tenants is two tasks; 401 / 403 for a
    missing, wrong or mismatched key."""
    url = service.url
    text = sample_text(7003)
    mine = submit(url, "acme", text).json()["task_id"]
    theirs = submit(url, "globex", text)
    assert theirs.status_code == 202 and theirs.json()["task_id"] != mine
    unknown = "0" * 20 + "-analyse-v1-00000000"
    for task in (mine, unknown):
        for method, path in (
            ("GET", f"/api/v1/tasks/{task}"),
            ("GET", f"/api/v1/tasks/{task}/events"),
            ("DELETE", f"/api/v1/tasks/{task}"),
        ):
            r = httpx.request(method, url + path, headers=auth("globex"), timeout=30)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json() == {"detail": f"no task {task}"}
    listed = httpx.get(f"{url}/api/v1/tasks", headers=auth("globex"), timeout=30).json()
    assert [t["task_id"] for t in listed["tasks"]] == [theirs.json()["task_id"]]
    # The tenant's second key sees the same tasks.
    second = httpx.get(f"{url}/api/v1/tasks/{mine}", headers=auth("acme", key=1), timeout=30)
    assert second.status_code == 200
    assert httpx.get(f"{url}/api/v1/tasks/{mine}", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-a-key"}
    assert httpx.get(f"{url}/api/v1/tasks", headers=wrong, timeout=30).status_code == 401
    mismatched = auth("acme") | {"X-Tenant-Id": "globex"}
    assert (
        httpx.get(f"{url}/api/v1/tasks/{mine}", headers=mismatched, timeout=30).status_code == 403
    )
    matching = auth("acme") | {"X-Tenant-Id": "acme"}
    assert httpx.get(f"{url}/api/v1/tasks/{mine}", headers=matching, timeout=30).status_code == 200
    assert submit(url, "acme", text, **{"X-Tenant-Id": "globex"}).status_code == 403
    assert simulator.stats()["total"] == 0


def test_bad_uploads_are_refused_with_the_reason_and_nothing_recorded(
    service: DagsterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = service.url

    def upload(name: str, data: bytes) -> httpx.Response:
        return httpx.post(
            f"{url}/api/v1/tasks", files={"file": (name, data)}, headers=auth("acme"), timeout=30
        )

    cases = [
        (upload("empty.txt", b""), 422, "empty.txt: the file is empty"),
        (upload("binary.txt", b"ab\x00cd" * 10), 422, "NUL bytes"),
        (upload("tool.exe", b"MZ..."), 422, "unsupported type"),
        (upload("big.txt", b"a" * (5 * 1024 * 1024 + 1)), 413, "over the size limit"),
        (upload("broken.pdf", b"%PDF-1.4 not really"), 422, "broken.pdf"),
        (
            httpx.post(f"{url}/api/v1/tasks", content=b"x", headers=auth("acme"), timeout=30),
            415,
            "multipart/form-data",
        ),
        (
            httpx.post(
                f"{url}/api/v1/tasks",
                content=b"{not json",
                headers=auth("acme") | {"content-type": "application/json"},
                timeout=30,
            ),
            422,
            "`text`",
        ),
    ]
    for response, code, reason in cases:
        assert response.status_code == code, response.text
        assert reason in response.json()["detail"], response.text
    store = results_store()
    assert store.documents.rows() == []
    listed = httpx.get(f"{url}/api/v1/tasks", headers=auth("acme"), timeout=30).json()
    assert listed["total"] == 0


@pytest.mark.slow
@pytest.mark.daemon
def test_cancel_a_queued_and_a_running_task(
    service: DagsterProcess, daemon: DagsterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued task cancelled is CANCELLED at once and the run that comes for it skips it (0
    calls); a running one is CANCELLED when its call returns (the call in flight is the only
    one, no result is stored); each event stream ends with an ``error``; 409 once ended."""
    with own_simulator(monkeypatch, latency_ms=4000, concurrency=4) as llm:
        queued = submit(service.url, "acme", sample_text(7004)).json()["task_id"]
        running = submit(service.url, "acme", sample_text(7005)).json()["task_id"]
        response = httpx.delete(
            f"{service.url}/api/v1/tasks/{queued}", headers=auth("acme"), timeout=30
        )
        assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
        daemon.start()
        wait_until(service, service.url, "acme", running, ["RUNNING"])
        response = httpx.delete(
            f"{service.url}/api/v1/tasks/{running}", headers=auth("acme"), timeout=30
        )
        assert response.status_code == 200, response.text
        assert response.json()["cancel_requested"] is True
        wait_until(service, service.url, "acme", running, ["CANCELLED"])
        assert llm.requests_for(queued) == 0 and llm.requests_for(running) == 1
        store = results_store()
        for task in (queued, running):
            document_id = store.tasks.get("acme", task).document_id
            assert store.documents.get(document_id).state == State.CANCELLED
            assert store.results.get([document_id]) == []
            events = sse_events(service.url, "acme", task)
            assert [e["event"] for e in events] == ["status", "error"]
            assert events[-1]["data"]["status"] == "CANCELLED"
            again = httpx.delete(
                f"{service.url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30
            )
            assert again.status_code == 409


@pytest.mark.slow
@pytest.mark.daemon
def test_a_60_section_document_killed_halfway_resumes_at_its_first_unfinished_section(
    service: DagsterProcess,
    daemon: DagsterProcess,
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Progress counts sections while the run works ("section k/60"); the run worker SIGKILLed
    after about 30 sections; Dagster fails the run and its run retry finishes the document with
    no command, resuming at its first unfinished section: every section paid at most once more
    than the calls in flight at the kill."""
    from ai_pipeline_tests.defs.test_one_owner import _run_workers

    clauses = "\n".join(
        f"{i}. Clause {i}: Harbor Supplies delivers order {i} to Lisbon and Ana Ribeiro "
        f"confirms the excellent packaging of shipment {i}."
        for i in range(1, 61)
    )
    one_clause = max(len(line) for line in clauses.splitlines())
    monkeypatch.setenv("AI_PIPELINE_SECTION_CHARS", str(one_clause + 1))
    with own_simulator(monkeypatch, latency_ms=1000, concurrency=4) as llm:
        task = submit(service.url, "acme", clauses, "contract.txt").json()["task_id"]
        daemon.start()

        def halfway() -> dict[str, Any] | None:
            state = task_state(service.url, "acme", task)
            return state if state["sections"]["done"] >= 30 else None

        seen = wait_for(daemon, "30 of 60 sections done", halfway, timeout=DONE_SECONDS)
        assert seen["status"] == "RUNNING" and seen["sections"]["total"] == 60
        assert seen["current_step"].startswith("analysing section ")
        assert 10 <= seen["progress"] < 60
        for pid in _run_workers(daemon):
            os.kill(pid, signal.SIGKILL)
        at_kill = llm.stats()["total"]
        done = wait_until(service, service.url, "acme", task, ["COMPLETED"])
        # The document is done before its run has written its own end.
        retried = dg.RunsFilter(tags={"dagster/retry_number": "1"})
        (retry,) = wait_for(
            daemon,
            "the retry run over",
            lambda: [r for r in instance.get_runs(retried) if r.is_finished],
        )
        assert retry.status == dg.DagsterRunStatus.SUCCESS
        assert done["status"] == "COMPLETED"
        assert done["sections"] == {"done": 60, "total": 60}
        calls = llm.stats()["total"]
        assert 60 <= calls <= 60 + 4, (calls, at_kill)
        assert at_kill < 60


def read_stream(
    url: str,
    tenant: str,
    task: str,
    last_event_id: str | None = None,
    enough: Callable[[list[dict[str, Any]]], bool] = lambda events: False,
    until_comment: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The events of a task's stream and its comment lines, until the server ends it or
    ``enough`` says so of the events so far, or (``until_comment``) the first comment (a
    heartbeat) comes (then the client disconnects)."""
    headers = auth(tenant) | ({"Last-Event-ID": last_event_id} if last_event_id else {})
    events: list[dict[str, Any]] = []
    comments: list[str] = []
    current: dict[str, Any] = {}
    with httpx.stream(
        "GET", f"{url}/api/v1/tasks/{task}/events", headers=headers, timeout=DONE_SECONDS
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith(":"):
                comments.append(line)
                if until_comment:
                    break
            elif not line:
                if current:
                    events.append(current)
                    if enough(events):
                        break
                current = {}
            else:
                field, _, value = line.partition(":")
                current[field] = json.loads(value) if field == "data" else value.strip()
    return events, comments


@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("serve_args", [["--heartbeat-seconds", "1"]])
def test_a_sectioned_task_streams_growing_progress_and_resumes_after_a_disconnect(
    service: DagsterProcess, daemon: DagsterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A six-section document analysed one section at a time: its stream sends progress events
    with strictly growing ids and heartbeat comments; a client that disconnects mid-run and
    reconnects with ``Last-Event-ID`` gets only later progress, then exactly one ``completed``."""
    clauses = "\n".join(
        f"{i}. Clause {i}: Harbor Supplies delivers order {i} to Lisbon on time." for i in range(6)
    )
    monkeypatch.setenv(
        "AI_PIPELINE_SECTION_CHARS", str(max(len(line) for line in clauses.splitlines()) + 1)
    )
    with own_simulator(monkeypatch, latency_ms=700, concurrency=1) as llm:
        task = submit(service.url, "acme", clauses, "clauses.txt").json()["task_id"]
        daemon.start()

        def mid_run(events: list[dict[str, Any]]) -> bool:
            progress = [e for e in events if e.get("event") == "progress"]
            return len(progress) >= 2 and progress[-1]["data"]["progress"] >= 10

        first, comments = read_stream(service.url, "acme", task, enough=mid_run)
        assert [e["event"] for e in first][:1] == ["status"]
        assert not [e for e in first if e["event"] in ("completed", "error")], first
        assert any(c.startswith(": ping") for c in comments), comments
        seen = [int(e["id"]) for e in first if e["event"] == "progress"]
        assert len(seen) >= 2 and seen == sorted(set(seen)), seen

        again, _ = read_stream(service.url, "acme", task, last_event_id=str(seen[-1]))
        assert again[0]["event"] == "status" and "id" not in again[0]
        later = [int(e["id"]) for e in again if e["event"] == "progress"]
        assert later and later == sorted(set(later)) and later[0] > seen[-1], (seen, later)
        finals = [e for e in again if e["event"] in ("completed", "error")]
        assert [e["event"] for e in finals] == ["completed"] and again[-1] is finals[0]
        assert finals[0]["id"] == "1000" and finals[0]["data"]["sections"] == {
            "done": 6,
            "total": 6,
        }
        assert llm.stats()["total"] == 6


def listing(url: str, tenant: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}/api/v1/tasks", params=params, headers=auth(tenant), timeout=30)


def test_listing_filters_by_status_and_pages_with_a_total(
    service: DagsterProcess, simulator: SimulatorServer
) -> None:
    """``status`` keeps the tasks in that state, ``limit``/``offset`` page the tenant's tasks
    newest first and ``total`` counts every match, whatever the page; bad parameters are 422."""
    url = service.url
    tasks = [submit(url, "acme", sample_text(7300 + i)).json()["task_id"] for i in range(5)]
    submit(url, "globex", sample_text(7399))
    cancelled = [tasks[1], tasks[3]]
    for task in cancelled:
        response = httpx.delete(f"{url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30)
        assert response.status_code == 200, response.text
    newest_first = tasks[::-1]

    def ids(response: httpx.Response) -> list[str]:
        assert response.status_code == 200, response.text
        return [t["task_id"] for t in response.json()["tasks"]]

    everything = listing(url, "acme")
    assert ids(everything) == newest_first and everything.json()["total"] == 5
    only = listing(url, "acme", status="CANCELLED")
    assert ids(only) == cancelled[::-1] and only.json()["total"] == 2
    assert {t["status"] for t in only.json()["tasks"]} == {"CANCELLED"}
    waiting = listing(url, "acme", status="QUEUED")
    assert ids(waiting) == [t for t in newest_first if t not in cancelled]
    assert waiting.json()["total"] == 3
    assert listing(url, "acme", status="COMPLETED").json() == {
        "tasks": [],
        "total": 0,
        "limit": 50,
        "offset": 0,
    }
    pages = [listing(url, "acme", limit=2, offset=offset) for offset in (0, 2, 4, 6)]
    assert [ids(p) for p in pages] == [newest_first[:2], newest_first[2:4], newest_first[4:], []]
    assert [p.json()["total"] for p in pages] == [5, 5, 5, 5]
    assert [(p.json()["limit"], p.json()["offset"]) for p in pages] == [
        (2, 0),
        (2, 2),
        (2, 4),
        (2, 6),
    ]
    second = listing(url, "acme", status="QUEUED", limit=2, offset=2)
    assert ids(second) == [tasks[0]] and second.json()["total"] == 3
    for bad in (
        {"status": "DONE"},
        {"status": "PENDING"},
        {"limit": 0},
        {"limit": 501},
        {"offset": -1},
    ):
        assert listing(url, "acme", **bad).status_code == 422, bad
    assert simulator.stats()["total"] == 0


def test_a_fresh_submission_is_queued_while_its_document_is_pending(
    service: DagsterProcess, simulator: SimulatorServer
) -> None:
    """The 202 (and the 200 for the same content again), polling, the event stream and the
    listing all say QUEUED for a task no run has taken yet, while its document stays PENDING in
    the state machine (the submissions sensor moves it to QUEUED when it launches the run)."""
    url = service.url
    first = submit(url, "acme", sample_text(7400))
    assert first.status_code == 202 and first.json()["status"] == "QUEUED", first.text
    again = submit(url, "acme", sample_text(7400))
    assert again.status_code == 200 and again.json()["status"] == "QUEUED"
    task = first.json()["task_id"]
    store = results_store()
    submitted = store.tasks.get("acme", task)
    assert submitted is not None
    assert store.documents.get(submitted.document_id).state == State.PENDING  # type: ignore[union-attr]
    assert task_state(url, "acme", task)["status"] == "QUEUED"
    events, _ = read_stream(url, "acme", task, enough=lambda events: len(events) >= 2)
    assert [(e["event"], e["data"].get("status")) for e in events] == [
        ("status", "QUEUED"),
        ("progress", None),
    ]
    assert [t["status"] for t in listing(url, "acme").json()["tasks"]] == ["QUEUED"]
    assert simulator.stats()["total"] == 0


def test_the_per_minute_limit_holds_across_two_service_processes(
    tmp_path: Path, dagster_home: Path, tenants_file: Path
) -> None:
    """Two ``ai-pipeline serve`` processes on one results database count a tenant's requests
    together: of 20 concurrent requests spread over both, exactly the limit (6) are answered and
    the rest are 429 with a Retry-After, from both processes; another tenant is not limited."""
    limited = tmp_path / "limited.yaml"
    limited.write_text(
        "tenants:\n"
        "  acme:\n    keys: [acme-key-1]\n    requests_per_minute: 6\n"
        "  globex:\n    keys: [globex-key]\n"
    )
    args = ["--tenants-file", str(limited)]
    with serving(tmp_path / "a.log", args) as a, serving(tmp_path / "b.log", args) as b:
        # The limit is per clock minute: all 20 requests in one.
        second = datetime.now(timezone.utc).second
        if second >= 50:
            time.sleep(61 - second)
        urls = [a.url, b.url] * 10
        with ThreadPoolExecutor(max_workers=10) as pool:
            responses = list(pool.map(lambda url: listing(url, "acme"), urls))
        codes = [r.status_code for r in responses]
        assert sorted(codes) == [200] * 6 + [429] * 14, codes
        assert 429 in codes[0::2] and 429 in codes[1::2], codes
        refused = next(r for r in responses if r.status_code == 429)
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "limit of 6 requests a minute" in refused.json()["detail"]
        assert all(listing(url, "globex").status_code == 200 for url in [a.url, b.url] * 5)
    counted = results_store().db.rows(
        sa.select(tenant_requests.c.count).where(tenant_requests.c.tenant_id == "acme")
    )
    assert [r.count for r in counted] == [20]


@pytest.mark.slow
@pytest.mark.daemon
def test_a_section_reply_failing_a_check_fails_its_document_under_that_sections_task(
    service: DagsterProcess,
    daemon: DagsterProcess,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of two four-section documents, one's second section comes back with a low confidence and
    the other's third with an entity not in its text: each document is FAILED with that check's
    category, its error names the section, its review item and failure event carry that
    section's task id, only the hallucinated reply is quarantined, and nothing is stored."""
    from ai_pipeline.analyses import DOCUMENT_ANALYSIS
    from ai_pipeline.settings import Settings
    from ai_pipeline.tasks import section_step, task_id

    def clauses(word: str) -> str:
        return "\n".join(
            f"{i}. Clause {i}: {word} Supplies delivers order {i} to Lisbon on time."
            for i in range(1, 5)
        )

    unsure, invented = clauses("Alpha"), clauses("Beta")
    monkeypatch.setenv(
        "AI_PIPELINE_SECTION_CHARS", str(max(len(line) for line in unsure.splitlines()) + 1)
    )
    simulator.set_faults(
        [
            {"kind": "low_confidence", "match": "Clause 2: Alpha"},
            {"kind": "hallucinate", "match": "Clause 3: Beta"},
        ]
    )
    tasks = {
        name: submit(service.url, "acme", text, f"{name}.txt").json()["task_id"]
        for name, text in (("unsure", unsure), ("invented", invented))
    }
    daemon.start()
    store = results_store()
    model, version = Settings.load().model, DOCUMENT_ANALYSIS.version
    expected = {
        "unsure": ("LOW_CONFIDENCE", 2),
        "invented": ("MODEL_HALLUCINATION", 3),
    }
    for name, task in tasks.items():
        category, index = expected[name]
        state = wait_until(service, service.url, "acme", task, ["FAILED", "COMPLETED"])
        assert (state["status"], state["category"]) == ("FAILED", category), state
        assert state["error"].startswith(f"section {index}/4 "), state["error"]
        assert state["result"] is None
        document_id = store.tasks.get("acme", task).document_id  # type: ignore[union-attr]
        section_task = task_id(document_id, section_step(index), version, model)
        assert simulator.requests_for(section_task) == 1
        item = store.reviews.get(document_id)
        assert item is not None and item.task_id == section_task
        assert item.category.value == category
        failures = store.events.failures(document_id)
        assert [(f.task_id, f.category.value) for f in failures] == [(section_task, category)]
        quarantined = store.reviews.quarantined(document_id)
        if category == "MODEL_HALLUCINATION":
            assert [q.task_id for q in quarantined] == [section_task]
        else:
            assert quarantined == []
        assert store.results.get([document_id]) == []
    assert simulator.stats()["total"] == 8
