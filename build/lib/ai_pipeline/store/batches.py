"""Batches: named sets of documents submitted together; the batch id is derived from their ids."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import Batch
from ai_pipeline.store.tables import batches


class Batches:
    def __init__(self, db: Database):
        self.db = db

    def save(self, batch_id: str, name: str, document_ids: Sequence[str]) -> None:
        """Record a batch; submitting the same documents again only renames it."""
        now = utcnow()
        stmt = self.db.insert(batches).values(
            batch_id=batch_id,
            name=name,
            document_ids=list(document_ids),
            created_at=now,
            updated_at=now,
        )
        upsert = stmt.on_conflict_do_update(
            index_elements=["batch_id"],
            set_={"name": stmt.excluded.name, "updated_at": stmt.excluded.updated_at},
        )
        self.db.write(lambda conn: conn.execute(upsert))

    def get(self, batch_id: str) -> Batch | None:
        rows = self.db.rows(sa.select(batches).where(batches.c.batch_id == batch_id))
        return Batch.from_row(rows[0]) if rows else None

    def newest(self, limit: int) -> list[Batch]:
        """The most recently submitted batches, newest first."""
        query = sa.select(batches).order_by(batches.c.updated_at.desc()).limit(limit)
        return [Batch.from_row(r) for r in self.db.rows(query)]
