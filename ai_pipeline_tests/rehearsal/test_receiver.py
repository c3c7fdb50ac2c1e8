"""Tests of the reference notification receiver, over real HTTP with httpx."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ai_pipeline.rehearsal.receiver import ReceiverControl, ReceiverServer
from ai_pipeline.rehearsal.receiver_state import ReceiverConfig

NOTICE = {"task_id": "t-1", "document": "doc-1", "state": "completed"}


@pytest.fixture(scope="module")
def shared_receiver() -> Iterator[ReceiverServer]:
    with ReceiverServer() as running:
        yield running


@pytest.fixture
def server(shared_receiver: ReceiverServer) -> ReceiverServer:
    """The module's receiver, without faults, notices or counters."""
    shared_receiver.set_faults([])
    shared_receiver.reset()
    return shared_receiver


def post(url: str, key: str | None, body: Any = NOTICE) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return httpx.post(url, json=body, headers=headers, timeout=5)


def test_first_notice_is_accepted_and_stored(server: ReceiverServer) -> None:
    """The first notice with a key is answered 201 and stored with its body."""
    response = post(server.url, "task-a")
    assert response.status_code == 201
    assert response.json() == {"status": "accepted", "key": "task-a"}
    notices = server.stats()["notices"]
    assert [(n["key"], n["body"]) for n in notices] == [("task-a", NOTICE)]
    assert notices[0]["received_at"]
    assert server.accepted("task-a") == 1


def test_same_key_again_is_a_duplicate_stored_once(server: ReceiverServer) -> None:
    """The same key again is answered 409 and the notice is not stored a second time."""
    assert post(server.url, "task-b").status_code == 201
    second = post(server.url, "task-b", {"different": "body"})
    assert second.status_code == 409
    assert second.json() == {"status": "duplicate", "key": "task-b"}
    stats = server.stats()
    assert [n["body"] for n in stats["notices"]] == [NOTICE]
    assert stats["accepted_by_key"] == {"task-b": 1}
    assert stats["requests_by_key"] == {"task-b": 2}
    assert stats["by_status"] == {"201": 1, "409": 1}
    assert server.requests_for("task-b") == 2


def test_missing_key_is_rejected(server: ReceiverServer) -> None:
    """A notice without Idempotency-Key is answered 400 and not stored."""
    response = post(server.url, None)
    assert response.status_code == 400
    assert response.json() == {"error": "missing Idempotency-Key"}
    assert server.stats()["notices"] == []


def test_status_fault_hits_once_then_the_notice_is_accepted(server: ReceiverServer) -> None:
    """A 503 fault with times=1 answers 503 once; the retry with the same key gets 201."""
    server.set_faults([{"kind": "status", "status": 503, "match": "task-c", "times": 1}])
    first = post(server.url, "task-c")
    assert first.status_code == 503
    assert first.json()["code"] == "SERVICE_UNAVAILABLE"
    assert server.stats()["notices"] == []
    assert post(server.url, "task-c").status_code == 201
    assert post(server.url, "other").status_code == 201  # not matched
    assert server.accepted("task-c") == 1
    assert server.faults()["state"] == [{"remaining": 0, "hit": 1}]


def test_business_error_has_a_json_body(server: ReceiverServer) -> None:
    """A 422 fault answers with the scripted error and code, and stores nothing."""
    server.set_faults(
        [
            {
                "kind": "status",
                "status": 422,
                "error": "insufficient balance",
                "code": "INSUFFICIENT_BALANCE",
            }
        ]
    )
    response = post(server.url, "task-d")
    assert response.status_code == 422
    assert response.json() == {"error": "insufficient balance", "code": "INSUFFICIENT_BALANCE"}
    assert server.accepted("task-d") == 0
    assert server.stats()["by_status"] == {"422": 1}


def test_reset_fault_drops_the_connection(server: ReceiverServer) -> None:
    """A reset fault drops the connection unanswered (a transport error) and stores nothing."""
    server.set_faults([{"kind": "reset", "times": 1}])
    with pytest.raises(httpx.TransportError):
        post(server.url, "task-e")
    assert server.accepted("task-e") == 0
    assert server.stats()["by_status"] == {"reset": 1}
    assert post(server.url, "task-e").status_code == 201


def test_accept_then_reset_makes_the_retry_a_duplicate(server: ReceiverServer) -> None:
    """When the answer is lost after the accept, the retry with the same key gets 409."""
    server.set_faults([{"kind": "accept_then_reset", "match": "task-f", "times": 1}])
    with pytest.raises(httpx.TransportError):
        post(server.url, "task-f")
    retry = post(server.url, "task-f")
    assert retry.status_code == 409
    stats = server.stats()
    assert stats["accepted_by_key"] == {"task-f": 1}
    assert stats["requests_by_key"] == {"task-f": 2}
    assert stats["by_status"] == {"reset": 1, "409": 1}


def test_delay_fault_then_normal_answer(server: ReceiverServer) -> None:
    """A delay fault holds the answer for its seconds, then the notice is accepted."""
    server.set_faults([{"kind": "delay", "seconds": 0.3, "times": 1}])
    started = time.monotonic()
    response = post(server.url, "task-g")
    assert time.monotonic() - started >= 0.3
    assert response.status_code == 201
    assert response.headers["x-receiver-fault"] == "delay"


def test_restart_on_the_same_state_file_keeps_keys(tmp_path: Path) -> None:
    """A receiver restarted on the same state file still answers 409 for keys it accepted."""
    state_file = str(tmp_path / "receiver.sqlite3")
    with ReceiverServer(ReceiverConfig(state_file=state_file)) as first:
        assert post(first.url, "task-h").status_code == 201
    with ReceiverServer(ReceiverConfig(state_file=state_file)) as second:
        assert post(second.url, "task-h").status_code == 409
        assert post(second.url, "task-i").status_code == 201
        stats = second.stats()
        assert [n["key"] for n in stats["notices"]] == ["task-h", "task-i"]
        assert stats["requests"] == 2  # counters restart; the notices persist
    with ReceiverServer() as without_state:  # the contrast: memory forgets on restart
        assert post(without_state.url, "task-h").status_code == 201


def test_control_api_over_http(server: ReceiverServer) -> None:
    """ReceiverControl reads stats, replaces faults and resets a receiver over HTTP."""
    control = ReceiverControl(server.url)
    assert control.root_url == server.root_url
    assert ReceiverControl(server.root_url + "/").url == server.url
    control.set_faults([{"kind": "status", "status": 429, "retry_after": 2, "times": 1}])
    assert control.faults()["faults"][0]["status"] == 429
    limited = post(server.url, "task-j")
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
    assert post(server.url, "task-j").status_code == 201
    assert control.accepted("task-j") == 1
    assert control.requests_for("task-j") == 2
    stats = control.stats()
    assert stats["requests"] == 2
    assert stats["by_status"] == {"429": 1, "201": 1}
    assert [n["key"] for n in stats["notices"]] == ["task-j"]
    with pytest.raises(ValueError):
        control.set_faults([{"kind": "explode"}])
    bad = httpx.post(f"{server.root_url}/_receiver/faults", json={"faults": [{"kind": "x"}]})
    assert bad.status_code == 400
    control.reset()
    assert control.stats() == {
        "requests": 0,
        "requests_by_key": {},
        "accepted_by_key": {},
        "by_status": {},
        "notices": [],
    }
    assert post(server.url, "task-j").status_code == 201  # reset forgets the keys too


def test_concurrent_duplicates_are_accepted_once(server: ReceiverServer) -> None:
    """Twenty concurrent notices with one key get exactly one 201 and nineteen 409s."""
    # A short delay keeps all twenty in flight together before any of them is accepted.
    server.set_faults([{"kind": "delay", "seconds": 0.2}])

    async def send_all() -> list[int]:
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(timeout=5, limits=limits) as client:
            responses = await asyncio.gather(
                *(
                    client.post(server.url, json=NOTICE, headers={"Idempotency-Key": "task-k"})
                    for _ in range(20)
                )
            )
        return [response.status_code for response in responses]

    assert Counter(asyncio.run(send_all())) == {201: 1, 409: 19}
    assert server.accepted("task-k") == 1
    assert len(server.stats()["notices"]) == 1
