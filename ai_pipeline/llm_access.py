"""What lets an LLM client send: the API key in use and where a fresh one comes from, the shared
limit on requests per minute that keeps a run from causing 429s in the first place, the optional
global cap on calls in flight across every run and host (``GlobalCap``, its slots held in the
results database), and the budget each request reserves from (``Meter``) with what it is settled
by: the completion limit the request carried and the billed details of the reply's usage.

The client (``ai_pipeline.llm``) decides when to refresh the key (after a 401/403), takes a place
from the limiter, a slot of the cap and a reservation from the meter before each request; nothing
here sends anything.
"""

from __future__ import annotations

import asyncio
import os
import random
import shlex
import subprocess
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from ai_pipeline.processes import ProcessRef, current
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

    @property
    def source(self) -> str:
        """Where the key is read from, as a person fixes it (never the key)."""
        if self.key_file:
            return f"the key file {self.key_file}"
        if self.key_command:
            return "the key command"
        return f"${self.key_env}"

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


class CallSlots(Protocol):
    """Where the slots of the global cap are held (``ai_pipeline.store.slots.CallSlots``)."""

    def take(
        self, size: int, holder: str, seconds: float, process: ProcessRef | None = ...
    ) -> int | None: ...

    def renew(self, slot: int, holder: str, seconds: float) -> bool: ...

    def release(self, slot: int, holder: str) -> bool: ...


class GlobalCap:
    """At most ``size`` calls in flight across every process whose ``slots`` are the same (one
    results database): a call holds a slot (``hold``) from before its request goes out until its
    reply, its failure or its cancellation is in.

    Waiting never blocks the event loop. The calls of one cap (one run) wait in line, and only
    the first polls — one read of the slots while none is free — with asyncio sleeps backing off
    from ``FIRST_POLL`` to ``LAST_POLL`` seconds, jittered so that processes do not poll in step;
    a slot this cap gives back wakes it at once. Each statement is one short one on the loop, as
    the meter's are. A slot is held for ``lease_seconds`` and renewed every third of that while
    its request lasts; the slot of a holder that died comes back when its lease expires.
    """

    FIRST_POLL = 0.01
    LAST_POLL = 0.25

    def __init__(
        self,
        slots: CallSlots,
        size: int,
        *,
        lease_seconds: float = 60.0,
        process: ProcessRef | None = None,
    ):
        self.slots = slots
        self.size = size
        self.lease_seconds = lease_seconds
        self.process = process or current()
        self._line = asyncio.Lock()
        self._freed = asyncio.Event()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[int]:
        """A slot of the cap, held for the ``async with`` block; yields its number."""
        holder = uuid.uuid4().hex
        async with self._line:
            delay = self.FIRST_POLL
            while (
                slot := self.slots.take(self.size, holder, self.lease_seconds, self.process)
            ) is None:
                self._freed.clear()
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, self.LAST_POLL)
        # From the take on, nothing suspends before the try: a cancellation releases the slot.
        renewal = _Renewal(
            lambda: self.slots.renew(slot, holder, self.lease_seconds), self.lease_seconds / 3
        )
        try:
            yield slot
        finally:
            renewal.cancel()
            # A database away for longer than its retries: the slot expires on its own.
            with suppress(Exception):
                self.slots.release(slot, holder)
            self._freed.set()


class _Renewal:
    """Calls ``renew`` every ``every`` seconds on the running loop until cancelled."""

    def __init__(self, renew: Callable[[], object], every: float):
        self._renew = renew
        self._every = every
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(every, self._run)

    def _run(self) -> None:
        with suppress(Exception):  # the next renewal tries again; the lease covers two misses
            self._renew()
        self._handle = self._loop.call_later(self._every, self._run)

    def cancel(self) -> None:
        self._handle.cancel()


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
