"""What happened to documents, appended: failure events (every classification) and history.

``failure_events`` holds one row per classified failure — each request the retry policy retried or
waited out, and each document's final failure — for reports and the failure chain of a task.
``document_history`` holds what people and the pipeline did to a document: reviews, overrides,
dead letter, requeue.
"""

from __future__ import annotations

import sqlalchemy as sa

from ai_pipeline.failures import Category
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import FailureEvent, HistoryEntry
from ai_pipeline.store.tables import failure_events, history


class Events:
    def __init__(self, db: Database):
        self.db = db

    def record_failure(
        self,
        document_id: str,
        category: Category,
        error: str,
        *,
        task_id: str | None = None,
        run_id: str | None = None,
        attempt: int = 1,
    ) -> None:
        insert = sa.insert(failure_events).values(
            at=utcnow(),
            document_id=document_id,
            task_id=task_id,
            run_id=run_id,
            category=category.value,
            layer=category.rule.layer.value,
            attempt=attempt,
            error=error,
        )
        self.db.write(lambda conn: conn.execute(insert))

    def failures(self, document_id: str | None = None) -> list[FailureEvent]:
        """Failure events (all, or of one document), oldest first."""
        query = sa.select(failure_events).order_by(failure_events.c.id)
        if document_id:
            query = query.where(failure_events.c.document_id == document_id)
        return [FailureEvent.from_row(r) for r in self.db.rows(query)]

    def add_history(
        self, document_id: str, event: str, detail: str | None = None, *, task_id: str | None = None
    ) -> None:
        insert = sa.insert(history).values(
            at=utcnow(), document_id=document_id, task_id=task_id, event=event, detail=detail
        )
        self.db.write(lambda conn: conn.execute(insert))

    def history(self, document_id: str) -> list[HistoryEntry]:
        query = (
            sa.select(history).where(history.c.document_id == document_id).order_by(history.c.id)
        )
        return [HistoryEntry.from_row(r) for r in self.db.rows(query)]
