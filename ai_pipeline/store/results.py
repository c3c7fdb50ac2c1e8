"""Results: the output of each document, one row per document, ever — upserted, never inserted.

The table's columns follow the analysis's output model (``columns_for``): each top-level field a
column, typed where SQL has the type (text, integer, real, boolean) and JSON where it has not, so
the results can be queried in SQL on either backend. A field the model gains later is added to an
existing table as a nullable column.

The results IO manager (``ai_pipeline.defs.io_managers``) writes through ``upsert`` both for the
rows the analysis step hands it and for ``handle_output``; its ``load_input`` reads through ``get``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from ai_pipeline.store.database import IN_CHUNK, IN_VALUES, Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import ResultRow
from ai_pipeline.store.tables import results_tables


def _sql_type(annotation: Any) -> sa.types.TypeEngine[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _sql_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _sql_type(args[0]) if len(args) == 1 else sa.JSON()
    if origin is Literal:
        values = typing.get_args(annotation)
        return sa.Text() if all(isinstance(v, str) for v in values) else sa.JSON()
    simple: dict[Any, sa.types.TypeEngine[Any]] = {
        str: sa.Text(),
        bool: sa.Boolean(),
        int: sa.Integer(),
        float: sa.Float(),
    }
    return simple.get(annotation, sa.JSON())


def columns_for(model: type[BaseModel]) -> dict[str, sa.types.TypeEngine[Any]]:
    """The results columns of an output model: one per top-level field."""
    return {name: _sql_type(field.annotation) for name, field in model.model_fields.items()}


class Results:
    def __init__(self, db: Database, output_model: type[BaseModel]):
        self.db = db
        self.fields = tuple(output_model.model_fields)
        self.table, self.history_table = results_tables(columns_for(output_model))
        assert self.table.metadata is not None
        db.create(self.table.metadata)
        self._upsert: Any = None
        self._archiving: Any = None
        self._rows = sa.select(self.table)

    def upsert(self, rows: Sequence[ResultRow]) -> int:
        """Insert or update result rows, one per document id. Never a plain insert."""
        if not rows:
            return 0
        now = utcnow()
        # One row per document even within a call: PostgreSQL refuses to update a row twice in
        # one statement, SQLite would keep the last; both now keep the last.
        latest = {row.document_id: row for row in rows}
        values = [
            {**row.as_record(), "created_at": now, "updated_at": now} for row in latest.values()
        ]
        results, results_history = self.table, self.history_table
        upsert = self._upsert_statement()
        if len(values) == 1 and self.db.dialect == "postgresql":
            # A run's own upsert (one document): the row another task replaces archived by the
            # same statement, which sees the row as it was before its upsert; no transaction.
            (row,) = latest.values()
            archived = {"archive_document": row.document_id, "archive_at": now}
            archived["archive_for"] = row.task_id
            self.db.write_each(
                lambda conn: conn.execute(self._archiving_upsert(), {**values[0], **archived})
            )
            return 1
        current = self.db.in_statement(self._rows, results.c.document_id)
        new_tasks = {d: row.task_id for d, row in latest.items()}

        def write(conn: Connection) -> None:
            # The analysis another task replaces is kept as it was, in the same transaction.
            ids = list(new_tasks)
            replaced = []
            for i in range(0, len(ids), IN_CHUNK):
                chunk = {IN_VALUES: ids[i : i + IN_CHUNK]}
                replaced += [
                    r for r in conn.execute(current, chunk) if r.task_id != new_tasks[r.document_id]
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
            conn.execute(self.db.for_many_rows(upsert), values)

        self.db.write(write)
        return len(values)

    def _upsert_statement(self) -> Any:
        """INSERT … ON CONFLICT (document_id) DO UPDATE of every column but the key and
        ``created_at``, built once: rows are bound at execution (a run upserts once a document,
        and building and hashing the statement each time cost more than executing it)."""
        if self._upsert is None:
            stmt = self.db.insert(self.table)
            update_columns = {
                c.name: stmt.excluded[c.name]
                for c in self.table.columns
                if c.name not in ("document_id", "created_at")
            }
            self._upsert = stmt.on_conflict_do_update(
                index_elements=["document_id"], set_=update_columns
            )
        return self._upsert

    def _archiving_upsert(self) -> Any:
        """PostgreSQL: ``_upsert_statement`` of one row, with a data-modifying CTE before it that
        copies the document's row into results_history when another task replaces it (bound:
        ``archive_document``, ``archive_at``, ``archive_for`` — the new task). Built once."""
        if self._archiving is None:
            results, history = self.table, self.history_table
            copied = [c.name for c in results.columns]
            task = sa.bindparam("archive_for", type_=history.c.replaced_by_task.type)
            replaced = sa.select(
                *(results.c[name] for name in copied),
                sa.bindparam("archive_at", type_=history.c.replaced_at.type),
                task,
            ).where(
                results.c.document_id
                == sa.bindparam("archive_document", type_=results.c.document_id.type),
                results.c.task_id != task,
            )
            archive = history.insert().from_select(
                [*copied, "replaced_at", "replaced_by_task"], replaced
            )
            self._archiving = self._upsert_statement().add_cte(archive.cte("archived"))
        return self._archiving

    def history(self, document_id: str) -> list[dict[str, Any]]:
        """A document's earlier analyses, the oldest first."""
        results_history = self.history_table
        query = (
            sa.select(results_history)
            .where(results_history.c.document_id == document_id)
            .order_by(results_history.c.id)
        )
        return [dict(r._mapping) for r in self.db.rows(query)]

    def _stale(self, current_suffix: str) -> sa.ColumnElement[bool]:
        # Current iff the row's task is the analysis task of its document under the current
        # prompt version and configured model (``ai_pipeline.tasks.task_suffix``). Not by the
        # stored model: that is the name the endpoint served under (OpenAI answers a request for
        # ``gpt-4o-mini`` as ``gpt-4o-mini-2024-07-18``), kept for display only.
        results = self.table
        return results.c.task_id != results.c.document_id + sa.literal(current_suffix)

    def stale(self, current_suffix: str) -> list[ResultRow]:
        """The analyses whose task id is not ``document id + current_suffix`` (made under
        another prompt version or model than now): what a re-analysis would change."""
        results = self.table
        query = (
            sa.select(results).where(self._stale(current_suffix)).order_by(results.c.document_id)
        )
        return [ResultRow.from_row(r, self.fields) for r in self.db.rows(query)]

    def count_stale(self, current_suffix: str) -> dict[str, int]:
        """How many stale analyses each (prompt version, served model) made:
        ``{"v1 / gpt-4o-2024-08-06": n}``. One grouped query."""
        results = self.table
        query = (
            sa.select(results.c.prompt_version, results.c.model, sa.func.count())
            .where(self._stale(current_suffix))
            .group_by(results.c.prompt_version, results.c.model)
        )
        return {f"{v} / {m}": int(n) for v, m, n in self.db.rows(query)}

    def get(self, document_ids: Iterable[str] | None = None) -> list[ResultRow]:
        """Result rows (all, or of these documents), by document id."""
        results = self.table
        query = sa.select(results).order_by(results.c.document_id)
        if document_ids is None:
            return [ResultRow.from_row(r, self.fields) for r in self.db.rows(query)]
        rows = self.db.select_in(query, results.c.document_id, document_ids)
        found = (ResultRow.from_row(r, self.fields) for r in rows)
        return sorted(found, key=lambda r: r.document_id)

    def count(self) -> int:
        query = sa.select(sa.func.count()).select_from(self.table)
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))
