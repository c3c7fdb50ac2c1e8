"""Leases: one owner per task, across processes and machines.

Before a run works on a document — and so before any external call for it: the LLM analysis, the
completion notice — it takes the lease of the document's analysis task: a row in ``leases`` with
the owning run id and an expiry, taken in one atomic statement on SQLite and PostgreSQL::

    INSERT … ON CONFLICT (task_id) DO UPDATE SET owner = excluded.owner, expires_at = …
        WHERE leases.expires_at < :now OR leases.owner = excluded.owner
    RETURNING owner

A row back means the lease is the caller's (new, renewed, or taken over from an owner that stopped
renewing it); no row means another run holds it. The owner renews its leases while it works and
releases each when the document is settled; a lease whose owner died expires, and the next run
(or ``ai_pipeline.reconcile``) takes the document over. A lease also names its owner's process
(``ai_pipeline.processes``): when that process is known to be gone, or the caller knows the owning
run is over, ``take_over`` moves the lease to a new owner at once, a compare-and-set on the old
owner so that of two runs taking over only one gets it. Expiry is judged by this process's UTC
clock, so the machines sharing a results database must keep their clocks in step (NTP).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.processes import ProcessRef
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import aware
from ai_pipeline.store.tables import leases


@dataclass(frozen=True)
class Lease:
    task_id: str
    document_id: str
    owner: str
    acquired_at: datetime
    expires_at: datetime
    process: ProcessRef | None = None

    def live(self, now: datetime | None = None) -> bool:
        return self.expires_at >= (now or utcnow())


# Built once, as a run takes and releases a lease per document (``ai_pipeline.store.documents``).
_RELEASE = (
    sa.delete(leases)
    .where(leases.c.task_id == sa.bindparam("task_id"))
    .where(leases.c.owner == sa.bindparam("owner"))
)


class Leases:
    def __init__(self, db: Database):
        self.db = db
        # ``claim``'s statement (the module's docstring), the row and the time bound at execution.
        insert = db.insert(leases)
        self._claim = insert.on_conflict_do_update(
            index_elements=["task_id"],
            set_={
                "owner": insert.excluded.owner,
                "document_id": insert.excluded.document_id,
                "expires_at": insert.excluded.expires_at,
                "process": insert.excluded.process,
                "acquired_at": sa.case(
                    (leases.c.owner == insert.excluded.owner, leases.c.acquired_at),
                    else_=insert.excluded.acquired_at,
                ),
            },
            where=(leases.c.expires_at < sa.bindparam("claimed_at"))
            | (leases.c.owner == insert.excluded.owner),
        ).returning(leases.c.owner)

    def claim(
        self,
        task_id: str,
        document_id: str,
        owner: str,
        seconds: float,
        process: ProcessRef | None = None,
    ) -> bool:
        """Take (or renew) the lease of a task for ``seconds``, held by ``owner`` in ``process``;
        False when another owner holds a live one."""
        now = utcnow()
        row = {
            "task_id": task_id,
            "document_id": document_id,
            "owner": owner,
            "acquired_at": now,
            "expires_at": now + timedelta(seconds=seconds),
            "process": process.text() if process else None,
            "claimed_at": now,
        }

        def take(conn: Connection) -> bool:
            return conn.execute(self._claim, row).first() is not None

        return self.db.write_each(take)

    def take_over(
        self,
        task_id: str,
        owner: str,
        dead_owner: str,
        seconds: float,
        process: ProcessRef | None = None,
    ) -> bool:
        """Move the lease of a task from ``dead_owner`` (known to be gone) to ``owner``; False
        when it is not ``dead_owner``'s any more (another run took it over first, or it was
        released)."""
        now = utcnow()

        def take(conn: Connection) -> bool:
            moved = conn.execute(
                sa.update(leases)
                .where(leases.c.task_id == task_id)
                .where(leases.c.owner == dead_owner)
                .values(
                    owner=owner,
                    acquired_at=now,
                    expires_at=now + timedelta(seconds=seconds),
                    process=process.text() if process else None,
                )
            ).rowcount
            return bool(moved)

        return self.db.write_each(take)

    def renew(self, owner: str, task_ids: Iterable[str], seconds: float) -> int:
        """Push the expiry of the owner's leases on these tasks; returns how many it still holds."""
        ids = list(task_ids)
        expires = utcnow() + timedelta(seconds=seconds)

        def push(conn: Connection) -> int:
            renewed = 0
            for i in range(0, len(ids), 500):
                renewed += conn.execute(
                    sa.update(leases)
                    .where(leases.c.owner == owner)
                    .where(leases.c.task_id.in_(ids[i : i + 500]))
                    .values(expires_at=expires)
                ).rowcount
            return renewed

        return self.db.write(push) if ids else 0

    def release(self, task_id: str, owner: str) -> bool:
        """Give a lease up (only its owner can); True if it was held."""

        def drop(conn: Connection) -> bool:
            deleted = conn.execute(_RELEASE, {"task_id": task_id, "owner": owner}).rowcount
            return bool(deleted)

        return self.db.write_each(drop)

    def release_owner(self, owner: str) -> int:
        """Give up every lease of an owner (a run that is over); returns how many there were."""
        return self.db.write_each(
            lambda conn: conn.execute(sa.delete(leases).where(leases.c.owner == owner)).rowcount
        )

    def holder(self, task_id: str) -> Lease | None:
        """The lease of a task, live or expired, if any."""
        rows = self.db.read(
            lambda conn: list(conn.execute(sa.select(leases).where(leases.c.task_id == task_id)))
        )
        return _lease(rows[0]) if rows else None

    def of_documents(self, document_ids: Iterable[str]) -> dict[str, list[Lease]]:
        """The leases (live or expired) of these documents' tasks."""
        out: dict[str, list[Lease]] = {}
        for row in self.db.select_in(sa.select(leases), leases.c.document_id, document_ids):
            out.setdefault(row.document_id, []).append(_lease(row))
        return out


def _lease(row: sa.Row) -> Lease:  # type: ignore[type-arg]
    return Lease(
        row.task_id,
        row.document_id,
        row.owner,
        aware(row.acquired_at),
        aware(row.expires_at),
        ProcessRef.parse(row.process),
    )
