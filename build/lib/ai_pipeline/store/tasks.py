"""Tasks submitted over HTTP: which tenant each belongs to, in the order they came.

A task is a document's analysis (its task id is the document's ``analyse`` task id); the document
is the tenant's own (its id covers the tenant as well as the content, ``ai_pipeline.service``), so
two tenants submitting the same content get two tasks and never share a state. Registering the
document, its task and (for a binary file such as a PDF, whose text is not the original) the
uploaded bytes is one transaction: an upload is either wholly recorded or not at all. Each tenant's
requests are counted here too, per clock minute, so that its limit holds across web processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.documents import Document
from ai_pipeline.states import State
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import Documents, utcnow
from ai_pipeline.store.rows import aware
from ai_pipeline.store.tables import documents, tenant_requests, tenant_tasks, tenant_uploads


@dataclass(frozen=True)
class TenantTask:
    seq: int
    task_id: str
    tenant_id: str
    document_id: str
    name: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: sa.Row[tuple[object, ...]]) -> TenantTask:
        return cls(
            seq=int(row.seq),
            task_id=str(row.task_id),
            tenant_id=str(row.tenant_id),
            document_id=str(row.document_id),
            name=str(row.name),
            created_at=aware(row.created_at),
        )


class TenantTasks:
    def __init__(self, db: Database, docs: Documents):
        self.db = db
        self.docs = docs

    def submit(
        self,
        tenant_id: str,
        task_id: str,
        doc: Document,
        name: str,
        original: bytes | None = None,
    ) -> tuple[TenantTask, bool]:
        """Record the tenant's document and its task (and ``original``, the uploaded bytes, when
        given); the task already there (and False) when this tenant submitted the same content
        before. Concurrent submissions of one content make one task: the insert that loses the
        race finds the winner's row."""

        def record(conn: Connection) -> bool:
            self.docs.register_in(conn, [doc])
            if original is not None:
                conn.execute(
                    self.db.insert(tenant_uploads)
                    .values(document_id=doc.document_id, data=original)
                    .on_conflict_do_nothing()
                )
            inserted = conn.execute(
                self.db.insert(tenant_tasks)
                .values(
                    task_id=task_id,
                    tenant_id=tenant_id,
                    document_id=doc.document_id,
                    name=name,
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing()
            ).rowcount
            return bool(inserted)

        created = self.db.write(record)
        task = self.by_task_id(task_id)
        assert task is not None and task.tenant_id == tenant_id
        return task, created

    def original(self, document_id: str) -> bytes | None:
        """The uploaded bytes of a submitted document, when they were kept (a PDF's)."""
        rows = self.db.rows(
            sa.select(tenant_uploads.c.data).where(tenant_uploads.c.document_id == document_id)
        )
        return bytes(rows[0].data) if rows else None

    def has_original(self, document_id: str) -> bool:
        """Whether the uploaded bytes of a submitted document were kept (without reading them)."""
        query = sa.select(tenant_uploads.c.document_id).where(
            tenant_uploads.c.document_id == document_id
        )
        return bool(self.db.rows(query))

    def count_request(self, tenant_id: str, now: datetime | None = None) -> int:
        """Count one request of the tenant in the current clock minute (UTC) and return how many
        it has made in that minute, this one included. One ``INSERT … ON CONFLICT DO UPDATE SET
        count = count + 1 RETURNING count``: concurrent requests, in any process, each get their
        own number and none is lost."""
        minute = int((now or datetime.now(timezone.utc)).timestamp() // 60)
        row = tenant_requests.c
        insert = self.db.insert(tenant_requests).values(tenant_id=tenant_id, minute=minute, count=1)
        upsert = insert.on_conflict_do_update(
            index_elements=[row.tenant_id, row.minute], set_={"count": row.count + 1}
        ).returning(row.count)

        def count(conn: Connection) -> int:
            made = int(conn.execute(upsert).scalar_one())
            if made == 1:  # the tenant's first request this minute: forget the minutes before
                conn.execute(
                    sa.delete(tenant_requests).where(
                        row.tenant_id == tenant_id, row.minute < minute
                    )
                )
            return made

        return self.db.write(count)

    def by_task_id(self, task_id: str) -> TenantTask | None:
        rows = self.db.rows(sa.select(tenant_tasks).where(tenant_tasks.c.task_id == task_id))
        return TenantTask.from_row(rows[0]) if rows else None

    def get(self, tenant_id: str, task_id: str) -> TenantTask | None:
        """The tenant's task; None for an unknown id and for another tenant's, alike."""
        task = self.by_task_id(task_id)
        return task if task is not None and task.tenant_id == tenant_id else None

    def listing(
        self, tenant_id: str, states: Iterable[State] | None, limit: int, offset: int
    ) -> tuple[list[TenantTask], int]:
        """A page of the tenant's tasks (newest first), in these states, and how many there are."""
        where = [tenant_tasks.c.tenant_id == tenant_id]
        if states is not None:
            where.append(documents.c.state.in_([s.value for s in states]))
        joined = tenant_tasks.join(documents, documents.c.document_id == tenant_tasks.c.document_id)
        page = (
            sa.select(tenant_tasks)
            .select_from(joined)
            .where(*where)
            .order_by(tenant_tasks.c.seq.desc())
            .limit(limit)
            .offset(offset)
        )
        total = sa.select(sa.func.count()).select_from(joined).where(*where)
        return [TenantTask.from_row(r) for r in self.db.rows(page)], int(self.db.rows(total)[0][0])

    def after(self, seq: int, limit: int) -> list[TenantTask]:
        """The tasks submitted after ``seq``, oldest first: what the submissions sensor launches."""
        query = (
            sa.select(tenant_tasks)
            .where(tenant_tasks.c.seq > seq)
            .order_by(tenant_tasks.c.seq)
            .limit(limit)
        )
        return [TenantTask.from_row(r) for r in self.db.rows(query)]
