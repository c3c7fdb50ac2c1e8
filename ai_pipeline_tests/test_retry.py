"""The one retry policy: backoff, Retry-After parsing, and the loop both outbound clients use."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import Callable

import httpx
import httpx2
import openai
import pytest

from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm_errors import attempt_failure
from ai_pipeline.notify import Notifier
from ai_pipeline.retry import AttemptFailure, Retrier, RetryPolicy, parse_retry_after
from ai_pipeline_tests.support import FakeTime, RecordingLog

NOW = 1_700_000_000.0
REQUEST = httpx2.Request("POST", "https://llm.invalid/v1/chat/completions")


def test_backoff_is_seed_002s() -> None:
    """Network backoff is min(1000·2^n, 5000) ms: 1, 2, 4, 5, 5 seconds."""
    assert [RetryPolicy().backoff(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "1"}, 1.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after-ms": "junk", "retry-after": "3"}, 3.0),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "Someday, 99 Foo 20xx"}, None),
        ({}, None),
        ({"content-type": "application/json"}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    """Seconds, retry-after-ms, garbage (``nan`` included) and absence give the expected wait."""
    assert parse_retry_after(headers, now=NOW) == expected


def test_parse_retry_after_as_an_http_date() -> None:
    """An HTTP date 30 s after ``now`` asks for a 30 s wait; a past date for none."""
    future = email.utils.formatdate(NOW + 30, usegmt=True)
    past = email.utils.formatdate(NOW - 30, usegmt=True)
    assert parse_retry_after({"retry-after": future}, now=NOW) == pytest.approx(30, abs=0.01)
    assert parse_retry_after({"retry-after": past}, now=NOW) == 0.0


def test_sdk_errors_carry_their_wait_whatever_the_header_case() -> None:
    """The SDK's headers are read case-insensitively; an error without a response asks no wait."""
    response = httpx2.Response(429, headers={"Retry-After-Ms": "250"}, request=REQUEST)
    error = openai.RateLimitError("slow down", response=response, body=None)
    assert attempt_failure(error).retry_after == 0.25
    assert attempt_failure(error).category == Category.RATE_LIMIT_EXCEEDED
    connection = attempt_failure(openai.APIConnectionError(request=REQUEST))
    assert (connection.category, connection.retry_after) == (Category.NETWORK_TIMEOUT, None)


def _failing(failures: list[AttemptFailure]) -> tuple[Callable[[], object], list[int]]:
    """A send() that raises the given failures in turn, then returns "ok"; and its call count."""
    calls = [0]

    async def send() -> str:
        calls[0] += 1
        if failures:
            raise _Failed(failures.pop(0))
        return "ok"

    return send, calls


class _Failed(Exception):
    def __init__(self, failure: AttemptFailure) -> None:
        self.failure = failure


def _classify(error: BaseException) -> AttemptFailure:
    assert isinstance(error, _Failed)
    return error.failure


def _run(retrier: Retrier, send: Callable[[], object], **kwargs: object) -> object:
    return asyncio.run(retrier.call("t1", send, _classify, **kwargs))  # type: ignore[arg-type]


def test_network_faults_are_retried_twice_then_final() -> None:
    """A persistent network fault costs three attempts, 1 s and 2 s apart, then fails NETWORK."""
    clock, log = FakeTime(start=0.0), RecordingLog()
    retried: list[tuple[str, Category, int]] = []
    net = AttemptFailure(Category.NETWORK_TIMEOUT, "HTTP 503")
    send, calls = _failing([net, net, net])
    with pytest.raises(ClassifiedError) as info:
        _run(
            Retrier(sleep=clock.sleep, clock=clock.clock),
            send,
            log=log,
            on_retry=lambda t, c, a, m: retried.append((t, c, a)),
        )
    assert calls[0] == 3
    assert clock.sleeps == [1.0, 2.0]
    assert info.value.category == Category.NETWORK_TIMEOUT
    assert info.value.message == "HTTP 503 (after 2 retries)"
    assert log.warnings == ["[RETRY #1 for TASK:t1] HTTP 503", "[RETRY #2 for TASK:t1] HTTP 503"]
    assert retried == [("t1", Category.NETWORK_TIMEOUT, 1), ("t1", Category.NETWORK_TIMEOUT, 2)]


def test_a_rate_limit_is_waited_once_per_task_per_minute() -> None:
    """One 429 is waited out (its Retry-After, else 5 s); a second within the minute is final."""
    clock = FakeTime(start=0.0)
    retrier = Retrier(sleep=clock.sleep, clock=clock.clock)
    limited = AttemptFailure(Category.RATE_LIMIT_EXCEEDED, "HTTP 429", retry_after=3.0)
    send, calls = _failing([limited])
    assert _run(retrier, send) == "ok"
    assert clock.sleeps == [3.0]
    send, calls = _failing([AttemptFailure(Category.RATE_LIMIT_EXCEEDED, "HTTP 429")])
    with pytest.raises(ClassifiedError) as info:
        _run(retrier, send)
    assert info.value.category == Category.RATE_LIMIT_EXCEEDED
    assert "already waited once within the minute" in info.value.message
    clock.now += 61
    send, calls = _failing([AttemptFailure(Category.RATE_LIMIT_EXCEEDED, "HTTP 429")])
    assert _run(retrier, send) == "ok"
    assert clock.sleeps == [3.0, 5.0]


def test_a_rate_limit_asking_too_long_is_not_waited() -> None:
    """A Retry-After beyond the policy's maximum (60 s) is final at once, without sleeping."""
    clock = FakeTime(start=0.0)
    send, calls = _failing([AttemptFailure(Category.RATE_LIMIT_EXCEEDED, "429", retry_after=3600)])
    with pytest.raises(ClassifiedError):
        _run(Retrier(sleep=clock.sleep, clock=clock.clock), send)
    assert (calls[0], clock.sleeps) == (1, [])


def test_other_failures_are_final_unless_recovered() -> None:
    """A 400 is final at once; the recover hook may send again (once here), then it is final."""
    clock = FakeTime(start=0.0)
    bad = AttemptFailure(Category.INPUT_QUALITY_ISSUE, "HTTP 400")
    send, calls = _failing([bad])
    with pytest.raises(ClassifiedError):
        _run(Retrier(sleep=clock.sleep, clock=clock.clock), send)
    assert calls[0] == 1

    seen: list[int] = []

    async def recover(failure: AttemptFailure, attempt: int) -> AttemptFailure | None:
        seen.append(attempt)
        return None if len(seen) == 1 else failure.amended("; refused again")

    auth = AttemptFailure(Category.AUTH_FAILED, "HTTP 401")
    send, calls = _failing([auth, auth])
    with pytest.raises(ClassifiedError) as info:
        _run(Retrier(sleep=clock.sleep, clock=clock.clock), send, recover=recover)
    assert (calls[0], seen, info.value.message) == (2, [1, 2], "HTTP 401; refused again")
    assert clock.sleeps == []


def test_the_webhook_honours_an_http_date_retry_after() -> None:
    """The notifier parses Retry-After like the LLM client: an HTTP date is waited out once."""
    clock = FakeTime(start=0.0)
    answers = [
        httpx.Response(429, headers={"Retry-After": email.utils.formatdate(usegmt=True)}),
        httpx.Response(201, json={"status": "accepted"}),
    ]
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        return answers.pop(0)

    async def deliver() -> object:
        notifier = Notifier("http://receiver.invalid/notices", sleep=clock.sleep, clock=clock.clock)
        notifier._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await notifier.send("doc-notify-v1", {"document_id": "doc"}, RecordingLog())
        finally:
            await notifier.aclose()

    delivery = asyncio.run(deliver())
    assert delivery.status == 201  # type: ignore[attr-defined]
    assert keys == ["doc-notify-v1", "doc-notify-v1"]
    assert len(clock.sleeps) == 1 and 0.0 <= clock.sleeps[0] <= 1.0
