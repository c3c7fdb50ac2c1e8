"""One run's claims on the documents it works on: taken before any external call, renewed while it
works, given up when the document is settled (the leases themselves: ``ai_pipeline.store.leases``).

When a run meets a document another live run holds, it does not call: it waits (up to
``wait_seconds``, asking again every ``poll_seconds``) for the holder to finish — then the document
is taken and re-reported from its checkpoints, with no new call — and otherwise leaves the
document to its holder, "in progress elsewhere", which is not a failure. A claim whose owner is
known dead — its process gone on this machine (``ai_pipeline.processes``), or its run over as
``owner_over`` says (Dagster's run status, given by the Dagster wiring) — is taken over at once;
one whose owner died unseen expires after ``lease_seconds`` and is taken over by the next run
that asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from ai_pipeline.processes import current, gone
from ai_pipeline.retry import Log
from ai_pipeline.store import Store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.leases import Lease

DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 600.0


def owner_id(run_id: str | None) -> str:
    """Who holds a claim: the Dagster run, or this process when there is none."""
    return run_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"[:64]


class Claims:
    def __init__(
        self,
        store: Store,
        owner: str,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        poll_seconds: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        owner_over: Callable[[str], bool] | None = None,
    ):
        self.store = store
        self.owner = owner
        self.process = current()
        # Whether the run a claim's owner names is over (None: nothing knows runs here).
        self.owner_over = owner_over
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds or min(2.0, max(lease_seconds / 10, 0.2))
        self._sleep = sleep
        self._clock = clock
        self.held: set[str] = set()

    async def take(
        self,
        task_id: str,
        document_id: str,
        log: Log,
        *,
        waiting: Callable[[], contextlib.AbstractAsyncContextManager[object]] | None = None,
    ) -> str | None:
        """Claim a task; None once it is ours, else the run that still holds it after the wait.

        ``waiting`` wraps each pause between two asks: the batch's document window, stepped out
        of, so that a document waiting for another run takes no place from the ones that can go.
        """
        deadline = self._clock() + self.wait_seconds
        announced = False
        while True:
            leases = self.store.leases
            if leases.claim(task_id, document_id, self.owner, self.lease_seconds, self.process):
                self.held.add(task_id)
                return None
            lease = leases.holder(task_id)
            dead = self._dead(lease) if lease is not None else None
            if lease is not None and dead is not None:
                if leases.take_over(
                    task_id, self.owner, lease.owner, self.lease_seconds, self.process
                ):
                    self.held.add(task_id)
                    log.info(f"taken over from run {lease.owner}: {dead}")
                    return None
                continue  # another run took it over first, or it was released: ask again
            holder = lease.owner if lease is not None else "another run"
            left = deadline - self._clock()
            if left <= 0:
                log.warning(f"still in progress in run {holder}; left to it (not failed)")
                return holder
            if not announced:
                log.info(f"in progress in run {holder}; waiting up to {left:.0f} s for it")
                announced = True
            async with waiting() if waiting is not None else contextlib.nullcontext():
                await self._sleep(min(self.poll_seconds, left))

    def _dead(self, lease: Lease) -> str | None:
        """Why the owner of a claim is known dead, or None while it may be alive."""
        if lease.owner == self.owner:
            return None
        if gone(lease.process):
            return "its process has ended"
        if self.owner_over is not None:
            try:
                if self.owner_over(lease.owner):
                    return "its run is over"
            except Exception:  # Dagster's storage is away: the claim's expiry still decides
                return None
        return None

    def release(self, task_id: str) -> None:
        """Give a claim up; when the database is gone it simply expires."""
        self.held.discard(task_id)
        with contextlib.suppress(StoreUnavailable):
            self.store.leases.release(task_id, self.owner)

    def renew(self) -> int:
        """Push the expiry of every claim held; returns how many are still ours."""
        held = sorted(self.held)
        return self.store.leases.renew(self.owner, held, self.lease_seconds) if held else 0

    async def keep_renewing(self, log: Log) -> None:
        """Renew every claim a third of a lease apart, until cancelled."""
        while True:
            await self._sleep(self.lease_seconds / 3)
            held = len(self.held)
            try:
                renewed = self.renew()
            except StoreUnavailable as e:
                log.warning(f"could not renew this run's claims: {e.message}")
                continue
            if renewed < held:
                log.warning(
                    f"{held - renewed} of this run's {held} claims were taken over by other runs "
                    "(they expired: was the database away for long?)"
                )
