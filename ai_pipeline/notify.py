"""Exactly-once completion notices to a downstream webhook.

A notice is a side effect, so it carries its task id as ``Idempotency-Key`` and is checkpointed
like an LLM call: the pipeline sends it only when no checkpoint exists for the task, and stores the
outcome before anything else. What a receiver's answer means (seed 002 §3.4, §4):

- 2xx: delivered, done;
- 409: the receiver already has this key (an earlier attempt got through but its answer was lost):
  DUPLICATE_EXECUTION, treated as done;
- 5xx, 408, timeouts and resets: the network rules — at most 2 retries (1 s, 2 s), same key;
- 429: wait ``Retry-After`` once, then RATE_LIMIT_EXCEEDED;
- any other 4xx: BUSINESS_REJECTED, a person decides; never retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ai_pipeline.failures import Category, ClassifiedError, category_for_status
from ai_pipeline.llm import (
    DEFAULT_RETRY_AFTER_SECONDS,
    MAX_NETWORK_RETRIES,
    MAX_RETRY_AFTER_SECONDS,
    Log,
    backoff_seconds,
)
from ai_pipeline.redaction import redact


@dataclass(frozen=True)
class Delivery:
    """The checkpointed outcome of one notice."""

    status: int
    duplicate: bool
    attempts: int

    def to_payload(self) -> dict[str, Any]:
        return {"status": self.status, "duplicate": self.duplicate, "attempts": self.attempts}


class Notifier:
    """POSTs notices to one webhook URL."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.url = url
        self._sleep = sleep
        self._client = httpx.AsyncClient(timeout=timeout_seconds)

    async def send(self, task_id: str, notice: dict[str, Any], log: Log) -> Delivery:
        """Deliver one notice under the rules above; raises ClassifiedError when it cannot."""
        network_retries = 0
        waited = False
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._client.post(
                    self.url, json=notice, headers={"Idempotency-Key": task_id}
                )
            except httpx.TransportError as e:
                category, message = Category.NETWORK_TIMEOUT, f"{type(e).__name__}: {e}"
                retry_after = None
            else:
                if response.is_success:
                    return Delivery(response.status_code, duplicate=False, attempts=attempt)
                category = category_for_status(response.status_code, downstream=True)
                if category == Category.DUPLICATE_EXECUTION:
                    log.info("the receiver already has this notice (409): treated as done")
                    return Delivery(response.status_code, duplicate=True, attempts=attempt)
                message = f"HTTP {response.status_code}: {response.text[:300]}"
                retry_after = _retry_after(response)
            message = redact(f"webhook {message}")
            if category == Category.NETWORK_TIMEOUT and network_retries < MAX_NETWORK_RETRIES:
                delay = backoff_seconds(network_retries)
                network_retries += 1
                log.warning(f"[RETRY #{network_retries} for TASK:{task_id}] {message}")
                await self._sleep(delay)
                continue
            if category == Category.RATE_LIMIT_EXCEEDED and not waited:
                wait = DEFAULT_RETRY_AFTER_SECONDS if retry_after is None else retry_after
                if wait <= MAX_RETRY_AFTER_SECONDS:
                    waited = True
                    log.warning(f"[RATE LIMIT for TASK:{task_id}] {message}; waiting {wait:g} s")
                    await self._sleep(wait)
                    continue
            raise ClassifiedError(category, message)

    async def aclose(self) -> None:
        await self._client.aclose()


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None
