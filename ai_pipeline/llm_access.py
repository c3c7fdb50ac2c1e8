"""What lets an LLM client send: the API key in use and where a fresh one comes from, the shared
limit on requests per minute that keeps a run from causing 429s in the first place, and the budget
each request reserves from (``Meter``) with what it is settled by: the completion limit the request
carried and the billed details of the reply's usage.

The client (``ai_pipeline.llm``) decides when to refresh the key (after a 401/403), takes a place
from the limiter and a reservation from the meter before each request; nothing here sends anything.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ai_pipeline.redaction import register_secret


class Credentials:
    """The API key in use, and where a fresh one comes from when the endpoint refuses it.

    The source is, in order: a file (``key_file``: its stripped content), a command
    (``key_command``: its stripped standard output), or the environment variable ``key_env`` read
    again. Every key read is registered for redaction.
    """

    def __init__(
        self,
        key: str,
        *,
        key_file: str | None = None,
        key_command: str | None = None,
        key_env: str = "OPENAI_API_KEY",
    ):
        self.key = key
        self.generation = 0
        self.key_file = key_file
        self.key_command = key_command
        self.key_env = key_env
        self._lock = asyncio.Lock()
        register_secret(key)

    def read_source(self) -> str | None:
        if self.key_file:
            return Path(self.key_file).read_text("utf-8").strip() or None
        if self.key_command:
            out = subprocess.run(
                shlex.split(self.key_command), capture_output=True, text=True, timeout=30
            )
            return out.stdout.strip() if out.returncode == 0 else None
        return os.environ.get(self.key_env) or None

    async def refresh(self, seen_generation: int) -> bool:
        """Get a fresh key unless another call already did; False when no new key is to be had."""
        async with self._lock:
            if self.generation != seen_generation:
                return True
            try:
                fresh = await asyncio.to_thread(self.read_source)
            except (OSError, subprocess.SubprocessError):
                return False
            if not fresh or fresh == self.key:
                return False
            register_secret(fresh)
            self.key = fresh
            self.generation += 1
            return True


class RateLimiter:
    """At most ``per_minute`` requests in any rolling minute (None: no limit)."""

    def __init__(
        self,
        per_minute: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.per_minute = per_minute
        self._clock = clock
        self._sleep = sleep
        self._sent: deque[float] = deque()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if not self.per_minute:
            return
        async with self._lock:
            while True:
                now = self._clock()
                while self._sent and now - self._sent[0] >= 60.0:
                    self._sent.popleft()
                if len(self._sent) < self.per_minute:
                    self._sent.append(now)
                    return
                await self._sleep(60.0 - (now - self._sent[0]))


class Meter(Protocol):
    """What a client reports its spending to (``ai_pipeline.spend.Meter``): a reservation before
    each request (raising ClassifiedError when none can be had), its usage after it, and the
    completion limit a request must carry (None: none)."""

    @property
    def max_completion_tokens(self) -> int | None: ...

    def reserve(
        self,
        task_id: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        completion_tokens: int | None = ...,
        response_format: Mapping[str, Any] | None = ...,
    ) -> Any: ...

    def settle(
        self,
        reservation: Any,
        *,
        outcome: str = ...,
        model: str | None = ...,
        prompt_tokens: int | None = ...,
        completion_tokens: int | None = ...,
        usage_reported: bool = ...,
        cached_tokens: int | None = ...,
        reasoning_tokens: int | None = ...,
    ) -> Any: ...


def billed_details(usage: Any) -> tuple[int | None, int | None]:
    """The cached prompt tokens and the reasoning tokens of a reply's ``usage``
    (``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``);
    None for each the endpoint does not report (many OpenAI-compatible servers omit both)."""

    def count(details: Any, name: str) -> int | None:
        value = getattr(details, name, None) if details is not None else None
        return value if isinstance(value, int) else None

    if usage is None:
        return None, None
    return (
        count(getattr(usage, "prompt_tokens_details", None), "cached_tokens"),
        count(getattr(usage, "completion_tokens_details", None), "reasoning_tokens"),
    )


def limit_of(parameters: Mapping[str, Any]) -> int | None:
    """The completion limit a request carries, under whichever name it sends it."""
    limit = parameters.get("max_completion_tokens", parameters.get("max_tokens"))
    return limit if isinstance(limit, int) else None
