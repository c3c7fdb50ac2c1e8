"""Results: the analysis of each document, one row per document, ever — upserted, never inserted.

The results IO manager (``ai_pipeline.defs.io_managers``) writes through ``upsert`` both for the
rows the analysis step hands it and for ``handle_output``; its ``load_input`` reads through ``get``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import ResultRow
from ai_pipeline.store.tables import results


class Results:
    def __init__(self, db: Database):
        self.db = db

    def upsert(self, rows: Sequence[ResultRow]) -> int:
        """Insert or update result rows, one per document id. Never a plain insert."""
        if not rows:
            return 0
        now = utcnow()
        # One row per document even within a call: PostgreSQL refuses to update a row twice in
        # one statement, SQLite would keep the last; both now keep the last.
        latest = {row.document_id: row for row in rows}
        values = [
            {**row.as_dict(), "created_at": now, "updated_at": now} for row in latest.values()
        ]
        stmt = self.db.insert(results).values(values)
        update_columns = {
            c.name: stmt.excluded[c.name]
            for c in results.columns
            if c.name not in ("document_id", "created_at")
        }
        upsert = stmt.on_conflict_do_update(index_elements=["document_id"], set_=update_columns)
        self.db.write(lambda conn: conn.execute(upsert))
        return len(values)

    def get(self, document_ids: Iterable[str] | None = None) -> list[ResultRow]:
        """Result rows (all, or of these documents), by document id."""
        query = sa.select(results).order_by(results.c.document_id)
        if document_ids is None:
            return [ResultRow.from_row(r) for r in self.db.rows(query)]
        rows = self.db.select_in(query, results.c.document_id, document_ids)
        return sorted(map(ResultRow.from_row, rows), key=lambda r: r.document_id)

    def count(self) -> int:
        query = sa.select(sa.func.count()).select_from(results)
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))
