"""Call slots: the global cap on LLM calls in flight, held in the results database.

With ``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY`` = N, every request to the LLM endpoint — from any run,
process or host sharing the results database — holds one of N slots while it is out: the rows
0 … N-1 of ``llm_call_slots`` (made by the first caller that needs them). A slot is taken by a
compare-and-set on what the caller saw of it::

    UPDATE llm_call_slots SET holder = :me, expires_at = :until, process = :process
    WHERE slot = :slot AND <still as seen: free, expired, or held by a process known dead>

One row changed means the slot is the caller's; none, another caller got it first. The holder
gives it back when its request is answered, fails or is cancelled (``release``) and pushes its
expiry while the request lasts (``renew``). A slot whose holder died without giving it back is free
once its lease expires — at once when the holder's process is known to be gone on this machine
(``ai_pipeline.processes``), as a lease's is (``ai_pipeline.store.leases``). Expiry is judged by
this process's UTC clock, so the machines sharing a results database keep their clocks in step.

Looking for a free slot is one read of the N rows; only a slot seen free is written. Waiting for
one is the client's (``ai_pipeline.llm_access.GlobalCap``). Processes configured with different
N use the first N slots each: the cap is then the largest of them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.processes import ProcessRef, gone
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import aware
from ai_pipeline.store.tables import llm_call_slots as slots

# How often at most a process looks at the processes holding the slots (a /proc read for each
# held on this machine) to free those of dead ones before their leases expire.
DEAD_CHECK_SECONDS = 2.0
# Slots seen free that one ``take`` tries before it says none is to be had (the caller polls
# again): a few, so that a lost race costs one more statement, not N.
TRIES = 3


@dataclass(frozen=True)
class Slot:
    """One slot as stored: its number, its holder (None: free), the holder's lease and process."""

    slot: int
    holder: str | None
    expires_at: datetime | None
    process: ProcessRef | None

    def expired(self, now: datetime) -> bool:
        return self.holder is not None and self.expires_at is not None and self.expires_at < now


class CallSlots:
    """The slots of the global cap in one results database (see the module docstring)."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.monotonic):
        self.db = db
        self._clock = clock
        self._dead_checked_at: float | None = None

    def take(
        self, size: int, holder: str, seconds: float, process: ProcessRef | None = None
    ) -> int | None:
        """One of the first ``size`` slots, taken for ``holder`` in ``process`` for ``seconds``;
        None when every one is held."""
        seen = self.of(size)
        if len(seen) < size:
            self._make(size)
            seen = self.of(size)
        now = utcnow()
        free = [s for s in seen if s.holder is None or s.expired(now)]
        if not free and self._dead_check_due():
            free = [s for s in seen if gone(s.process)]
        random.shuffle(free)  # callers seeing the same free slots mostly try different ones
        until = now + timedelta(seconds=seconds)
        for seen_slot in free[:TRIES]:
            if self._swap(seen_slot, now, holder, until, process):
                return seen_slot.slot
        return None

    def renew(self, slot: int, holder: str, seconds: float) -> bool:
        """Push the expiry of a slot the holder holds; False when it is not the holder's any more
        (its lease expired and another caller took it)."""
        until = utcnow() + timedelta(seconds=seconds)
        return self._update(slot, holder, expires_at=until)

    def release(self, slot: int, holder: str) -> bool:
        """Give a slot back (only its holder can); True if it was held."""
        return self._update(slot, holder, holder=None, expires_at=None, process=None)

    def of(self, size: int) -> list[Slot]:
        """The first ``size`` slots as stored, held or free."""
        rows = self.db.rows(sa.select(slots).where(slots.c.slot < size).order_by(slots.c.slot))
        return [
            Slot(
                r.slot,
                r.holder,
                aware(r.expires_at) if r.expires_at is not None else None,
                ProcessRef.parse(r.process),
            )
            for r in rows
        ]

    def _make(self, size: int) -> None:
        stmt = self.db.insert(slots).values([{"slot": n} for n in range(size)])
        stmt = stmt.on_conflict_do_nothing(index_elements=["slot"])
        self.db.write(lambda conn: conn.execute(stmt))

    def _dead_check_due(self) -> bool:
        now = self._clock()
        if self._dead_checked_at is not None and now - self._dead_checked_at < DEAD_CHECK_SECONDS:
            return False
        self._dead_checked_at = now
        return True

    def _swap(
        self,
        seen: Slot,
        now: datetime,
        holder: str,
        until: datetime,
        process: ProcessRef | None,
    ) -> bool:
        """Take a slot if it is still as ``seen``: free, or held by the same holder — whose lease
        has expired, unless its process was found dead (a dead holder renews nothing)."""
        still: sa.ColumnElement[bool]
        if seen.holder is None:
            still = slots.c.holder.is_(None)
        else:
            still = slots.c.holder == seen.holder
            if seen.expired(now):
                still &= slots.c.expires_at < now
        stmt = (
            sa.update(slots)
            .where(slots.c.slot == seen.slot)
            .where(still)
            .values(holder=holder, expires_at=until, process=process.text() if process else None)
        )

        def swap(conn: Connection) -> bool:
            return bool(conn.execute(stmt).rowcount)

        return self.db.write(swap)

    def _update(self, slot: int, held_by: str, **values: object) -> bool:
        stmt = (
            sa.update(slots)
            .where(slots.c.slot == slot)
            .where(slots.c.holder == held_by)
            .values(**values)
        )
        return self.db.write(lambda conn: bool(conn.execute(stmt).rowcount))
