"""Replans: documents of a backfill whose runs Dagster planned, run instead in fewer runs; each
document is taken by one replan, ever."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import Replan
from ai_pipeline.store.tables import replaced_documents, replans


class Replans:
    def __init__(self, db: Database):
        self.db = db

    def record(
        self, backfill_id: str, runs: Sequence[Sequence[str]], *, named: bool
    ) -> Replan | None:
        """Record, in one transaction, the new runs of some documents of a backfill; None when
        another replan took one of those documents first (nothing recorded)."""

        def write(conn: sa.Connection) -> int:
            seq = conn.execute(
                sa.insert(replans)
                .values(
                    backfill_id=backfill_id,
                    runs=[list(r) for r in runs],
                    named=named,
                    created_at=utcnow(),
                )
                .returning(replans.c.seq)
            ).scalar_one()
            documents = [d for run in runs for d in run]
            taken = conn.execute(
                self.db.insert(replaced_documents)
                .values(
                    [
                        {"backfill_id": backfill_id, "document_id": d, "replan": seq}
                        for d in documents
                    ]
                )
                .on_conflict_do_nothing(index_elements=["backfill_id", "document_id"])
            ).rowcount
            if taken != len(documents):
                raise _Taken()
            return int(seq)

        try:
            seq = self.db.write(write)
        except _Taken:
            return None
        return self.get(seq)

    def get(self, seq: int) -> Replan | None:
        rows = self.db.rows(sa.select(replans).where(replans.c.seq == seq))
        return Replan.from_row(rows[0]) if rows else None

    def after(self, seq: int) -> list[Replan]:
        """The replans recorded after ``seq``, oldest first."""
        query = sa.select(replans).where(replans.c.seq > seq).order_by(replans.c.seq)
        return [Replan.from_row(r) for r in self.db.rows(query)]

    def taken(self, backfill_id: str) -> dict[str, int]:
        """The documents of a backfill that replans took: document → replan."""
        query = sa.select(replaced_documents.c.document_id, replaced_documents.c.replan).where(
            replaced_documents.c.backfill_id == backfill_id
        )
        return {row.document_id: row.replan for row in self.db.rows(query)}


class _Taken(Exception):
    """A document of the replan was taken by another one: its transaction is rolled back."""
