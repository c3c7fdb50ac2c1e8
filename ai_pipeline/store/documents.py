"""Documents and their sources: registration, state along the state machine, and listings.

A document is registered once per content id; each further file with that content only adds an
alias in ``document_sources``. Its state moves only along ``ai_pipeline.states``: ``transition`` is a
compare-and-set, so two writers cannot both move a document out of the same state. Listings return
:class:`DocumentRow` (no text); only ``load`` reads a document's text.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from ai_pipeline.documents import Document, RejectedFile
from ai_pipeline.failures import Category
from ai_pipeline.states import State, check_transition
from ai_pipeline.store.database import Database
from ai_pipeline.store.rows import DocumentRow, StoredDocument
from ai_pipeline.store.tables import document_sources, documents

_ROW_COLUMNS = [c for c in documents.columns if c.name != "text"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Documents:
    def __init__(self, db: Database):
        self.db = db

    def register(self, doc: Document | RejectedFile) -> bool:
        """Record a document and the file name it came under; True when the document is new.

        A second file with the same content only adds an alias: the document is not analysed again.
        """
        now = utcnow()
        rejected = doc if isinstance(doc, RejectedFile) else None
        row = {
            "document_id": doc.document_id,
            "source": doc.source,
            "kind": doc.kind,
            "size_bytes": doc.size_bytes,
            "text": doc.text if isinstance(doc, Document) else None,
            "rejected_reason": rejected.reason if rejected else None,
            "state": State.PENDING.value,
            "attempts": 0,
            "rejected_by_reviewer": False,
            "created_at": now,
            "updated_at": now,
        }
        with self.db.begin() as conn:
            inserted = conn.execute(
                self.db.insert(documents).values(row).on_conflict_do_nothing()
            ).rowcount
            conn.execute(
                self.db.insert(document_sources)
                .values(document_id=doc.document_id, source=doc.source, first_seen_at=now)
                .on_conflict_do_nothing()
            )
        return bool(inserted)

    def get(self, document_id: str) -> DocumentRow | None:
        with self.db.connect() as conn:
            row = conn.execute(
                sa.select(*_ROW_COLUMNS).where(documents.c.document_id == document_id)
            ).first()
        return DocumentRow.from_row(row) if row else None

    def load(self, document_id: str) -> StoredDocument | None:
        """The document with its text (the only read of a text)."""
        with self.db.connect() as conn:
            row = conn.execute(
                sa.select(documents).where(documents.c.document_id == document_id)
            ).first()
        return StoredDocument.from_row(row) if row else None

    def rows(self, document_ids: Iterable[str] | None = None) -> list[DocumentRow]:
        """Documents (all, or these) in registration order, without their texts."""
        query = sa.select(*_ROW_COLUMNS).order_by(documents.c.created_at, documents.c.document_id)
        if document_ids is None:
            with self.db.connect() as conn:
                return [DocumentRow.from_row(r) for r in conn.execute(query)]
        rows = self.db.select_in(query, documents.c.document_id, document_ids)
        return sorted(map(DocumentRow.from_row, rows), key=lambda d: (d.created_at, d.document_id))

    def sources(self, document_ids: Iterable[str] | None = None) -> dict[str, list[str]]:
        """Every file name each document arrived under, first seen first."""
        query = sa.select(document_sources).order_by(
            document_sources.c.first_seen_at, document_sources.c.source
        )
        if document_ids is None:
            with self.db.connect() as conn:
                rows = list(conn.execute(query))
        else:
            rows = self.db.select_in(query, document_sources.c.document_id, document_ids)
            # Each chunk comes back in order; together they must be ordered again.
            rows.sort(key=lambda r: (r.first_seen_at, r.source))
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r.document_id, []).append(r.source)
        return out

    def known_sources(self, sources: Iterable[str]) -> set[str]:
        """Which of these file paths have been registered before (under any content)."""
        query = sa.select(document_sources.c.source)
        return {r.source for r in self.db.select_in(query, document_sources.c.source, sources)}

    def transition(
        self,
        document_id: str,
        target: State,
        *,
        category: Category | None = None,
        error: str | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
        count_attempt: bool = False,
        reset_attempts: bool = False,
    ) -> State:
        """Move a document to ``target`` if the state machine allows it; returns the old state.

        The update is a compare-and-set on the state read, so two writers cannot both move a
        document out of the same state.
        """
        with self.db.begin() as conn:
            row = conn.execute(
                sa.select(documents.c.state).where(documents.c.document_id == document_id)
            ).first()
            if row is None:
                raise KeyError(f"unknown document {document_id}")
            current = State(row.state)
            check_transition(document_id, current, target)
            values: dict[str, Any] = {"state": target.value, "updated_at": utcnow()}
            if target == State.COMPLETED:
                values.update(category=None, last_error=None)
            if category is not None:
                values["category"] = category.value
            if error is not None:
                values["last_error"] = error
            if task_id is not None:
                values["task_id"] = task_id
            if run_id is not None:
                values["run_id"] = run_id
            if count_attempt:
                values["attempts"] = documents.c.attempts + 1
            if reset_attempts:
                values["attempts"] = 0
            updated = conn.execute(
                sa.update(documents)
                .where(documents.c.document_id == document_id)
                .where(documents.c.state == current.value)
                .values(values)
            ).rowcount
            if not updated:
                raise RuntimeError(f"document {document_id} changed state concurrently")
        return current

    def mark_rejected(self, document_id: str, message: str) -> None:
        """A reviewer rejected the document: it is settled, and ``message`` says why."""
        with self.db.begin() as conn:
            updated = conn.execute(
                sa.update(documents)
                .where(documents.c.document_id == document_id)
                .values(rejected_by_reviewer=True, status_message=message, updated_at=utcnow())
            ).rowcount
        if not updated:
            raise KeyError(f"unknown document {document_id}")
