"""One submission followed from 202 to COMPLETED, under a real uvicorn server, a real
dagster-daemon and the simulator over HTTP; each test checks one thing its submitter saw.

The submission is made once for the module (``followed``): starting a daemon and a service and
waiting for a run costs many seconds, and every test here only reads what it recorded. Under
pytest-xdist the first worker that needs it makes it and the others read the same record, so the
split costs no more than one test did.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.store import dispose_stores
from ai_pipeline_tests.dagster_procs import DagsterProcess, running
from ai_pipeline_tests.service.client import sse_events, submit, task_state
from ai_pipeline_tests.service.conftest import auth, serving, write_tenants_file
from ai_pipeline_tests.support import instance_yaml, point_llm_at, results_store, sample_text

pytestmark = [pytest.mark.slow, pytest.mark.daemon]


@dataclass(frozen=True)
class Followed:
    """What one submission showed its submitter, from the 202 to after its completion."""

    url: str
    accepted_status: int
    accepted: dict[str, Any]
    events: list[dict[str, Any]]
    done: dict[str, Any]
    stored_summary: str
    resumed: list[str]
    past_the_end: list[str]
    cancel_status: int
    llm_calls: int

    @property
    def progress(self) -> list[dict[str, Any]]:
        return [e for e in self.events[1:] if e["event"] == "progress"]

    @property
    def finals(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] in ("completed", "error")]


def follow_one_submission(folder: Path, simulator: SimulatorServer) -> Followed:
    """A fresh instance in ``folder`` with a daemon and the service; one document submitted,
    followed to COMPLETED, read again, resumed and cancelled. The processes are gone after."""
    with pytest.MonkeyPatch.context() as mp:
        home = folder / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(instance_yaml())
        mp.setenv("DAGSTER_HOME", str(home))
        mp.setenv("AI_PIPELINE_SETTLE_SECONDS", "0")
        mp.delenv("AI_PIPELINE_DATABASE_URL", raising=False)
        write_tenants_file(folder, mp)
        simulator.set_faults([])
        simulator.set_api_keys(None)
        point_llm_at(mp, simulator)
        with dg.DagsterInstance.from_config(str(home)):
            pass  # the instance's storage first, as the daemon fixture says why
        try:
            with (
                running(DagsterProcess.daemon(folder / "daemon.log"), home) as daemon,
                serving(folder / "serve.log") as service,
            ):
                daemon.start()
                return _follow(service.url, simulator)
        finally:
            dispose_stores()


def _follow(url: str, simulator: SimulatorServer) -> Followed:
    response = submit(url, "acme", sample_text(7001), "contract.txt")
    assert response.status_code in (200, 202), response.text
    task = response.json()["task_id"]
    events = sse_events(url, "acme", task)
    last_progress = [e["id"] for e in events if e["event"] == "progress"][-1:] or ["0"]
    store = results_store()
    (row,) = store.results.get([store.tasks.get("acme", task).document_id])
    done = task_state(url, "acme", task)
    resumed = sse_events(url, "acme", task, last_event_id=last_progress[0])
    past_the_end = sse_events(url, "acme", task, "1000")
    cancel = httpx.delete(f"{url}/api/v1/tasks/{task}", headers=auth("acme"), timeout=30)
    return Followed(
        url=url,
        accepted_status=response.status_code,
        accepted=response.json(),
        events=events,
        done=done,
        stored_summary=row.output["summary"],
        resumed=[e["event"] for e in resumed],
        past_the_end=[e["event"] for e in past_the_end],
        cancel_status=cancel.status_code,
        llm_calls=simulator.requests_for(task),
    )


@pytest.fixture(scope="module")
def followed(
    tmp_path_factory: pytest.TempPathFactory, simulator_server: SimulatorServer, worker_id: str
) -> Iterator[Followed]:
    folder = tmp_path_factory.mktemp("followed")
    if worker_id == "master":
        yield follow_one_submission(folder, simulator_server)
        return
    # One record for all the workers of this session (their base temp's parent is the session's).
    shared = tmp_path_factory.getbasetemp().parent / "followed.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            record = follow_one_submission(folder, simulator_server)
            shared.write_text(json.dumps(asdict(record)))
    yield Followed(**json.loads(shared.read_text()))


def test_a_submission_is_answered_202_queued(followed: Followed) -> None:
    """A new document is answered 202 with a task id and the status QUEUED."""
    assert followed.accepted_status == 202
    assert followed.accepted["task_id"] and followed.accepted["status"] == "QUEUED"


def test_the_answer_says_where_to_poll_and_where_to_stream(followed: Followed) -> None:
    """poll_url and sse_url are the task's URLs under the service's public URL."""
    task = followed.accepted["task_id"]
    assert followed.accepted["poll_url"] == f"{followed.url}/api/v1/tasks/{task}"
    assert followed.accepted["sse_url"] == f"{followed.url}/api/v1/tasks/{task}/events"


def test_the_answer_estimates_the_time_to_completion(followed: Followed) -> None:
    """estimated_seconds is a positive number of seconds."""
    assert followed.accepted["estimated_seconds"] > 0


def test_the_stream_begins_with_the_status(followed: Followed) -> None:
    """The first event of the stream is the task's current status."""
    assert followed.events[0]["event"] == "status"


def test_the_stream_ends_with_exactly_one_completed_event(followed: Followed) -> None:
    """The stream has one final event, ``completed``, and it is the last one."""
    assert [e["event"] for e in followed.finals] == ["completed"]
    assert followed.events[-1] == followed.finals[0]


def test_progress_events_grow_and_carry_their_progress_as_id(followed: Followed) -> None:
    """Progress events come in increasing order, each id being its progress, 0 to 100."""
    ids = [int(e["id"]) for e in followed.progress]
    assert ids == sorted(set(ids)) and all(0 <= i <= 100 for i in ids)
    assert [e["data"]["progress"] for e in followed.progress] == ids


def test_a_completed_task_reads_completed_at_100_percent(followed: Followed) -> None:
    """Polling the finished task gives COMPLETED, progress 100, a completion time and a run link."""
    done = followed.done
    assert done["status"] == "COMPLETED" and done["progress"] == 100
    assert done["completed_at"] and done["dagster_run_url"]


def test_the_result_is_the_stored_one_in_poll_and_stream_alike(followed: Followed) -> None:
    """The result polled is the results row's, and the completed event carries the same result."""
    assert followed.done["result"]["summary"] == followed.stored_summary
    assert followed.finals[0]["data"]["result"] == followed.done["result"]


def test_last_event_id_resumes_after_the_last_progress_event(followed: Followed) -> None:
    """Reconnecting with the last progress id gives the current status, then the final event only."""
    assert followed.resumed == ["status", "completed"]


def test_an_id_past_the_final_event_gives_the_status_alone(followed: Followed) -> None:
    """Reconnecting with an id past the task's events repeats nothing: the status alone."""
    assert followed.past_the_end == ["status"]


def test_a_completed_task_cannot_be_cancelled(followed: Followed) -> None:
    """DELETE on a completed task answers 409."""
    assert followed.cancel_status == 409


def test_the_document_cost_one_llm_call(followed: Followed) -> None:
    """Submission, polling, streams, resumes and a refused cancel made one LLM call in all."""
    assert followed.llm_calls == 1
