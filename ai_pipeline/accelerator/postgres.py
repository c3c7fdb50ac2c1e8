"""The production instance's storage: dagster-postgres, keeping a connection open per process.

dagster-postgres 0.29.27 builds its run, event-log and schedule storages on engines with
``NullPool``: every storage call opens a new PostgreSQL connection (a TCP handshake,
authentication and a server process forked for it) and closes it afterwards. A run of the analysis
job writes several events per document from its step's thread, one after another, so on
PostgreSQL that connection cost — not the LLM — set the pace: 76 ms per event write against 20 ms
on a kept connection, measured side by side on one instance (``benchmarks/README.md``).

:class:`PooledPostgresStorage` is Dagster's own ``DagsterPostgresStorage`` with the three engines
swapped for pooled ones and nothing else changed: the same tables, statements, ``AUTOCOMMIT``
isolation and configuration (``postgres_url`` or ``postgres_db``). Each pool keeps
``pool_size`` connections per storage and process and opens up to ``max_overflow`` more for
concurrent callers (the daemon's threads), closed again when returned. The pools are the
process's, not the instance's: the instances a process builds one after another (a code server,
one for every sensor tick) use the same connections, and check Dagster's tables with one query. A kept connection is
checked before use (``ai_pipeline.store.database.ping_when_idle``: without a round trip unless it
sat idle for a few seconds), so one that a database restart broke is replaced instead of failing
the write; connections are recycled after ``pool_recycle`` seconds. Its event log
also plans a run's checks in time proportional to the run's documents (``defs.event_log``).

Inside a group of writes (``GroupedWrites``: the events of the documents a run's step reports
together, one transaction), a step's materializations and check evaluations are held back and
sent when the group ends: their event-log rows in one statement, their check rows in one more,
instead of a round trip for each (thirteen a document). Each one's id is taken from the table's
sequence when it is stored, in blocks, so the checks can name their materialization before its row
is written; anything else stored or read on the group's connection meanwhile sends them first.
The rows, ids, notifications and transaction are the ones event-by-event writes leave.

``deploy/dagster.yaml`` names it as ``storage: custom``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from dagster import DagsterEventType, Field, IntSource
from dagster_postgres import DagsterPostgresStorage, PostgresEventLogStorage, PostgresRunStorage
from dagster_postgres.event_log.event_log import CHANNEL_NAME
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
    retry_pg_connection_fn,
)
from sqlalchemy.dialects import postgresql

from ai_pipeline.accelerator import checked
from ai_pipeline.accelerator.acceleration import BACKFILLS
from ai_pipeline.accelerator.backfill_writes import BackfillsComparedAndSet, backfills_wait_for_code
from ai_pipeline.accelerator.event_log import (
    INSERT_CHECK_ROW,
    STEP_EVENTS,
    CheckRowsPerDocument,
    EventsSerializedOnce,
    Group,
    GroupedWrites,
    SummaryKeysParsedOnce,
    WritesRemembered,
    too_many_check_rows,
)
from ai_pipeline.accelerator.internals import (
    ASSET_KEY_INDEX_COLS,
    AssetCheckExecutionsTable,
    AssetKeyTable,
    ConfigurableClassData,
    SqlEventLogStorageTable,
    pg_config,
)
from ai_pipeline.store.database import ping_when_idle

DEFAULT_POOL_SIZE = 1
DEFAULT_MAX_OVERFLOW = 8
DEFAULT_POOL_RECYCLE_SECONDS = 3600

# dagster-postgres's two statements per event as one, built once (``store_event``): the row's
# insert, returning its run and id, and the notification it keeps for older UIs (``NOTIFY
# run_events, '<run id>_<event id>'``), sent by ``pg_notify`` in the same statement: one round trip
# to the server instead of two. A notification goes out when its transaction commits either way.
_EVENT_COLUMNS = (  # the keys of ``_event_to_row``
    "run_id",
    "event",
    "dagster_event_type",
    "timestamp",
    "step_key",
    "asset_key",
    "partition",
)
_INSERTED = (
    SqlEventLogStorageTable.insert()
    .values({c: sa.bindparam(c, type_=SqlEventLogStorageTable.c[c].type) for c in _EVENT_COLUMNS})
    .returning(SqlEventLogStorageTable.c.run_id, SqlEventLogStorageTable.c.id)
    .cte("inserted")
)
_INSERT_EVENT = sa.select(
    _INSERTED.c.run_id,
    _INSERTED.c.id,
    sa.func.pg_notify(CHANNEL_NAME, _INSERTED.c.run_id + "_" + sa.cast(_INSERTED.c.id, sa.Text)),
)

# A group's step events (``_Deferred``) in two statements built once, whatever their number: the
# rows passed as one array per column. The events' rows with the ids taken for them, and each
# one's notification as ``_INSERT_EVENT`` sends it; then the check rows, each the planned row of
# its run and partition updated (``_UPDATE_CHECK_ROW``), returning which were found.
_EVENTS = SqlEventLogStorageTable.name
_TYPES = {"id": "BIGINT", "timestamp": "TIMESTAMP"}  # the rest are TEXT (run_id: VARCHAR)
_EVENT_ARRAY_COLUMNS = ("id", *_EVENT_COLUMNS)
_INSERT_EVENTS = sa.text(
    f"WITH inserted AS (INSERT INTO {_EVENTS} ("
    + ", ".join(f'"{c}"' for c in _EVENT_ARRAY_COLUMNS)
    + ") SELECT * FROM unnest("
    + ", ".join(f"CAST(:{c} AS {_TYPES.get(c, 'TEXT')}[])" for c in _EVENT_ARRAY_COLUMNS)
    + ") RETURNING run_id, id) "
    f"SELECT pg_notify('{CHANNEL_NAME}', run_id || '_' || CAST(id AS TEXT)) FROM inserted"
)
_CHECK_ARRAY_COLUMNS = {
    "n": "INT",
    "asset_key": "TEXT",
    "check_name": "TEXT",
    "run_id": "TEXT",
    "partition": "TEXT",
    "execution_status": "TEXT",
    "evaluation_event": "TEXT",
    "evaluation_event_timestamp": "TIMESTAMP",
    "evaluation_event_storage_id": "BIGINT",
    "materialization_event_storage_id": "BIGINT",
}
_CHECK_KEY = ("asset_key", "check_name", "run_id", "partition")
_UPDATE_CHECK_ROWS = sa.text(
    "WITH v AS (SELECT * FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _CHECK_ARRAY_COLUMNS.items())
    + f") AS v({', '.join(_CHECK_ARRAY_COLUMNS)})), "
    f"updated AS (UPDATE {AssetCheckExecutionsTable.name} AS t SET "
    + ", ".join(f'"{c}" = v."{c}"' for c in list(_CHECK_ARRAY_COLUMNS)[5:] + ["partition"])
    + " FROM v WHERE "
    + " AND ".join(f't."{c}" = v."{c}"' for c in _CHECK_KEY)
    + " RETURNING v.n) SELECT n, count(*) FROM updated GROUP BY n"
)
# Ids for a group's events are taken from the table's own sequence a block at a time, the block
# doubling within a group from the first size up to the largest; a group's unused ids are left
# unused (the sequence has gaps anyway: rolled-back inserts leave them too).
_TAKE_IDS = sa.text(
    f"SELECT nextval(pg_get_serial_sequence('{_EVENTS}', 'id')) FROM generate_series(1, :n)"
)
FIRST_ID_BLOCK = 16
LARGEST_ID_BLOCK = 1024


class _Deferred:
    """A group's step events held back until it ends (or until something else reads or writes
    on its connection), with the ids taken for them and not used yet."""

    def __init__(self) -> None:
        self.ids: deque[int] = deque()
        self.block = FIRST_ID_BLOCK
        self.rows: list[dict[str, Any]] = []
        self.materializations: list[tuple[Any, int]] = []
        self.checks: list[tuple[dict[str, Any], Any]] = []  # a row and its evaluation
        self.check_keys: set[tuple[Any, ...]] = set()
        self.sending = False


# An asset's row as dagster-postgres upserts it for a step's materialization (``_store_asset_event``:
# an insert, or on conflict the same values set), built once: it builds a new statement holding
# the values every time.
_ASSET_ROW_VALUES = ("last_materialization", "last_run_id", "last_materialization_timestamp")
_INSERT_ASSET_ROW = postgresql.insert(AssetKeyTable).values(
    {c: sa.bindparam(c, type_=AssetKeyTable.c[c].type) for c in ("asset_key", *_ASSET_ROW_VALUES)}
)
_UPSERT_ASSET_ROW = _INSERT_ASSET_ROW.on_conflict_do_update(
    index_elements=[AssetKeyTable.c.asset_key],
    set_={c: _INSERT_ASSET_ROW.excluded[c] for c in _ASSET_ROW_VALUES},
)
# The same for the assets of a group's end, one row each, in one statement. The timestamps are
# bound as Dagster binds them (with their zone) and stored as its single-row insert stores them.
_ASSET_ARRAY_TYPES = {
    "asset_key": "TEXT",
    "last_materialization": "TEXT",
    "last_run_id": "TEXT",
    "last_materialization_timestamp": "TIMESTAMPTZ",
}
_UPSERT_ASSET_ROWS = sa.text(
    f"INSERT INTO {AssetKeyTable.name} ({', '.join(_ASSET_ARRAY_TYPES)}) SELECT * FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _ASSET_ARRAY_TYPES.items())
    + ") ON CONFLICT (asset_key) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _ASSET_ROW_VALUES)
)


class _AssetRowsBuiltOnce:
    """Mixin for ``PostgresEventLogStorage``: a step materialization's asset row upserted with
    ``_UPSERT_ASSET_ROW`` (checked against dagster-postgres 0.29.27: its ``_store_asset_event``
    upserts the values of ``_get_asset_entry_values`` so); any other event's as it does."""

    def _store_asset_event(self, conn: Any, event: Any, event_id: int) -> None:
        row = self._asset_row(event, event_id)
        if row is None:
            super()._store_asset_event(conn, event, event_id)  # type: ignore[misc]
        else:
            conn.execute(_UPSERT_ASSET_ROW, row)

    def _asset_row(self, event: Any, event_id: int) -> dict[str, Any] | None:
        """A step materialization's asset row, or None for Dagster's own way."""
        dagster_event = event.dagster_event
        if dagster_event is None or not dagster_event.is_step_materialization:
            return None
        values = self._get_asset_entry_values(  # type: ignore[attr-defined]
            event,
            event_id,
            self.has_secondary_index(ASSET_KEY_INDEX_COLS),  # type: ignore[attr-defined]
        )
        if tuple(values) != _ASSET_ROW_VALUES or dagster_event.asset_key is None:
            return None
        return {"asset_key": dagster_event.asset_key.to_string(), **values}


class PooledPostgresEventLogStorage(
    GroupedWrites,
    SummaryKeysParsedOnce,
    CheckRowsPerDocument,
    EventsSerializedOnce,
    WritesRemembered,
    _AssetRowsBuiltOnce,
    PostgresEventLogStorage,
):
    """dagster-postgres's event log, a run's planned checks written in time proportional to its
    documents, and a group of events in one transaction (``ai_pipeline.accelerator.event_log``)."""

    def store_event(self, event: Any) -> None:
        """dagster-postgres's ``store_event`` for a step's materializations and check evaluations
        — the same rows, notification and transactions (checked against dagster-postgres
        0.29.27) — with the row's values passed as parameters of a statement built once: it builds
        a new insert holding the values for every event, and SQLAlchemy derives its cache key from
        them each time (a sixth of a run worker's CPU on PostgreSQL); and with the insert and the
        notification in one statement (``_INSERT_EVENT``). Inside a group they wait for its end
        (``_defer``)."""
        kind = event.dagster_event_type if event.is_dagster_event else None
        group = self._group()
        if group is not None and not group.flushing:
            if kind in STEP_EVENTS and _deferrable(event):
                self._defer(group, event)
                return
            # Anything else takes its id when it is inserted: the ids taken and not used yet
            # would come after it, out of the order the events were stored in.
            self._send_deferred(group, drop_ids=True)
        if kind not in STEP_EVENTS:
            super().store_event(event)
            return
        with self._connect() as conn:
            event_id = conn.execute(_INSERT_EVENT, self._event_to_row(event)).one()[1]
        if kind == DagsterEventType.ASSET_MATERIALIZATION:
            with self.index_transaction() as conn:
                self._store_asset_event_tags(conn, [event], [event_id])
                self._store_asset_event(conn, event, event_id)
        else:
            self.store_asset_check_event(event, event_id)

    def _store_asset_events(self, conn: Any, events: list[tuple[Any, int]]) -> None:
        """A group's asset rows (one per asset): the step materializations' in one statement."""
        rows = []
        for event, event_id in events:
            row = self._asset_row(event, event_id)
            if row is None:
                self._store_asset_event(conn, event, event_id)
            else:
                rows.append(row)
        if len(rows) == 1:
            conn.execute(_UPSERT_ASSET_ROW, rows[0])
        elif rows:
            conn.execute(_UPSERT_ASSET_ROWS, {c: [r[c] for r in rows] for c in _ASSET_ARRAY_TYPES})

    def _defer(self, group: Group, event: Any) -> None:
        """Holds a step event of ``group`` back until the group ends (``_send_deferred``), under
        the id its row will have: the id its materialization's checks name, and its check row
        names, before the row is written."""
        deferred = group.deferred
        if deferred is None:
            deferred = group.deferred = _Deferred()
        if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            key = _check_key(event)
            if key in deferred.check_keys:  # one statement updates a row once: this one after
                self._send_deferred(group)
            deferred.check_keys.add(key)
        if not deferred.ids:
            taken = self._group_connection().execute(_TAKE_IDS, {"n": deferred.block})
            deferred.ids.extend(sorted(row[0] for row in taken))
            deferred.block = min(2 * deferred.block, LARGEST_ID_BLOCK)
        event_id = deferred.ids.popleft()
        deferred.rows.append({**self._event_to_row(event), "id": event_id})
        if event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION:
            deferred.materializations.append((event, event_id))
            # The asset's row: kept for the group's end, and the latest materialization
            # remembered for the checks (``GroupedWrites``, ``WritesRemembered``).
            self._store_asset_event(None, event, event_id)
        else:
            key_values, values = self._check_row(event, event_id)
            evaluation = event.dagster_event.event_specific_data
            deferred.checks.append(({**key_values, **values}, evaluation))

    def _send_deferred(self, group: Group, *, drop_ids: bool = False) -> None:
        """Writes ``group``'s held-back events: their rows and notifications in one statement,
        their check rows in one more (the rows no run planned inserted after it)."""
        deferred = group.deferred
        if deferred is None or deferred.sending:
            return
        if drop_ids:
            deferred.ids.clear()
        if not deferred.rows:
            return
        deferred.sending = True
        try:
            conn = self._group_connection()
            rows, deferred.rows = deferred.rows, []
            conn.execute(
                _INSERT_EVENTS, {c: [row[c] for row in rows] for c in _EVENT_ARRAY_COLUMNS}
            ).all()
            if deferred.materializations:
                events, ids = zip(*deferred.materializations, strict=True)
                self._store_asset_event_tags(conn, events, ids)
                deferred.materializations = []
            checks, deferred.checks = deferred.checks, []
            deferred.check_keys.clear()
            if checks:
                arrays: dict[str, list[Any]] = {"n": list(range(len(checks)))}
                for column in list(_CHECK_ARRAY_COLUMNS)[1:]:
                    arrays[column] = [row[column] for row, _ in checks]
                updated = dict(conn.execute(_UPDATE_CHECK_ROWS, arrays).all())
                unplanned = [row for n, (row, _) in enumerate(checks) if n not in updated]
                if unplanned:  # no planned row (a run that did not plan this check)
                    conn.execute(INSERT_CHECK_ROW, unplanned)
                for n, count in updated.items():
                    if count > 1:
                        raise too_many_check_rows(count, checks[n][1])
        finally:
            deferred.sending = False

    def _connect(self) -> Any:
        group = self._group()
        if group is None:
            return super()._connect()
        # Whoever reads or writes on the group's connection sees its events written.
        self._send_deferred(group)
        return contextlib.nullcontext(self._group_connection())

    # Connections for groups: READ COMMITTED, as Dagster's own ``index_transaction``. The storage
    # engine's connections commit every statement by themselves (AUTOCOMMIT); without an engine of
    # their own (``PooledPostgresStorage`` makes it), a group switches one of them over and back,
    # which psycopg2 undoes with a statement each time it goes back to the pool.
    _group_engine: Any = None

    def _group_connection(self) -> Any:
        """The group's connection, its transaction begun (``GroupedWrites._grouped``)."""
        if self._group_engine is not None:
            return self._grouped(None, self._group_engine.connect)
        return self._grouped(
            None,
            lambda: self._engine.connect().execution_options(isolation_level="READ COMMITTED"),
        )

    # Whether its engines are the process's (``_process_engines``), kept when it is disposed.
    _engines_kept = False

    def dispose(self) -> None:
        super().dispose()  # its event watcher, if it started one
        if self._group_engine is not None and not self._engines_kept:
            self._group_engine.dispose()


class _PooledPostgresRunStorage(BackfillsComparedAndSet, PostgresRunStorage):
    """dagster-postgres's run storage, whose engine may be the process's (``_process_engines``),
    and which never writes a backfill's planned runs over with a plan made before them
    (``backfill_writes``). The product finds ``BACKFILLS`` on it."""

    ai_pipeline_acceleration = BACKFILLS
    _engines_kept = False

    def dispose(self) -> None:
        if not self._engines_kept:
            super().dispose()


def _deferrable(event: Any) -> bool:
    """Whether a step event can wait for its group's end: a materialization, or the evaluation
    of a partitioned check in a run (the others take Dagster's own ways)."""
    if event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION:
        return True
    evaluation = event.dagster_event.event_specific_data
    return evaluation.partition is not None and bool(event.run_id)


def _check_key(event: Any) -> tuple[Any, ...]:
    evaluation = event.dagster_event.event_specific_data
    return (evaluation.asset_key, evaluation.check_name, event.run_id, evaluation.partition)


@dataclass(frozen=True)
class _Engines:
    """The pooled engines of one database (one per storage, and one for groups of writes), and
    what its storages found of Dagster's secondary indexes (dagster-postgres asks once a storage,
    on a second connection while the first is held: a connection opened and closed each time)."""

    runs: sa.Engine
    events: sa.Engine
    schedules: sa.Engine
    groups: sa.Engine
    secondary_indexes: dict[str, bool] = field(default_factory=dict)
    built_indexes: dict[str, bool] = field(default_factory=dict)

    def dispose(self, *, close: bool = True) -> None:
        """Close their connections (``close=False``: forget them, for a fork's child)."""
        for engine in (self.runs, self.events, self.schedules, self.groups):
            engine.dispose(close=close)


def _make_engines(
    postgres_url: str, token_provider: Any, pool_size: int, max_overflow: int, pool_recycle: int
) -> _Engines:
    def engine(isolation_level: str) -> sa.Engine:
        return ping_when_idle(
            create_pg_engine(
                postgres_url,
                token_provider,
                isolation_level=isolation_level,
                pool_size=pool_size,
                max_overflow=max_overflow,
                pool_recycle=pool_recycle,
            )
        )

    # Each storage connects through its ``_engine`` alone (checked against dagster-postgres
    # 0.29.27: ``_connect`` → ``create_pg_connection(self._engine)``), in AUTOCOMMIT as its own.
    return _Engines(
        runs=engine("AUTOCOMMIT"),
        events=engine("AUTOCOMMIT"),
        schedules=engine("AUTOCOMMIT"),
        groups=engine("READ COMMITTED"),
    )


# A process builds a new Dagster instance, so a new storage, for many things it does: a code server
# for every tick of every sensor. Each kept the engines it made, so every tick connected anew (a
# server process forked for each connection) and asked the catalog whether Dagster's tables
# exist: at rest, with this package's sensors, about four new connections a second. The engines
# are the process's instead, one set per database, the most recent few kept; a fork's child (a
# Celery worker's pool) starts with none and leaves its parent's connections alone.
KEPT_DATABASES = 4
_KEPT: OrderedDict[tuple[str, int, int, int], _Engines] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _process_engines(
    postgres_url: str, pool_size: int, max_overflow: int, pool_recycle: int
) -> _Engines:
    key = (postgres_url, pool_size, max_overflow, pool_recycle)
    with _KEPT_LOCK:
        engines = _KEPT.get(key)
        if engines is None:
            engines = _make_engines(postgres_url, None, pool_size, max_overflow, pool_recycle)
            _KEPT[key] = engines
            while len(_KEPT) > KEPT_DATABASES:
                # Its connections closed; a storage that still has them connects again.
                _KEPT.popitem(last=False)[1].dispose()
        else:
            _KEPT.move_to_end(key)
        return engines


def _forget_kept_engines() -> None:
    global _KEPT_LOCK  # another thread of the parent may have held it at the fork
    _KEPT_LOCK = threading.Lock()
    for engines in _KEPT.values():
        engines.dispose(close=False)  # the parent's connections stay the parent's
    _KEPT.clear()


os.register_at_fork(after_in_child=_forget_kept_engines)

_DAGSTER_TABLES = ("runs", "instance_info", "event_logs")


def _tables_missing(engine: sa.Engine) -> bool:
    """Whether one of the tables whose absence makes dagster-postgres create its tables is missing
    (its storages' own checks, on a kept connection instead of a new one for each)."""
    names = set(retry_pg_connection_fn(lambda: sa.inspect(engine).get_table_names()))
    return any(t not in names for t in _DAGSTER_TABLES) or not names & {"schedules", "jobs"}


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` whose storages keep their connections between calls, and
    between the instances of a process."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        max_overflow: int = DEFAULT_MAX_OVERFLOW,
        pool_recycle: int = DEFAULT_POOL_RECYCLE_SECONDS,
    ):
        backfills_wait_for_code()
        kept = token_provider is None  # a token provider's engines are the storage's own
        engines = (
            _process_engines(postgres_url, pool_size, max_overflow, pool_recycle)
            if kept
            else _make_engines(postgres_url, token_provider, pool_size, max_overflow, pool_recycle)
        )
        super().__init__(
            postgres_url,
            should_autocreate_tables and _tables_missing(engines.runs),
            inst_data=inst_data,
            token_provider=token_provider,
        )
        self.should_autocreate_tables = should_autocreate_tables
        # Its tables exist now (made above when due): the run storage and the event log with the
        # project's changes, on the engines above.
        self._event_log_storage.dispose()
        self._run_storage.dispose()
        self._event_log_storage = PooledPostgresEventLogStorage(
            postgres_url, should_autocreate_tables=False, token_provider=token_provider
        )
        self._run_storage = _PooledPostgresRunStorage(
            postgres_url, should_autocreate_tables=False, token_provider=token_provider
        )
        for storage, engine in (
            (self._run_storage, engines.runs),
            (self._event_log_storage, engines.events),
            (self._schedule_storage, engines.schedules),
        ):
            storage._engine.dispose()  # dagster-postgres's, never connected
            storage._engine = engine
        self._event_log_storage._group_engine = engines.groups
        self._event_log_storage._secondary_index_cache = engines.secondary_indexes
        self._run_storage._index_migration_cache = engines.built_indexes
        self._run_storage._engines_kept = self._event_log_storage._engines_kept = kept

    @classmethod
    def config_type(cls) -> Any:
        base: dict[str, Any] = dict(pg_config())  # type: ignore[arg-type]
        return {
            **base,
            "pool_size": Field(IntSource, is_required=False, default_value=DEFAULT_POOL_SIZE),
            "max_overflow": Field(IntSource, is_required=False, default_value=DEFAULT_MAX_OVERFLOW),
            "pool_recycle": Field(
                IntSource, is_required=False, default_value=DEFAULT_POOL_RECYCLE_SECONDS
            ),
        }

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> PooledPostgresStorage:
        if not checked():
            return DagsterPostgresStorage(  # type: ignore[return-value]
                pg_url_from_config(config_value),
                config_value.get("should_autocreate_tables", True),
                inst_data=inst_data,
                token_provider=get_token_provider_from_config(config_value),
            )
        return cls(
            pg_url_from_config(config_value),
            config_value.get("should_autocreate_tables", True),
            inst_data=inst_data,
            token_provider=get_token_provider_from_config(config_value),
            pool_size=config_value.get("pool_size", DEFAULT_POOL_SIZE),
            max_overflow=config_value.get("max_overflow", DEFAULT_MAX_OVERFLOW),
            pool_recycle=config_value.get("pool_recycle", DEFAULT_POOL_RECYCLE_SECONDS),
        )


def storage_yaml(postgres_db: dict[str, Any] | None = None, postgres_url: str | None = None) -> str:
    """The ``storage`` section of a ``dagster.yaml`` that puts an instance on this storage."""
    lines = [
        "storage:",
        "  custom:",
        "    module: ai_pipeline.accelerator.postgres",
        "    class: PooledPostgresStorage",
        "    config:",
    ]
    if postgres_url is not None:
        lines.append(f"      postgres_url: {postgres_url}")
    if postgres_db is not None:
        lines.append("      postgres_db:")
        lines += [f"        {key}: {value}" for key, value in postgres_db.items()]
    return "\n".join(lines) + "\n"
