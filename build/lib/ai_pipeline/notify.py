"""Exactly-once completion notices to a downstream webhook.

A notice is a side effect, so it carries its task id as ``Idempotency-Key`` and is checkpointed
like an LLM call: the pipeline sends it only when no checkpoint exists for the task, and stores the
outcome before anything else. What a receiver's answer means:

- 2xx: delivered, done;
- 409: the receiver already has this key (an earlier attempt got through but its answer was lost):
  DUPLICATE_EXECUTION, treated as done;
- 5xx, 408, timeouts and resets: the network rules of ``ai_pipeline.retry`` — at most 2 retries
  (1 s, 2 s), same key;
- 429: wait ``Retry-After`` once a minute (the same rule as the LLM's), then RATE_LIMIT_EXCEEDED;
- any other 4xx: BUSINESS_REJECTED, a person decides; never retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ai_pipeline.failures import Category, ClassifiedError, category_for_status
from ai_pipeline.redaction import redact
from ai_pipeline.retry import AttemptFailure, Log, Retrier, parse_retry_after
from ai_pipeline.tracing import mark_failed, span


@dataclass(frozen=True)
class Delivery:
    """The checkpointed outcome of one notice."""

    status: int
    duplicate: bool
    attempts: int

    def to_payload(self) -> dict[str, Any]:
        return {"status": self.status, "duplicate": self.duplicate, "attempts": self.attempts}


class _Refused(Exception):
    """An answer that is not a delivery: its status, body and the wait it asks for."""

    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _attempt_failure(error: BaseException) -> AttemptFailure:
    if isinstance(error, _Refused):
        response = error.response
        return AttemptFailure(
            category_for_status(response.status_code, downstream=True),
            redact(f"webhook HTTP {response.status_code}: {response.text[:300]}"),
            retry_after=parse_retry_after(response.headers),
            cause=error,
        )
    if isinstance(error, httpx.TransportError):
        message = redact(f"webhook {type(error).__name__}: {error}")
        return AttemptFailure(Category.NETWORK_TIMEOUT, message, cause=error)
    message = redact(f"webhook {type(error).__name__}: {error}")[:500]
    return AttemptFailure(Category.INTERNAL_ERROR, message, cause=error)


class Notifier:
    """POSTs notices to one webhook URL."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = url
        self._retrier = Retrier(sleep=sleep, clock=clock)
        self._client = httpx.AsyncClient(timeout=timeout_seconds)

    async def send(self, task_id: str, notice: dict[str, Any], log: Log) -> Delivery:
        """One notice under the retry policy (a span of its own, with its task id)."""
        with span("notice.send", task_id=task_id, **{"http.url": self.url}) as current:
            try:
                return await self._send_notice(task_id, notice, log)
            except ClassifiedError as e:
                mark_failed(current, e.category, e.message)
                raise

    async def _send_notice(self, task_id: str, notice: dict[str, Any], log: Log) -> Delivery:
        """Deliver one notice under the rules above; raises ClassifiedError when it cannot."""
        attempts = 0

        async def post() -> Delivery:
            nonlocal attempts
            attempts += 1
            response = await self._client.post(
                self.url, json=notice, headers={"Idempotency-Key": task_id}
            )
            if response.is_success:
                return Delivery(response.status_code, duplicate=False, attempts=attempts)
            if category_for_status(response.status_code, downstream=True) == (
                Category.DUPLICATE_EXECUTION
            ):
                log.info("the receiver already has this notice (409): treated as done")
                return Delivery(response.status_code, duplicate=True, attempts=attempts)
            raise _Refused(response)

        return await self._retrier.call(task_id, post, _attempt_failure, log=log)

    async def aclose(self) -> None:
        await self._client.aclose()
