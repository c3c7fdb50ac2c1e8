"""The connection to the results database: one engine per URL, the dialect's upsert, the schema.

Plain SQLAlchemy Core, one code path for SQLite (the embedded default) and PostgreSQL: every write
that may happen twice is an upsert or an insert-if-absent (``Database.insert`` gives the dialect's
``INSERT … ON CONFLICT``), so a retried or duplicated write never makes a second row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from ai_pipeline.store.tables import documents, metadata

_INSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
IN_CHUNK = 500


def normalise_url(url: str) -> str:
    """SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3; the project ships psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def redact_url(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def make_engine(url: str) -> Engine:
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


def create_schema(engine: Engine) -> None:
    """Create what is missing: tables, and the columns later releases added to existing tables."""
    metadata.create_all(engine)
    with engine.begin() as conn:
        _add_missing_columns(conn)


def _add_missing_columns(conn: Connection) -> None:
    """An additive migration: a column added to a table since a database was created is added to
    it (every such column has a server default or is nullable), then back-filled where needed."""
    inspector = sa.inspect(conn)
    added: set[str] = set()
    for table in metadata.sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            ddl = f"{column.name} {column.type.compile(dialect=conn.dialect)}"
            if column.server_default is not None:
                ddl += f" DEFAULT {_default_sql(column, conn)}"
            if not column.nullable:
                ddl += " NOT NULL"
            conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {ddl}"))
            added.add(f"{table.name}.{column.name}")
    if "documents.rejected_by_reviewer" in added:
        # Before the flag existed, a status message meant exactly this: a reviewer's rejection.
        conn.execute(
            sa.update(documents)
            .where(documents.c.status_message.is_not(None))
            .values(rejected_by_reviewer=True)
        )


def _default_sql(column: sa.Column[Any], conn: Connection) -> str:
    default = column.server_default.arg  # type: ignore[union-attr]
    if isinstance(default, str):
        return f"'{default}'"
    return str(default.compile(dialect=conn.dialect))


class Database:
    """One engine (one pool) for one database URL; safe to share between threads."""

    def __init__(self, url: str):
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        create_schema(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_update``/``_do_nothing``."""
        if self.dialect not in _INSERTS:  # pragma: no cover - only these two are supported
            raise NotImplementedError(f"unsupported database dialect {self.dialect}")
        return _INSERTS[self.dialect](table)

    def begin(self) -> Any:
        """A connection in a transaction that commits when the block ends without an error."""
        return self.engine.begin()

    def connect(self) -> Any:
        """A connection for reads."""
        return self.engine.connect()

    def select_in(
        self, query: sa.Select[Any], column: sa.ColumnElement[Any], values: Iterable[str]
    ) -> list[Any]:
        """The rows of ``query`` whose ``column`` is one of ``values``, however many: the values
        are bound ``IN_CHUNK`` at a time, well under SQLite's and PostgreSQL's limits."""
        wanted = list(dict.fromkeys(values))
        rows: list[Any] = []
        with self.connect() as conn:
            for i in range(0, len(wanted), IN_CHUNK):
                rows.extend(conn.execute(query.where(column.in_(wanted[i : i + IN_CHUNK]))))
        return rows

    def dispose(self) -> None:
        self.engine.dispose()
