"""The results database: documents and their state, checkpoints, results, failure events.

Plain SQLAlchemy Core, one code path for SQLite (the embedded default, a file under DAGSTER_HOME)
and PostgreSQL (``AI_PIPELINE_DATABASE_URL``): every write that may happen twice is an upsert or an
insert-if-absent, so a retried or duplicated write never makes a second row.

Tables:

- ``documents``: one row per document id — state, category, attempts, last error, normalised text.
- ``document_sources``: every file name a document arrived under (aliases of one content).
- ``checkpoints``: the stored result of one task (task id = document + step + prompt version +
  model); its existence means the task is done. First write wins.
- ``results``: the analysis, one row per document, ever (written by the results IO manager).
- ``failure_events``: every classification of a failure, appended, for reports.
- ``review_queue``: one open item per document that needs a person, with a snapshot of its input.
- ``quarantine``: LLM outputs that failed grounding; kept for audit, never used as results.
- ``document_history``: what people and the pipeline did to a document (reviews, overrides,
  dead letter, requeue), appended.
- ``check_overrides``: stored outputs a reviewer accepted although a check failed.
- ``submitter_messages``: the outbox of messages to whoever submitted a rejected document.
- ``batches``: named sets of documents submitted together (the batch id is their content).

Dagster knows nothing of this module; ``ai_pipeline.defs.resources`` wires it in.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ai_pipeline.documents import Document, RejectedFile
from ai_pipeline.failures import Category
from ai_pipeline.states import State, check_transition

metadata = sa.MetaData()

documents = sa.Table(
    "documents",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("size_bytes", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=True),
    sa.Column("rejected_reason", sa.Text, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("category", sa.String(32), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

document_sources = sa.Table(
    "document_sources",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_document_sources_source", "source"),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("step", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

results = sa.Table(
    "results",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("keywords", sa.JSON, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("sentiment", sa.String(16), nullable=False),
    sa.Column("entities", sa.JSON, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("task_id", sa.String(128), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("prompt_version", sa.String(32), nullable=False),
    sa.Column("sources", sa.JSON, nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=True),
    sa.Column("completion_tokens", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

failure_events = sa.Table(
    "failure_events",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, index=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("layer", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
)

review_queue = sa.Table(
    "review_queue",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("snapshot", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("decision", sa.String(32), nullable=True),
    sa.Column("decided_by", sa.String(128), nullable=True),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

quarantine = sa.Table(
    "quarantine",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("output", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

history = sa.Table(
    "document_history",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("event", sa.String(40), nullable=False),
    sa.Column("detail", sa.Text, nullable=True),
)

overrides = sa.Table(
    "check_overrides",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False),
    sa.Column("decided_by", sa.String(128), nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

outbox = sa.Table(
    "submitter_messages",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("message_zh", sa.Text, nullable=False),
    sa.Column("message_en", sa.Text, nullable=False),
)

batches = sa.Table(
    "batches",
    metadata,
    sa.Column("batch_id", sa.String(32), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("document_ids", sa.JSON, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def default_database_url() -> str:
    """``AI_PIPELINE_DATABASE_URL``, else a SQLite file under ``DAGSTER_HOME`` (or the cwd)."""
    url = os.environ.get("AI_PIPELINE_DATABASE_URL")
    if url:
        return url
    home = os.environ.get("DAGSTER_HOME") or os.getcwd()
    return f"sqlite:///{Path(home).resolve() / 'ai_pipeline.sqlite'}"


def normalise_url(url: str) -> str:
    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the project ships psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def redact_url(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def _make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets the sensor, a run and the CLI read while another one writes.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _loads(value: str | None) -> Any:
    return json.loads(value) if value is not None else None


class Store:
    """The results database. Safe to share between threads; create one per process."""

    def __init__(self, url: str):
        self.url = normalise_url(url)
        self.engine = _make_engine(self.url)
        metadata.create_all(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects import postgresql, sqlite

        inserts: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
        if self.dialect not in inserts:  # pragma: no cover - only these two are supported
            raise NotImplementedError(f"unsupported database dialect {self.dialect}")
        return inserts[self.dialect](table)

    # --- documents ---------------------------------------------------------------------------

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
            "created_at": now,
            "updated_at": now,
        }
        with self.engine.begin() as conn:
            inserted = conn.execute(
                self._insert(documents).values(row).on_conflict_do_nothing()
            ).rowcount
            conn.execute(
                self._insert(document_sources)
                .values(document_id=doc.document_id, source=doc.source, first_seen_at=now)
                .on_conflict_do_nothing()
            )
        return bool(inserted)

    def get_document(self, document_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(documents).where(documents.c.document_id == document_id)
            ).first()
        return dict(row._mapping) if row else None

    def get_documents(self, document_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        query = sa.select(documents).order_by(documents.c.created_at, documents.c.document_id)
        if document_ids is not None:
            query = query.where(documents.c.document_id.in_(list(document_ids)))
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def sources(self, document_ids: Iterable[str] | None = None) -> dict[str, list[str]]:
        query = sa.select(document_sources).order_by(
            document_sources.c.first_seen_at, document_sources.c.source
        )
        if document_ids is not None:
            query = query.where(document_sources.c.document_id.in_(list(document_ids)))
        out: dict[str, list[str]] = {}
        with self.engine.connect() as conn:
            for r in conn.execute(query):
                out.setdefault(r.document_id, []).append(r.source)
        return out

    def known_sources(self, sources: Iterable[str]) -> set[str]:
        """Which of these file paths have been registered before (under any content)."""
        wanted = list(sources)
        known: set[str] = set()
        with self.engine.connect() as conn:
            for i in range(0, len(wanted), 500):
                rows = conn.execute(
                    sa.select(document_sources.c.source).where(
                        document_sources.c.source.in_(wanted[i : i + 500])
                    )
                )
                known.update(r.source for r in rows)
        return known

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
        status_message: str | None = None,
    ) -> State:
        """Move a document to ``target`` if the state machine allows it; returns the old state.

        The update is a compare-and-set on the state read, so two writers cannot both move a
        document out of the same state.
        """
        with self.engine.begin() as conn:
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
            if status_message is not None:
                values["status_message"] = status_message
            updated = conn.execute(
                sa.update(documents)
                .where(documents.c.document_id == document_id)
                .where(documents.c.state == current.value)
                .values(values)
            ).rowcount
            if not updated:
                raise RuntimeError(f"document {document_id} changed state concurrently")
        return current

    # --- checkpoints -------------------------------------------------------------------------

    def get_checkpoint(self, task_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(checkpoints.c.payload).where(checkpoints.c.task_id == task_id)
            ).first()
        return _loads(row.payload) if row else None

    def get_checkpoints(self, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not task_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(checkpoints.c.task_id, checkpoints.c.payload).where(
                    checkpoints.c.task_id.in_(list(task_ids))
                )
            )
            return {r.task_id: _loads(r.payload) for r in rows}

    def put_checkpoint(
        self, task_id: str, document_id: str, step: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """Store a task's result durably; if one exists already, keep it and return it."""
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(checkpoints)
                .values(
                    task_id=task_id,
                    document_id=document_id,
                    step=step,
                    payload=json.dumps(payload, ensure_ascii=False, sort_keys=True),
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing()
            )
        stored = self.get_checkpoint(task_id)
        assert stored is not None
        return stored

    def delete_checkpoint(self, task_id: str) -> bool:
        with self.engine.begin() as conn:
            return bool(
                conn.execute(
                    sa.delete(checkpoints).where(checkpoints.c.task_id == task_id)
                ).rowcount
            )

    def count_checkpoints(self, step: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(checkpoints)
        if step:
            query = query.where(checkpoints.c.step == step)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    # --- results -----------------------------------------------------------------------------

    def upsert_results(self, rows: Sequence[dict[str, Any]]) -> int:
        """Insert or update result rows, one per document id. Never a plain insert."""
        if not rows:
            return 0
        now = utcnow()
        # One row per document even within a call: PostgreSQL refuses to update a row twice in
        # one statement, SQLite would keep the last; both now keep the last.
        latest = {row["document_id"]: row for row in rows}
        values = [{**row, "created_at": now, "updated_at": now} for row in latest.values()]
        stmt = self._insert(results).values(values)
        update_columns = {
            c.name: stmt.excluded[c.name]
            for c in results.columns
            if c.name not in ("document_id", "created_at")
        }
        with self.engine.begin() as conn:
            conn.execute(
                stmt.on_conflict_do_update(index_elements=["document_id"], set_=update_columns)
            )
        return len(values)

    def get_results(self, document_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        query = sa.select(results).order_by(results.c.document_id)
        if document_ids is not None:
            query = query.where(results.c.document_id.in_(list(document_ids)))
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def count_results(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(results)).scalar_one())

    # --- failure events ----------------------------------------------------------------------

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
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(failure_events).values(
                    at=utcnow(),
                    document_id=document_id,
                    task_id=task_id,
                    run_id=run_id,
                    category=category.value,
                    layer=category.rule.layer.value,
                    attempt=attempt,
                    error=error,
                )
            )

    def failure_events(self, document_id: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(failure_events).order_by(failure_events.c.id)
        if document_id:
            query = query.where(failure_events.c.document_id == document_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # --- review queue and quarantine ---------------------------------------------------------

    def open_review(
        self,
        document_id: str,
        category: Category,
        error: str,
        snapshot: dict[str, Any],
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
            "snapshot": snapshot,
            "status": "open",
            "decision": None,
            "decided_by": None,
            "note": None,
            "created_at": now,
            "updated_at": now,
        }
        stmt = self._insert(review_queue).values(row)
        with self.engine.begin() as conn:
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["document_id"],
                    set_={
                        k: stmt.excluded[k] for k in row if k not in ("document_id", "created_at")
                    },
                )
            )

    def review_items(self, status: str | None = "open") -> list[dict[str, Any]]:
        query = sa.select(review_queue).order_by(review_queue.c.created_at)
        if status:
            query = query.where(review_queue.c.status == status)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def quarantine_output(self, document_id: str, task_id: str, output: str, reason: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(quarantine)
                .values(
                    task_id=task_id,
                    document_id=document_id,
                    output=output,
                    reason=reason,
                    at=utcnow(),
                )
                .on_conflict_do_nothing()
            )

    def quarantined(self, document_id: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(quarantine).order_by(quarantine.c.at)
        if document_id:
            query = query.where(quarantine.c.document_id == document_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def get_review(self, document_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(review_queue).where(review_queue.c.document_id == document_id)
            ).first()
        return dict(row._mapping) if row else None

    def decide_review(
        self, document_id: str, *, status: str, decision: str, decided_by: str, note: str | None
    ) -> None:
        """Record a reviewer's decision on an open item (only an open item can be decided)."""
        with self.engine.begin() as conn:
            updated = conn.execute(
                sa.update(review_queue)
                .where(review_queue.c.document_id == document_id)
                .where(review_queue.c.status == "open")
                .values(
                    status=status,
                    decision=decision,
                    decided_by=decided_by,
                    note=note,
                    updated_at=utcnow(),
                )
            ).rowcount
        if not updated:
            raise KeyError(f"no open review item for document {document_id}")

    def decide_review_done(self, document_id: str) -> None:
        """An approved item whose document then completed is resolved."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(review_queue)
                .where(review_queue.c.document_id == document_id)
                .where(review_queue.c.status == "approved")
                .values(status="resolved", updated_at=utcnow())
            )

    # --- history, overrides, outbox, batches -------------------------------------------------

    def add_history(
        self, document_id: str, event: str, detail: str | None = None, *, task_id: str | None = None
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(history).values(
                    at=utcnow(),
                    document_id=document_id,
                    task_id=task_id,
                    event=event,
                    detail=detail,
                )
            )

    def history(self, document_id: str) -> list[dict[str, Any]]:
        query = (
            sa.select(history).where(history.c.document_id == document_id).order_by(history.c.id)
        )
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def add_override(
        self, task_id: str, document_id: str, decided_by: str, note: str | None
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(overrides)
                .values(
                    task_id=task_id,
                    document_id=document_id,
                    decided_by=decided_by,
                    note=note,
                    at=utcnow(),
                )
                .on_conflict_do_nothing()
            )

    def get_override(self, task_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(overrides).where(overrides.c.task_id == task_id)).first()
        return dict(row._mapping) if row else None

    def add_message(
        self, document_id: str, source: str, reason: str, message_zh: str, message_en: str
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(outbox).values(
                    at=utcnow(),
                    document_id=document_id,
                    source=source,
                    reason=reason,
                    message_zh=message_zh,
                    message_en=message_en,
                )
            )

    def messages(self, document_id: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(outbox).order_by(outbox.c.id)
        if document_id:
            query = query.where(outbox.c.document_id == document_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def save_batch(self, batch_id: str, name: str, document_ids: Sequence[str]) -> None:
        now = utcnow()
        stmt = self._insert(batches).values(
            batch_id=batch_id,
            name=name,
            document_ids=list(document_ids),
            created_at=now,
            updated_at=now,
        )
        with self.engine.begin() as conn:
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["batch_id"],
                    set_={"name": stmt.excluded.name, "updated_at": stmt.excluded.updated_at},
                )
            )

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(batches).where(batches.c.batch_id == batch_id)).first()
        return dict(row._mapping) if row else None


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def get_store(url: str | None = None) -> Store:
    """One Store (one engine, one pool) per database URL per process."""
    url = normalise_url(url or default_database_url())
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = Store(url)
        return store


def dispose_stores() -> None:
    """Close every cached Store's connections (tests and a shutting-down process)."""
    with _stores_lock:
        for store in _stores.values():
            store.engine.dispose()
        _stores.clear()
