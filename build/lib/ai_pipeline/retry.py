"""When an outbound call is tried again: the one retry policy of every client.

Both external calls of a document's work — the LLM analysis (``ai_pipeline.llm``) and the
completion notice (``ai_pipeline.notify``) — go through :meth:`Retrier.call`, so they follow the
same rules, by the category of each failure (``ai_pipeline.failures``):

- NETWORK_TIMEOUT: at most ``max_network_retries`` (2) retries, after ``min(1000·2^n, 5000)`` ms —
  1 s, then 2 s — each logged ``[RETRY #n for TASK:<id>] <error>``, same task id every time;
- RATE_LIMIT_EXCEEDED: wait what the answer asks for (:func:`parse_retry_after`: ``retry-after-ms``,
  ``Retry-After`` in seconds or as an HTTP date; a default when absent), at most once per task per
  rolling minute, and never longer than ``max_retry_after_seconds``;
- anything else is final, unless the caller's ``recover`` hook says to try again (the LLM client
  refreshes its credentials after a 401/403 this way).

Only the task whose call failed waits; the caller's other tasks go on.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.tracing import CATEGORY, LAYER, span

T = TypeVar("T")


class Log(Protocol):
    """Where a client's lines about one task go (Dagster's run log, a logger, a test's list)."""

    def info(self, msg: str) -> Any: ...
    def warning(self, msg: str) -> Any: ...
    def error(self, msg: str) -> Any: ...


class NullLog:
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...
    def error(self, msg: str) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """The numbers of the policy; the defaults are the failure table's (``failures.RULES``)."""

    max_network_retries: int = 2
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 5.0
    rate_limit_window_seconds: float = 60.0
    default_retry_after_seconds: float = 5.0
    max_retry_after_seconds: float = 60.0

    def backoff(self, retry: int) -> float:
        """Seconds before network retry number ``retry`` (0-based): 1, 2, 4, … capped at 5."""
        return min(self.backoff_base_seconds * 2**retry, self.backoff_cap_seconds)


DEFAULT_POLICY = RetryPolicy()


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """The wait an answer asks for, in seconds: ``retry-after-ms``, then ``Retry-After`` as seconds
    or as an HTTP date (a date in the past is 0). None when absent or unreadable (``nan``, junk)."""
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            if math.isfinite(float(ms)):
                return max(float(ms) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is not None:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (now if now is not None else time.time()), 0.0)


@dataclass(frozen=True)
class AttemptFailure:
    """How one attempt failed: its category, a message safe to show, and the wait it asked for."""

    category: Category
    message: str
    retry_after: float | None = None
    cause: BaseException | None = None

    def amended(self, suffix: str) -> AttemptFailure:
        return replace(self, message=self.message + suffix)


# Called for every failed attempt that is tried again: (task id, category, attempt, message).
RetryHook = Callable[[str, Category, int, str], None]
# Decides about a failure the policy would not retry, given it and the attempt number: None to
# send again, else the final failure.
RecoverHook = Callable[[AttemptFailure, int], Awaitable["AttemptFailure | None"]]


def _failed(category: Category) -> dict[str, str]:
    return {CATEGORY: category.value, LAYER: category.rule.layer.value}


class Retrier:
    """Runs calls under a :class:`RetryPolicy`; remembers, per task, its last rate-limit wait."""

    def __init__(
        self,
        policy: RetryPolicy = DEFAULT_POLICY,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.policy = policy
        self._sleep = sleep
        self._clock = clock
        self._last_rate_wait: dict[str, float] = {}

    async def call(
        self,
        task_id: str,
        send: Callable[[], Awaitable[T]],
        classify: Callable[[BaseException], AttemptFailure],
        *,
        log: Log | None = None,
        on_retry: RetryHook | None = None,
        recover: RecoverHook | None = None,
    ) -> T:
        """``send()`` until it returns, or raise ClassifiedError with the final failure."""
        log = log or NullLog()
        network_retries = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                return await send()
            except Exception as e:  # every failure is classified; none escapes unclassified
                failure = classify(e)
            category = failure.category
            if category == Category.NETWORK_TIMEOUT:
                if network_retries < self.policy.max_network_retries:
                    delay = self.policy.backoff(network_retries)
                    network_retries += 1
                    log.warning(f"[RETRY #{network_retries} for TASK:{task_id}] {failure.message}")
                    if on_retry is not None:
                        on_retry(
                            task_id, category, attempt, f"{failure.message}; retry in {delay:g} s"
                        )
                    with span("retry.wait", seconds=delay, **_failed(category)):
                        await self._sleep(delay)
                    continue
                failure = failure.amended(f" (after {network_retries} retries)")
            elif category == Category.RATE_LIMIT_EXCEEDED:
                wait = self._rate_limit_wait(task_id, failure.retry_after)
                if wait is not None:
                    log.warning(
                        f"[RATE LIMIT for TASK:{task_id}] {failure.message}; waiting {wait:g} s"
                    )
                    if on_retry is not None:
                        on_retry(
                            task_id, category, attempt, f"{failure.message}; waited {wait:g} s"
                        )
                    with span("retry.wait", seconds=wait, **_failed(category)):
                        await self._sleep(wait)
                    continue
                failure = failure.amended(
                    "; already waited once within the minute, or asked to wait too long"
                )
            elif recover is not None:
                final = await recover(failure, attempt)
                if final is None:  # the hook fixed the cause (and says so itself): send again
                    continue
                failure = final
            raise ClassifiedError(failure.category, failure.message) from failure.cause

    def _rate_limit_wait(self, task_id: str, retry_after: float | None) -> float | None:
        """The wait for a 429, or None: waited within the window already, or asked too much."""
        now = self._clock()
        last = self._last_rate_wait.get(task_id)
        if last is not None and now - last < self.policy.rate_limit_window_seconds:
            return None
        wait = self.policy.default_retry_after_seconds if retry_after is None else retry_after
        if wait > self.policy.max_retry_after_seconds:
            return None
        self._last_rate_wait[task_id] = now
        return wait
