"""Results: the analysis of each document, one row per document, ever — upserted, never inserted.

The results IO manager (``ai_pipeline.defs.io_managers``) writes through ``upsert`` both for the
rows the analysis step hands it and for ``handle_output``; its ``load_input`` reads through ``get``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.store.database import IN_CHUNK, Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import ResultRow
from ai_pipeline.store.tables import results, results_history


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
        new_tasks = {d: row.task_id for d, row in latest.items()}

        def write(conn: Connection) -> None:
            # The analysis another task replaces is kept as it was, in the same transaction.
            ids = list(new_tasks)
            replaced = []
            for i in range(0, len(ids), IN_CHUNK):
                query = sa.select(results).where(results.c.document_id.in_(ids[i : i + IN_CHUNK]))
                replaced += [
                    r for r in conn.execute(query) if r.task_id != new_tasks[r.document_id]
                ]
            if replaced:
                conn.execute(
                    sa.insert(results_history),
                    [
                        {
                            **r._asdict(),
                            "replaced_at": now,
                            "replaced_by_task": new_tasks[r.document_id],
                        }
                        for r in replaced
                    ],
                )
            conn.execute(upsert)

        self.db.write(write)
        return len(values)

    def history(self, document_id: str) -> list[dict[str, Any]]:
        """A document's earlier analyses, the oldest first."""
        query = (
            sa.select(results_history)
            .where(results_history.c.document_id == document_id)
            .order_by(results_history.c.id)
        )
        return [dict(r._mapping) for r in self.db.rows(query)]

    @staticmethod
    def _stale(current_suffix: str) -> sa.ColumnElement[bool]:
        # Current iff the row's task is the analysis task of its document under the current
        # prompt version and configured model (``ai_pipeline.tasks.task_suffix``). Not by the
        # stored model: that is the name the endpoint served under (OpenAI answers a request for
        # ``gpt-4o-mini`` as ``gpt-4o-mini-2024-07-18``), kept for display only.
        return results.c.task_id != results.c.document_id + sa.literal(current_suffix)

    def stale(self, current_suffix: str) -> list[ResultRow]:
        """The analyses whose task id is not ``document id + current_suffix`` (made under
        another prompt version or model than now): what a re-analysis would change."""
        query = (
            sa.select(results).where(self._stale(current_suffix)).order_by(results.c.document_id)
        )
        return [ResultRow.from_row(r) for r in self.db.rows(query)]

    def count_stale(self, current_suffix: str) -> dict[str, int]:
        """How many stale analyses each (prompt version, served model) made:
        ``{"v1 / gpt-4o-2024-08-06": n}``. One grouped query."""
        query = (
            sa.select(results.c.prompt_version, results.c.model, sa.func.count())
            .where(self._stale(current_suffix))
            .group_by(results.c.prompt_version, results.c.model)
        )
        return {f"{v} / {m}": int(n) for v, m, n in self.db.rows(query)}

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
