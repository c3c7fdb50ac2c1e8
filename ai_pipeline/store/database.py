"""The connection to the results database: one engine per URL, the dialect's upsert, the schema,
and what happens when the database goes away for a while.

Plain SQLAlchemy Core, one code path for SQLite (the embedded default) and PostgreSQL: every write
that may happen twice is an upsert or an insert-if-absent (``Database.insert`` gives the dialect's
``INSERT … ON CONFLICT``), so a retried or duplicated write never makes a second row.

Every read and write goes through ``Database.read`` / ``Database.write``, which run it again when
the connection failed — a PostgreSQL restart, a dropped connection, SQLite busy — with backoff, for
up to ``retry_seconds`` (``AI_PIPELINE_DB_RETRY_SECONDS``, 60 by default). A check of idle pooled
connections (``ping_when_idle``) does not cover a statement in flight when the server goes. Only
when the outage outlasts that does a call raise ``StoreUnavailable`` (DATABASE_UNAVAILABLE,
retryable), naming the database with its password hidden. A write retried after its commit was lost on the way back is harmless: writes are
upserts, inserts-if-absent or compare-and-set transitions (an appended failure event may then be
recorded twice).
"""

from __future__ import annotations

import importlib.util
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.store.tables import documents, metadata
from ai_pipeline.tracing import span

T = TypeVar("T")
_INSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
IN_CHUNK = 500
# The name of the list an ``in_statement`` binds, and how many such statements a database keeps
# (queries made anew at each call are dropped with the rest when there are more).
IN_VALUES = "in_values"
IN_STATEMENTS = 256
DEFAULT_RETRY_SECONDS = 60.0
_BACKOFF = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
# A pooled connection unused for longer than this is checked before use (``ping_when_idle``).
IDLE_PING_SECONDS = 5.0


class StoreUnavailable(ClassifiedError):
    """The results database stayed unreachable for longer than the retries cover."""

    def __init__(self, message: str):
        super().__init__(Category.DATABASE_UNAVAILABLE, message)


def transient(error: BaseException, dialect: str) -> bool:
    """Whether a database error is the connection's (worth retrying), not the statement's."""
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, sa.exc.TimeoutError):  # the pool had no connection to give
        return True
    if dialect == "sqlite":
        text = str(getattr(error, "orig", error)).lower()
        return isinstance(error, sa.exc.OperationalError) and ("locked" in text or "busy" in text)
    return isinstance(error, (sa.exc.OperationalError, sa.exc.InterfaceError))


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


# How long PostgreSQL keeps a session of the results database that sits idle inside a transaction:
# every transaction of the store is a few statements back to back, so one idle this long belongs to
# a client that is gone without the server knowing — a worker host lost with its link cut, its
# connection half-open (or held open by a forwarder) — and whose row locks would otherwise block
# every other run, sensor and command that touches those documents until TCP gives up on it.
IDLE_IN_TRANSACTION_SECONDS = 30


def make_engine(url: str, *, autocommit: bool = False) -> Engine:
    """An engine for ``url``; with ``autocommit`` on PostgreSQL, one whose connections commit each
    statement by itself (its own pool: switching a pooled connection in and out of autocommit
    costs a round trip, psycopg2's ``SET default_transaction_isolation``, each time it goes back)."""
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
    timeout_ms = int(IDLE_IN_TRANSACTION_SECONDS * 1000)
    if importlib.util.find_spec("psycopg2") is None:
        raise InputError(
            f"the results database {redact_url(url)} is on PostgreSQL, and its driver is not "
            "installed: pip install 'ai-pipeline[postgres]'"
        )
    return ping_when_idle(
        sa.create_engine(
            url,
            pool_size=10,
            max_overflow=20,
            connect_args={"options": f"-c idle_in_transaction_session_timeout={timeout_ms}"},
            **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
        )
    )


def ping_when_idle(engine: Engine, idle_seconds: float | None = None) -> Engine:
    """Check a pooled connection as it is taken from the pool, without a round trip unless it sat
    there for more than ``idle_seconds`` (``IDLE_PING_SECONDS``): one that the server closed (a
    restart, its sessions ended) is replaced instead of failing the call.

    ``pool_pre_ping`` pings on every checkout, a round trip to the server before every statement;
    a run makes dozens a document, in its store calls and its Dagster event writes, and on a busy
    PostgreSQL server those pings cost as much as the statements (``benchmarks/README.md``). A
    server that closes a session sends its goodbye (an error message, then end of file), so an idle
    connection's socket with something to read is one the server closed: that costs a ``select``
    and no round trip. A connection idle for longer, which a silent network may have broken, is
    pinged as SQLAlchemy's pessimistic check does (the dialect's ``do_ping`` in a ``checkout``
    listener; ``DisconnectionError`` makes the pool connect again).
    """
    idle = IDLE_PING_SECONDS if idle_seconds is None else idle_seconds

    @sa.event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("returned_at")
        if returned is None:
            return  # new: just connected
        if _closed_by_server(dbapi_connection):
            raise sa.exc.DisconnectionError("the server closed a pooled connection")
        if time.monotonic() - returned < idle:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as e:
            raise sa.exc.DisconnectionError(f"a pooled connection is gone: {e}") from e
        if not alive:
            raise sa.exc.DisconnectionError("a pooled connection is gone")

    return engine


def _closed_by_server(dbapi_connection: Any) -> bool:
    """Whether an idle connection's socket has something to read: nothing is due on it, so it is
    the server's farewell."""
    try:
        readable, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except (OSError, ValueError, AttributeError):
        return True
    return bool(readable)


def create_schema(engine: Engine, tables: sa.MetaData = metadata) -> None:
    """Create what is missing: tables, and the columns later releases added to existing tables.

    Processes that start on a fresh database at once: on PostgreSQL an advisory lock held for the
    transaction serialises them; on SQLite one that lost the race finds the tables there and goes
    on.
    """
    for attempt in range(10):
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7290314)"))
                tables.create_all(conn)
                _add_missing_columns(conn, tables)
            return
        except sa.exc.OperationalError as e:
            lost_the_race = "already exists" in str(e) or "duplicate column" in str(e)
            if not lost_the_race or attempt == 9:
                raise


def _add_missing_columns(conn: Connection, tables: sa.MetaData) -> None:
    """An additive migration: a column added to a table since a database was created is added to
    it (every such column has a server default or is nullable), then back-filled where needed."""
    inspector = sa.inspect(conn)
    added: set[str] = set()
    for table in tables.sorted_tables:
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


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


def _default_sql(column: sa.Column[Any], conn: Connection) -> str:
    default = column.server_default.arg  # type: ignore[union-attr]
    if isinstance(default, str):
        return f"'{default}'"
    return str(default.compile(dialect=conn.dialect))


class Database:
    """One engine (one pool) for one database URL; safe to share between threads."""

    def __init__(
        self,
        url: str,
        *,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        # On PostgreSQL a read, and a write of one statement, run outside a transaction: a
        # psycopg2 connection would open one for it (a BEGIN) and the pool or the commit close it
        # (a ROLLBACK, a COMMIT), two round trips more for each. A read's statements see what is
        # committed either way (READ COMMITTED); a statement is atomic by itself.
        self._autocommit = (
            make_engine(self.url, autocommit=True)
            if self.engine.dialect.name == "postgresql"
            else self.engine
        )
        self.retry_seconds = retry_seconds
        self._sleep = sleep
        self._lock = threading.Lock()
        self._in_statements: dict[tuple[int, int], tuple[Any, Any, Any]] = {}
        self.retries = 0  # how many calls were retried (for tests and the benchmark)
        self._retrying(lambda: create_schema(self.engine))

    def create(self, tables: sa.MetaData) -> None:
        """Create what is missing of more tables than the store's own (an analysis's results)."""
        self._retrying(lambda: create_schema(self.engine, tables))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_update``/``_do_nothing``."""
        if self.dialect not in _INSERTS:  # pragma: no cover - only these two are supported
            raise NotImplementedError(f"unsupported database dialect {self.dialect}")
        return _INSERTS[self.dialect](table)

    def for_many_rows(self, statement: Any) -> Any:
        """``statement``, an INSERT with ``ON CONFLICT``, as it should be executed with many rows.

        psycopg2's ``executemany`` sends one statement per row, a round trip each. SQLAlchemy
        folds the rows into multi-row statements of up to a thousand (its "insertmanyvalues"),
        but from 2.1 on it no longer does for an INSERT with ``ON CONFLICT`` unless the INSERT
        has ``RETURNING`` (sqlalchemy#13130): so on PostgreSQL it returns the row's key. On
        SQLite ``executemany`` stays in the driver, without round trips."""
        if self.dialect != "postgresql":
            return statement
        return statement.returning(*statement.table.primary_key.columns)

    def write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a transaction (committed when it returns), again if the connection
        failed; raises StoreUnavailable when the database stays away."""

        def transaction() -> T:
            with self.engine.begin() as conn:
                return work(conn)

        with span("store.write", **{"db.system": self.dialect}):
            return self._retrying(transaction)

    def write_each(self, work: Callable[[Connection], T]) -> T:
        """``write`` for ``work`` whose statements need no transaction around them — a single
        statement, or reads and then one compare-and-set — each committed by itself: on
        PostgreSQL no BEGIN and COMMIT, one round trip per statement instead of two more."""
        if self._autocommit is self.engine:
            return self.write(work)

        def alone() -> T:
            with self._autocommit.connect() as conn:
                return work(conn)

        with span("store.write", **{"db.system": self.dialect}):
            return self._retrying(alone)

    def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on a connection, again if the connection failed."""

        def on_connection() -> T:
            with self._autocommit.connect() as conn:
                return work(conn)

        return self._retrying(on_connection)

    def rows(self, query: Any, params: dict[str, Any] | None = None) -> list[Any]:
        """All rows of a query (with its bound ``params``)."""
        return self.read(lambda conn: list(conn.execute(query, params)))

    def select_in(
        self, query: sa.Select[Any], column: sa.ColumnElement[Any], values: Iterable[str]
    ) -> list[Any]:
        """The rows of ``query`` whose ``column`` is one of ``values``, however many: the values
        are bound ``IN_CHUNK`` at a time, well under SQLite's and PostgreSQL's limits. The
        statement is built once per query and column (``in_statement``)."""
        wanted = list(dict.fromkeys(values))
        statement = self.in_statement(query, column)

        def chunked(conn: Connection) -> list[Any]:
            rows: list[Any] = []
            for i in range(0, len(wanted), IN_CHUNK):
                rows.extend(conn.execute(statement, {IN_VALUES: wanted[i : i + IN_CHUNK]}))
            return rows

        return self.read(chunked)

    def in_statement(self, query: Any, column: sa.ColumnElement[Any]) -> Any:
        """``query`` where ``column`` is IN the list bound as ``IN_VALUES``; built once for a
        query kept as a constant (SQLAlchemy builds and hashes a statement every time it is made,
        several times what executing it costs on SQLite)."""
        key = (id(query), id(column))
        kept = self._in_statements.get(key)
        if kept is None or kept[0] is not query or kept[1] is not column:
            statement = query.where(column.in_(sa.bindparam(IN_VALUES, expanding=True)))
            kept = (query, column, statement)
            with self._lock:
                if len(self._in_statements) >= IN_STATEMENTS:
                    self._in_statements.clear()
                self._in_statements[key] = kept
        return kept[2]

    def _retrying(self, call: Callable[[], T]) -> T:
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return call()
            except sa.exc.SQLAlchemyError as e:
                if not transient(e, self.dialect):
                    raise
                waited = time.monotonic() - started
                if waited >= self.retry_seconds:
                    raise StoreUnavailable(
                        f"the results database {redact_url(self.url)} is unreachable after "
                        f"{attempt + 1} attempts over {waited:.0f} s: {_first_line(e)}"
                    ) from e
                with self._lock:
                    self.retries += 1
                delay = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
                self._sleep(min(delay, max(self.retry_seconds - waited, 0.0)))
                attempt += 1

    def dispose(self) -> None:
        self.engine.dispose()
        self._autocommit.dispose()
