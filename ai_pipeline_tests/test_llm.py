"""The LLM client's retry, rate-limit, credential and circuit policy, proven with the real openai
SDK over real HTTP against the bundled simulator; only sleeping and the clock are faked."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import openai
import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient, LLMReply
from ai_pipeline.llm_access import Credentials
from ai_pipeline.llm_errors import describe
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.retry import RetryPolicy
from ai_pipeline_tests.support import (
    TEST_API_KEY,
    TEST_MODEL,
    FakeTime,
    RecordingLog,
    sample_text,
)

T = TypeVar("T")
KEY_ENV = "AIP_TEST_LLM_KEY"


class Failures:
    """An ``on_failure`` hook that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Category, int, str]] = []

    def __call__(self, task_id: str, category: Category, attempt: int, message: str) -> None:
        self.calls.append((task_id, category, attempt, message))


def task_id(label: str) -> str:
    return f"task-{label}-{uuid.uuid4().hex[:12]}"


TEXT = sample_text(7)
MESSAGES = DOCUMENT_ANALYSIS.messages(TEXT)


def make_client(
    server: SimulatorServer, fake: FakeTime, api_key: str | Credentials = TEST_API_KEY, **kw: Any
) -> LLMClient:
    return LLMClient(
        base_url=server.base_url,
        api_key=api_key,
        model=TEST_MODEL,
        sleep=fake.sleep,
        clock=fake.clock,
        **kw,
    )


def run_with(
    client_factory: Callable[[], LLMClient], body: Callable[[LLMClient], Awaitable[T]]
) -> T:
    """Build the client inside a fresh event loop, run ``body`` with it, close it."""

    async def go() -> T:
        client = client_factory()
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def analyse_once(
    server: SimulatorServer,
    tid: str,
    fake: FakeTime,
    *,
    log: RecordingLog | None = None,
    api_key: str | Credentials = TEST_API_KEY,
    **kw: Any,
) -> LLMReply:
    return run_with(
        lambda: make_client(server, fake, api_key, **kw),
        lambda client: client.analyse(tid, MESSAGES, log=log),
    )


def records(server: SimulatorServer, tid: str) -> list[dict[str, Any]]:
    return [r for r in server.stats()["requests"] if r["key"] == tid]


def assert_valid_reply(reply: LLMReply) -> None:
    assert reply.finish_reason == "stop"
    assert set(json.loads(reply.content)) == {
        "keywords",
        "summary",
        "sentiment",
        "entities",
        "confidence",
    }


# --- network faults -----------------------------------------------------------------------------


def test_persistent_503_is_retried_twice_then_network_timeout(simulator: SimulatorServer) -> None:
    """A persistent 503 costs 3 requests under one Idempotency-Key, waits 1 s then 2 s, reports
    and logs both retries, then fails with NETWORK_TIMEOUT."""
    tid = task_id("503")
    simulator.set_faults([{"kind": "status", "status": 503, "match": tid}])
    fake, log, hook = FakeTime(), RecordingLog(), Failures()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(simulator, tid, fake, log=log, on_failure=hook)
    assert info.value.category == Category.NETWORK_TIMEOUT
    assert "after 2 retries" in info.value.message
    assert simulator.requests_for(tid) == 3
    assert simulator.stats()["total"] == 3
    assert [r["status"] for r in records(simulator, tid)] == [503, 503, 503]
    assert fake.sleeps == [1.0, 2.0]
    assert [(c[0], c[1], c[2]) for c in hook.calls] == [
        (tid, Category.NETWORK_TIMEOUT, 1),
        (tid, Category.NETWORK_TIMEOUT, 2),
    ]
    assert len(log.warnings) == 2
    for n, line in enumerate(log.warnings, start=1):
        assert line.startswith(f"[RETRY #{n} for TASK:{tid}]")
        assert "503" in line
        assert "The engine is currently overloaded" in line


@pytest.mark.parametrize("status", [408, 409, 500, 502, 504])
def test_other_network_statuses_are_retried_likewise(
    simulator: SimulatorServer, status: int
) -> None:
    """408, 409 (LLM), 500, 502 and 504 are retried twice (1 s, 2 s), then NETWORK_TIMEOUT."""
    tid = task_id(str(status))
    simulator.set_faults([{"kind": "status", "status": status, "match": tid}])
    fake = FakeTime()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(simulator, tid, fake)
    assert info.value.category == Category.NETWORK_TIMEOUT
    assert simulator.requests_for(tid) == 3
    assert fake.sleeps == [1.0, 2.0]


def test_a_transient_503_recovers_on_the_last_retry(simulator: SimulatorServer) -> None:
    """Two 503s and then an answer: the third request, under the same task id, succeeds."""
    tid = task_id("503x2")
    simulator.set_faults([{"kind": "status", "status": 503, "match": tid, "times": 2}])
    fake = FakeTime()
    reply = analyse_once(simulator, tid, fake)
    assert_valid_reply(reply)
    assert [r["status"] for r in records(simulator, tid)] == [503, 503, 200]
    assert fake.sleeps == [1.0, 2.0]


def test_persistent_connection_reset_is_network_timeout(simulator: SimulatorServer) -> None:
    """Connection resets on every attempt give NETWORK_TIMEOUT after 3 requests."""
    tid = task_id("reset")
    simulator.set_faults([{"kind": "reset", "match": tid}])
    fake, log = FakeTime(), RecordingLog()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(simulator, tid, fake, log=log)
    assert info.value.category == Category.NETWORK_TIMEOUT
    assert simulator.requests_for(tid) == 3
    assert [r["status"] for r in records(simulator, tid)] == [None, None, None]
    assert fake.sleeps == [1.0, 2.0]
    assert [line.split("]")[0] for line in log.warnings] == [
        f"[RETRY #1 for TASK:{tid}",
        f"[RETRY #2 for TASK:{tid}",
    ]


def test_a_single_connection_reset_recovers(simulator: SimulatorServer) -> None:
    """One reset and then an answer: success after 2 requests and one 1 s wait."""
    tid = task_id("reset1")
    simulator.set_faults([{"kind": "reset", "match": tid, "times": 1}])
    fake = FakeTime()
    reply = analyse_once(simulator, tid, fake)
    assert_valid_reply(reply)
    assert simulator.requests_for(tid) == 2
    assert fake.sleeps == [1.0]


@pytest.fixture(scope="module")
def hanging_server() -> Iterator[SimulatorServer]:
    """A simulator whose "timeout" fault hangs 2 s (the session one hangs 30 s)."""
    with SimulatorServer(SimulatorConfig(hang_seconds=2)) as server:
        yield server


def test_a_hanging_endpoint_is_network_timeout(hanging_server: SimulatorServer) -> None:
    """A request that hangs past the client timeout is retried twice, then NETWORK_TIMEOUT."""
    tid = task_id("hang")
    hanging_server.reset()
    hanging_server.set_faults([{"kind": "timeout", "match": tid}])
    fake, log = FakeTime(), RecordingLog()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(hanging_server, tid, fake, log=log, timeout_seconds=0.3)
    assert info.value.category == Category.NETWORK_TIMEOUT
    assert hanging_server.requests_for(tid) == 3
    assert fake.sleeps == [1.0, 2.0]
    assert all("timed out" in line for line in log.warnings)


@pytest.mark.parametrize("status", [400, 422])
def test_input_quality_statuses_are_not_retried(simulator: SimulatorServer, status: int) -> None:
    """400 and 422 (naming no setting) give INPUT_QUALITY_ISSUE after exactly one request, with
    no wait."""
    tid = task_id(str(status))
    simulator.set_faults([{"kind": "status", "status": status, "match": tid}])
    fake, log, hook = FakeTime(), RecordingLog(), Failures()
    client_box: list[LLMClient] = []

    def factory() -> LLMClient:
        client_box.append(make_client(simulator, fake, on_failure=hook))
        return client_box[0]

    with pytest.raises(ClassifiedError) as info:
        run_with(factory, lambda client: client.analyse(tid, MESSAGES, log=log))
    assert info.value.category == Category.INPUT_QUALITY_ISSUE
    assert simulator.requests_for(tid) == 1
    assert fake.sleeps == []
    assert hook.calls == []
    assert log.warnings == []
    assert not client_box[0].circuit_open


# --- rate limits --------------------------------------------------------------------------------


def test_a_429_waits_retry_after_once_then_succeeds(simulator: SimulatorServer) -> None:
    """A 429 with Retry-After: 1 is waited for exactly once (1.0 s) and the resubmission
    succeeds."""
    tid = task_id("429")
    simulator.set_faults(
        [{"kind": "status", "status": 429, "retry_after": 1, "match": tid, "times": 1}]
    )
    fake, log, hook = FakeTime(), RecordingLog(), Failures()
    reply = analyse_once(simulator, tid, fake, log=log, on_failure=hook)
    assert_valid_reply(reply)
    assert [r["status"] for r in records(simulator, tid)] == [429, 200]
    assert fake.sleeps == [1.0]
    assert [(c[1], c[2]) for c in hook.calls] == [(Category.RATE_LIMIT_EXCEEDED, 1)]
    assert len(log.warnings) == 1
    assert log.warnings[0].startswith(f"[RATE LIMIT for TASK:{tid}]")


def test_a_second_429_within_the_minute_is_rate_limit_exceeded(
    simulator: SimulatorServer,
) -> None:
    """Two 429s in a row: one wait, then RATE_LIMIT_EXCEEDED after 2 requests."""
    tid = task_id("429x2")
    simulator.set_faults(
        [{"kind": "status", "status": 429, "retry_after": 1, "match": tid, "times": 2}]
    )
    fake = FakeTime()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(simulator, tid, fake)
    assert info.value.category == Category.RATE_LIMIT_EXCEEDED
    assert simulator.requests_for(tid) == 2
    assert fake.sleeps == [1.0]


def test_a_429_without_retry_after_waits_the_default(simulator: SimulatorServer) -> None:
    """A 429 without Retry-After waits the policy's default and then succeeds."""
    tid = task_id("429def")
    simulator.set_faults([{"kind": "status", "status": 429, "match": tid, "times": 1}])
    fake = FakeTime()
    assert_valid_reply(analyse_once(simulator, tid, fake))
    assert simulator.requests_for(tid) == 2
    assert fake.sleeps == [RetryPolicy().default_retry_after_seconds]


def test_a_429_asking_for_an_hour_is_not_waited(simulator: SimulatorServer) -> None:
    """A 429 asking for 3600 s gives RATE_LIMIT_EXCEEDED at once: 1 request, no wait."""
    tid = task_id("429hour")
    simulator.set_faults(
        [{"kind": "status", "status": 429, "retry_after": 3600, "match": tid, "times": 1}]
    )
    fake = FakeTime()
    with pytest.raises(ClassifiedError) as info:
        analyse_once(simulator, tid, fake)
    assert info.value.category == Category.RATE_LIMIT_EXCEEDED
    assert simulator.requests_for(tid) == 1
    assert fake.sleeps == []


def test_a_429_after_the_rolling_minute_is_waited_again(simulator: SimulatorServer) -> None:
    """When the first wait has taken the clock past the minute, a second 429 is waited again."""
    tid = task_id("429roll")
    simulator.set_faults(
        [{"kind": "status", "status": 429, "retry_after": 1, "match": tid, "times": 2}]
    )
    fake = FakeTime(extra=61)
    assert_valid_reply(analyse_once(simulator, tid, fake))
    assert [r["status"] for r in records(simulator, tid)] == [429, 429, 200]
    assert fake.sleeps == [1.0, 1.0]


def test_the_rate_limit_wait_is_per_task_and_per_rolling_minute(
    simulator: SimulatorServer,
) -> None:
    """Across calls of one client: a task that waited 10 s ago is not waited for again, another
    task is, and the first task is waited for again once 61 s have passed."""
    tid, other = task_id("429a"), task_id("429b")

    def fault(match: str) -> list[dict[str, Any]]:
        return [{"kind": "status", "status": 429, "retry_after": 2, "match": match, "times": 1}]

    fake = FakeTime()

    async def body(client: LLMClient) -> None:
        simulator.set_faults(fault(tid))
        await client.analyse(tid, MESSAGES)
        assert fake.sleeps == [2.0]

        fake.now += 10
        simulator.set_faults(fault(tid))
        with pytest.raises(ClassifiedError) as info:
            await client.analyse(tid, MESSAGES)
        assert info.value.category == Category.RATE_LIMIT_EXCEEDED
        assert fake.sleeps == [2.0]

        simulator.set_faults(fault(other))
        await client.analyse(other, MESSAGES)
        assert fake.sleeps == [2.0, 2.0]

        fake.now += 61
        simulator.set_faults(fault(tid))
        await client.analyse(tid, MESSAGES)
        assert fake.sleeps == [2.0, 2.0, 2.0]

    run_with(lambda: make_client(simulator, fake), body)
    assert [r["status"] for r in records(simulator, tid)] == [429, 200, 429, 429, 200]
    assert [r["status"] for r in records(simulator, other)] == [429, 200]


def test_requests_per_minute_limit_delays_the_third_call(simulator: SimulatorServer) -> None:
    """With requests_per_minute=2, the third of three calls waits for the minute; all succeed."""
    fake = FakeTime()
    tids = [task_id(f"rpm{i}") for i in range(3)]

    async def body(client: LLMClient) -> list[LLMReply]:
        return list(await asyncio.gather(*(client.analyse(t, MESSAGES) for t in tids)))

    replies = run_with(lambda: make_client(simulator, fake, requests_per_minute=2), body)
    for reply in replies:
        assert_valid_reply(reply)
    assert [simulator.requests_for(t) for t in tids] == [1, 1, 1]
    assert fake.sleeps == [60.0]


# --- credentials and the circuit ----------------------------------------------------------------


def credentials_from(
    source: str, key: str, fresh: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Credentials:
    """Credentials holding ``key`` whose source (file, env or command) now holds ``fresh``."""
    if source == "file":
        key_file = tmp_path / "api-key"
        key_file.write_text(fresh + "\n")
        return Credentials(key, key_file=str(key_file))
    if source == "command":
        return Credentials(key, key_command=f"printf {fresh}")
    monkeypatch.setenv(KEY_ENV, fresh)
    return Credentials(key, key_env=KEY_ENV)


SOURCES = ["file", "env", "command"]


@pytest.mark.parametrize("source", SOURCES)
def test_an_expired_key_is_refreshed_and_resubmitted(
    simulator: SimulatorServer, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 401 makes the client re-read the key from its source and resubmit the same task id."""
    good = f"good-key-{source}-{uuid.uuid4().hex[:8]}"
    simulator.set_api_keys({good})
    creds = credentials_from(source, f"expired-key-{source}", good, tmp_path, monkeypatch)
    tid = task_id(f"auth-{source}")
    fake, log = FakeTime(), RecordingLog()
    client_box: list[LLMClient] = []

    def factory() -> LLMClient:
        client_box.append(make_client(simulator, fake, creds))
        return client_box[0]

    reply = run_with(factory, lambda client: client.analyse(tid, MESSAGES, log=log))
    assert_valid_reply(reply)
    recs = records(simulator, tid)
    assert simulator.stats()["total"] == 2
    assert [(r["key"], r["authorized"], r["status"]) for r in recs] == [
        (tid, False, 401),
        (tid, True, 200),
    ]
    assert creds.key == good
    assert not client_box[0].circuit_open
    assert fake.sleeps == []
    assert any(line.startswith(f"[AUTH for TASK:{tid}]") for line in log.warnings)


def test_a_403_is_refreshed_and_resubmitted(
    simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 403 is an auth failure too: refresh once, resubmit under the same task id, succeed."""
    tid = task_id("403")
    simulator.set_faults([{"kind": "status", "status": 403, "match": tid, "times": 1}])
    creds = credentials_from("file", "old-key-403", "new-key-403", tmp_path, monkeypatch)
    fake = FakeTime()
    assert_valid_reply(analyse_once(simulator, tid, fake, api_key=creds))
    assert [r["status"] for r in records(simulator, tid)] == [403, 200]
    assert creds.key == "new-key-403"


async def _gather_analyses(client: LLMClient, tids: list[str]) -> list[Any]:
    return list(
        await asyncio.gather(*(client.analyse(t, MESSAGES) for t in tids), return_exceptions=True)
    )


@pytest.mark.parametrize("source", SOURCES)
def test_an_invalid_key_everywhere_fails_the_whole_run_after_two_requests(
    simulator: SimulatorServer, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no valid key anywhere, 6 concurrent documents fail at a cost of two requests (the
    first and its resubmission): that one AUTH_FAILED, naming where the key comes from, the five
    never sent CONFIGURATION; the circuit is open."""
    simulator.set_api_keys({"the-only-good-key"})
    creds = credentials_from(
        source, "expired-key-all", f"still-bad-{source}", tmp_path, monkeypatch
    )
    tids = [task_id(f"bad{i}") for i in range(6)]
    fake = FakeTime()
    client_box: list[LLMClient] = []

    def factory() -> LLMClient:
        client_box.append(make_client(simulator, fake, creds, max_concurrency=4))
        return client_box[0]

    results = run_with(factory, lambda client: _gather_analyses(client, tids))
    assert all(isinstance(r, ClassifiedError) for r in results), results
    # The one sent is the document's failure; the others were never sent: the run's setting.
    assert [r.category for r in results] == [Category.AUTH_FAILED] + [Category.CONFIGURATION] * 5
    assert all("not sent" in r.message for r in results[1:])
    stats = simulator.stats()
    assert stats["total"] <= 2
    assert stats["total"] == 2  # refreshed once and resubmitted, under one task id
    assert len({r["key"] for r in stats["requests"]}) == 1
    assert not any(r["authorized"] for r in stats["requests"])
    assert client_box[0].circuit_open
    assert fake.sleeps == []


def test_an_open_circuit_fails_later_calls_without_a_request(
    simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the source holds the same refused key, one request opens the circuit and a later
    call fails fast without reaching the endpoint, as the run's CONFIGURATION: never sent."""
    simulator.set_api_keys({"the-only-good-key"})
    creds = credentials_from("file", "refused-key-1", "refused-key-1", tmp_path, monkeypatch)
    first, later = task_id("circuit1"), task_id("circuit2")
    fake, log = FakeTime(), RecordingLog()

    async def body(client: LLMClient) -> tuple[ClassifiedError, ClassifiedError, bool]:
        with pytest.raises(ClassifiedError) as one:
            await client.analyse(first, MESSAGES, log=log)
        with pytest.raises(ClassifiedError) as two:
            await client.analyse(later, MESSAGES, log=log)
        return one.value, two.value, client.circuit_open

    one, two, circuit_open = run_with(lambda: make_client(simulator, fake, creds), body)
    assert (one.category, two.category) == (Category.AUTH_FAILED, Category.CONFIGURATION)
    assert "no fresh credentials" in one.message
    assert "check the API key (the key file" in one.message
    assert "circuit is open" in two.message
    assert circuit_open
    assert simulator.requests_for(first) == 1
    assert simulator.requests_for(later) == 0
    assert any(line.startswith(f"[CIRCUIT for TASK:{first}]") for line in log.errors)


def test_bad_credentials_cost_two_requests_even_after_a_network_failure(
    simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until a call has gone through, calls go one at a time: a first call lost to the network
    does not let bad credentials cost more than two requests on the next documents."""
    lost = task_id("lost")
    simulator.set_faults([{"kind": "reset", "match": lost}])
    creds = credentials_from("file", "expired-key-net", "still-bad-net", tmp_path, monkeypatch)
    tids = [task_id(f"after{i}") for i in range(6)]
    fake = FakeTime()

    async def body(client: LLMClient) -> list[Any]:
        with pytest.raises(ClassifiedError) as info:
            await client.analyse(lost, MESSAGES)
        assert info.value.category == Category.NETWORK_TIMEOUT
        # From here on the endpoint refuses the key: the first call never learnt whether it was
        # good, because no request of it got through.
        simulator.set_faults([])
        simulator.set_api_keys({"the-only-good-key"})
        return await _gather_analyses(client, tids)

    results = run_with(lambda: make_client(simulator, fake, creds, max_concurrency=4), body)
    assert [getattr(r, "category", r) for r in results] == [Category.AUTH_FAILED] + [
        Category.CONFIGURATION
    ] * 5
    assert simulator.requests_for(lost) == 3
    assert sum(simulator.requests_for(t) for t in tids) <= 2


# --- no secrets in messages ---------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["sk-test-SECRET-123456", "plainSECRETkey98765"])
def test_auth_failures_never_show_the_key(
    simulator: SimulatorServer, secret: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the ClassifiedError messages nor the log lines nor the failure reports of a
    refused key contain that key."""
    simulator.set_api_keys({"the-only-good-key"})
    monkeypatch.delenv(KEY_ENV, raising=False)
    creds = Credentials(secret, key_env=KEY_ENV)
    tids = [task_id("secret0"), task_id("secret1")]
    fake, log, hook = FakeTime(), RecordingLog(), Failures()

    def factory() -> LLMClient:
        return make_client(simulator, fake, creds, on_failure=hook)

    async def with_log(client: LLMClient) -> list[Any]:
        out: list[Any] = []
        for t in tids:
            try:
                out.append(await client.analyse(t, MESSAGES, log=log))
            except ClassifiedError as e:
                out.append(e)
        return out

    results = run_with(factory, with_log)
    assert [getattr(r, "category", None) for r in results] == [
        Category.AUTH_FAILED,
        Category.CONFIGURATION,
    ]
    texts = [str(r) for r in results] + [r.message for r in results] + log.lines
    texts += [c[3] for c in hook.calls]
    assert log.errors, "the circuit opening is logged"
    for text in texts:
        assert secret not in text
    assert simulator.requests_for(tids[0]) == 1
    assert simulator.requests_for(tids[1]) == 0


@pytest.mark.parametrize("secret", ["sk-test-SECRET-123456", "plainSECRETkey98765"])
def test_describe_removes_a_key_the_endpoint_echoes(secret: str) -> None:
    """An error whose message echoes the key (as OpenAI's 401 does) is described without it."""
    Credentials(secret)  # registers the key, as every client does
    response = httpx2.Response(
        401, request=httpx2.Request("POST", "https://llm.invalid/v1/chat/completions")
    )
    error = openai.AuthenticationError(
        f"Error code: 401 - Incorrect API key provided: {secret}.", response=response, body=None
    )
    text = describe(error)
    assert secret not in text
    assert text.startswith("HTTP 401: ")
    wrapped = ClassifiedError(Category.AUTH_FAILED, text)
    assert secret not in str(wrapped)


class OrderedMeter:
    """A meter that reserves nothing and records the order of its reservations and settlements."""

    max_completion_tokens = None

    def __init__(self) -> None:
        self.order: list[str] = []

    def reserve(self, task: str, model: str, messages: Any, **_: Any) -> str:
        self.order.append(f"reserve {task}")
        return task

    def settle(self, reservation: str, **_: Any) -> None:
        self.order.append(f"settle {reservation}")


def test_the_call_waiting_for_a_slot_goes_out_before_the_last_replys_bookkeeping(
    simulator: SimulatorServer,
) -> None:
    """With one slot and two calls, the second call is under way (its reservation made) before
    the first reply's usage is recorded: a reply's bookkeeping does not keep a freed slot idle."""
    fake = FakeTime()
    meter = OrderedMeter()

    async def both(client: LLMClient) -> list[LLMReply]:
        await client.analyse("probe", MESSAGES)  # until one call has gone through, calls go alone
        return list(
            await asyncio.gather(client.analyse("a", MESSAGES), client.analyse("b", MESSAGES))
        )

    replies = run_with(
        lambda: make_client(simulator, fake, max_concurrency=1, meter=meter),  # type: ignore[arg-type]
        both,
    )

    assert [r.finish_reason for r in replies] == ["stop", "stop"]
    assert meter.order[2:] == ["reserve a", "reserve b", "settle a", "settle b"]
