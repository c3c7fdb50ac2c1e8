"""Progress of long work: documents done / failed / pending, the rate and the time left.

Plain data in, one line out; how the line is shown (rewritten in place on a terminal, printed now
and then otherwise, not at all with ``--json``) is the command line's business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ai_pipeline.states import State

FAILED_STATES = (State.FAILED, State.DEAD_LETTER, State.CANCELLED)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


@dataclass
class Progress:
    """The progress of ``total`` documents; the rate counts only what ended since it started."""

    total: int
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    _ended_at_start: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def line(self, counts: Mapping[State, int]) -> str:
        done = counts.get(State.COMPLETED, 0)
        failed = sum(counts.get(s, 0) for s in FAILED_STATES)
        pending = max(self.total - done - failed, 0)
        ended = done + failed
        if self._ended_at_start is None:
            self._ended_at_start = ended
        elapsed = self.clock() - self.started
        rate = (ended - self._ended_at_start) / elapsed if elapsed > 0 else 0.0
        text = f"{done}/{self.total} done, {failed} failed, {pending} pending"
        if rate > 0:
            text += f" · {rate:.1f} docs/s"
            if pending:
                text += f" · ETA {_duration(pending / rate)}"
        return text


@dataclass
class Pace:
    """How long to wait before looking again at ``total`` documents being worked on: ``longest``
    while the end is far, shorter as it nears — a quarter of the time left at the rate seen so
    far, down to ``shortest`` — so a waiting command notices the last document within a fraction
    of a second without asking the database several times a second for the whole batch."""

    total: int
    longest: float = 1.0
    shortest: float = 0.2
    clock: Callable[[], float] = time.monotonic
    _first: tuple[float, int] | None = field(init=False, default=None)
    _left: int | None = field(init=False, default=None)
    _rate: float = field(init=False, default=0.0)

    def saw(self, counts: Mapping[State, int]) -> None:
        """What the documents stand at now."""
        ended = counts.get(State.COMPLETED, 0) + sum(counts.get(s, 0) for s in FAILED_STATES)
        now = self.clock()
        if self._first is None:
            self._first = (now, ended)
        began, ended_then = self._first
        if now > began:
            self._rate = (ended - ended_then) / (now - began)
        self._left = max(self.total - ended, 0)

    def next_wait(self) -> float:
        if self._left is None or self._rate <= 0:
            return self.longest
        return min(self.longest, max(self.shortest, self._left / self._rate / 4))
