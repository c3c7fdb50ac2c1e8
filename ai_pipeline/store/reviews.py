"""What needs a person: the review queue, reviewers' overrides, quarantined outputs, the outbox.

A document that fails in a way only a person can settle gets one review item (a later failure of
it updates the same item). A reviewer's decision moves the item from OPEN to APPROVED or REJECTED;
an approved document that then completes moves it to RESOLVED; a cancelled task closes its open or
approved item (CANCELLED). The flows that use these tables —
approve, reject, resolve — are in ``ai_pipeline.review``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ai_pipeline.failures import Category
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import (
    Decision,
    InputSnapshot,
    Override,
    QuarantinedOutput,
    ReviewItem,
    ReviewStatus,
    SubmitterMessage,
)
from ai_pipeline.store.tables import outbox, overrides, quarantine, review_queue

# Built once: a run looks a document's review item up as it settles each document.
_ONE = sa.select(review_queue).where(review_queue.c.document_id == sa.bindparam("document_id"))


class Reviews:
    def __init__(self, db: Database):
        self.db = db

    def _execute(self, statement: Any) -> int:
        """Run one write statement; returns the rows it touched."""
        return int(self.db.write(lambda conn: conn.execute(statement).rowcount))

    # --- the queue ---------------------------------------------------------------------------

    def open(
        self,
        document_id: str,
        category: Category,
        error: str,
        snapshot: InputSnapshot,
        *,
        task_id: str | None = None,
    ) -> None:
        """Put a document in front of a person; a later failure of it updates the same item."""
        now = utcnow()
        row = {
            "document_id": document_id,
            "task_id": task_id,
            "category": category.value,
            "error": error,
            "snapshot": snapshot.as_dict(),
            "status": ReviewStatus.OPEN.value,
            "decision": None,
            "decided_by": None,
            "note": None,
            "created_at": now,
            "updated_at": now,
        }
        stmt = self.db.insert(review_queue).values(row)
        self._execute(
            stmt.on_conflict_do_update(
                index_elements=["document_id"],
                set_={k: stmt.excluded[k] for k in row if k not in ("document_id", "created_at")},
            )
        )

    def items(self, status: ReviewStatus | None = ReviewStatus.OPEN) -> list[ReviewItem]:
        """Items in this status (all when None), oldest first."""
        query = sa.select(review_queue).order_by(review_queue.c.created_at)
        if status is not None:
            query = query.where(review_queue.c.status == status.value)
        return [ReviewItem.from_row(r) for r in self.db.rows(query)]

    def get(self, document_id: str) -> ReviewItem | None:
        rows = self.db.rows(_ONE, {"document_id": document_id})
        return ReviewItem.from_row(rows[0]) if rows else None

    def decide(
        self,
        document_id: str,
        *,
        status: ReviewStatus,
        decision: Decision,
        decided_by: str,
        note: str | None,
    ) -> None:
        """Record a reviewer's decision on an open item (only an open item can be decided)."""
        updated = self._execute(
            sa.update(review_queue)
            .where(review_queue.c.document_id == document_id)
            .where(review_queue.c.status == ReviewStatus.OPEN.value)
            .values(
                status=status.value,
                decision=decision.value,
                decided_by=decided_by,
                note=note,
                updated_at=utcnow(),
            )
        )
        if not updated:
            raise KeyError(f"no open review item for document {document_id}")

    def resolve(self, document_id: str) -> bool:
        """An approved item whose document then completed is resolved; True if one was."""
        return bool(
            self._execute(
                sa.update(review_queue)
                .where(review_queue.c.document_id == document_id)
                .where(review_queue.c.status == ReviewStatus.APPROVED.value)
                .values(status=ReviewStatus.RESOLVED.value, updated_at=utcnow())
            )
        )

    def cancel(self, document_id: str) -> bool:
        """The document's task was cancelled: an item still open, or approved and not yet run
        again, is closed (nothing left to decide or re-submit); True if one was."""
        return bool(
            self._execute(
                sa.update(review_queue)
                .where(review_queue.c.document_id == document_id)
                .where(
                    review_queue.c.status.in_(
                        [ReviewStatus.OPEN.value, ReviewStatus.APPROVED.value]
                    )
                )
                .values(status=ReviewStatus.CANCELLED.value, updated_at=utcnow())
            )
        )

    # --- overrides ---------------------------------------------------------------------------

    def add_override(
        self, task_id: str, document_id: str, decided_by: str, note: str | None
    ) -> None:
        self._execute(
            self.db.insert(overrides)
            .values(
                task_id=task_id,
                document_id=document_id,
                decided_by=decided_by,
                note=note,
                at=utcnow(),
            )
            .on_conflict_do_nothing()
        )

    def override(self, task_id: str) -> Override | None:
        """The reviewer's acceptance of this task's stored output, if there is one."""
        rows = self.db.rows(sa.select(overrides).where(overrides.c.task_id == task_id))
        return Override.from_row(rows[0]) if rows else None

    # --- quarantine --------------------------------------------------------------------------

    def quarantine(self, document_id: str, task_id: str, output: str, reason: str) -> None:
        self._execute(
            self.db.insert(quarantine)
            .values(
                task_id=task_id, document_id=document_id, output=output, reason=reason, at=utcnow()
            )
            .on_conflict_do_nothing()
        )

    def quarantined(self, document_id: str | None = None) -> list[QuarantinedOutput]:
        query = sa.select(quarantine).order_by(quarantine.c.at)
        if document_id:
            query = query.where(quarantine.c.document_id == document_id)
        return [QuarantinedOutput.from_row(r) for r in self.db.rows(query)]

    # --- the outbox --------------------------------------------------------------------------

    def add_message(
        self, document_id: str, source: str, reason: str, message_zh: str, message_en: str
    ) -> None:
        self._execute(
            sa.insert(outbox).values(
                at=utcnow(),
                document_id=document_id,
                source=source,
                reason=reason,
                message_zh=message_zh,
                message_en=message_en,
            )
        )

    def messages(self, document_id: str | None = None) -> list[SubmitterMessage]:
        query = sa.select(outbox).order_by(outbox.c.id)
        if document_id:
            query = query.where(outbox.c.document_id == document_id)
        return [SubmitterMessage.from_row(r) for r in self.db.rows(query)]
