"""The embedded default's event log: Dagster's SQLite storage, keeping its connections.

Dagster 1.13's ``SqliteEventLogStorage`` builds a SQLAlchemy engine for every connection and
disposes of it afterwards, so every event write compiled its statements again, opened the file,
committed with an fsync and closed it — and closing the last connection to a WAL database copies
the WAL into the database file and fsyncs that too. A run of the analysis job writes nine events
per document from its step's thread; on two cores four such runs could not write them as fast as
their documents finished (an event write took ~12 ms; ``benchmarks/README.md``), so their runs
went on for minutes after their last LLM call. This subclass keeps one engine per shard (the
index and the most recent runs, ``ENGINES`` at most), each with its connection kept open between
writes, in WAL mode with ``synchronous=NORMAL`` (the results database's setting: a commit is
durable against a crash of the process, and only a power loss can take the last ones).

Other processes see every write at once, as WAL readers do. Dagster's UI learns of a run's new
events from the file system: its watcher looked at the database file only, which a connection
kept open no longer touches on every commit, so the watcher here looks at the WAL file too.
``wipe`` closes the connections before the files are deleted.

It also keeps the keys of each dynamic partitions definition it has read. Dagster reads the whole
list whenever it resolves a range of dynamic partitions — for every asset of every range run it
creates — so at 50,000 documents a sensor tick creating 20 runs spent nine tenths of its time
fetching the same 50,000 keys again (``benchmarks/README.md``). ``get_dynamic_partitions`` now
asks the database only for a fingerprint of the definition's rows (largest id, count, the newest
key: two indexed queries), fetches just the rows added since when only rows were added, and
everything again when any was deleted; the database stays the truth for every process. It asks
on a connection of its own, outside the lock the process's threads take for the event log
(``_db_lock``): the fingerprint reads the definition's whole index (24 ms at 100,000 documents on
a busy machine), and the daemon's threads that create runs (six by default) each ask for it for
every planned event, so holding that lock they waited for each other most of the time a run took
to create — over the 120 s after which Dagster's run monitoring fails a run that has not started.

``dagster.yaml`` names it as ``event_log_storage``; ``base_dir`` defaults to
``$DAGSTER_HOME/storage``, where Dagster's own default keeps these files.

The run and schedule storage (``EngineReusingSqliteRunStorage``,
``EngineReusingSqliteScheduleStorage``) are Dagster's too, with two costs taken out of what a
deployment does when nothing happens. Dagster builds a new instance for every sensor tick in the
code server (every 2 s for the backfill planner), and building a run or schedule storage loads
every alembic migration script to compare the database's revision with the head: 60 % of an idle
code server's CPU. It acts on the answer only when the database has no revision yet (it creates
the tables and stamps them), so that is all that is asked now, in one query: a database with a
revision and its tables is opened as it is, any other goes through Dagster's ``from_local``. And
every statement of the daemon's loops opened a new engine and connection, and asked SQLite for its
table list (``has_instigators_table`` and the like, before each tick's reads and writes): the
connections are kept here, and a table, column or index once seen is not looked for again
(migrations only add them; ``wipe`` deletes rows, not tables). ``dagster.yaml`` names them as
``run_storage`` and ``schedule_storage``, on Dagster's own files (``$DAGSTER_HOME/history/runs.db``,
``$DAGSTER_HOME/schedules/schedules.db``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, ClassVar

from dagster import DagsterEventType
from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

from ai_pipeline.accelerator import checked
from ai_pipeline.accelerator.acceleration import BACKFILLS
from ai_pipeline.accelerator.backfill_writes import BackfillsComparedAndSet, backfills_wait_for_code
from ai_pipeline.accelerator.event_log import (
    INDEX,
    STEP_EVENTS,
    CheckRowsPerDocument,
    EventsSerializedOnce,
    GroupedWrites,
    SummaryKeysParsedOnce,
    WritesRemembered,
    batch_planned_events,
)
from ai_pipeline.accelerator.internals import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    ConfigurableClassData,
    DynamicPartitionsTable,
    SqlEventLogStorageTable,
    SqliteEventLogStorage,
    SqliteEventLogStorageWatchdog,
    SqliteRunStorage,
    SqliteScheduleStorage,
    create_db_conn_string,
)

ENGINES = 32

# The insert of an event-log row, one statement for every row (``store_event``).
_INSERT_EVENT = SqlEventLogStorageTable.insert()


class _WatchdogOnWal(SqliteEventLogStorageWatchdog):
    """Dagster's watcher of a run's events, told of writes to the run's WAL file as well."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._patterns = [self._log_path, f"{self._log_path}-wal"]

    def on_modified(self, event: Any) -> None:
        self._process_log()


class EngineReusingSqliteEventLogStorage(
    GroupedWrites,
    SummaryKeysParsedOnce,
    CheckRowsPerDocument,
    EventsSerializedOnce,
    WritesRemembered,
    SqliteEventLogStorage,
):
    """``SqliteEventLogStorage`` with one engine and open connection per shard instead of an
    engine per connection (and a run's planned checks written in time proportional to its
    documents, ``defs.event_log``)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_lock = threading.Lock()
        # Per definition: the fingerprint of its rows when read, and its keys in id order.
        self._partition_keys: dict[str, tuple[tuple[int, int, str | None], list[str]]] = {}
        self._partition_keys_lock = threading.Lock()
        super().__init__(base_dir, inst_data=inst_data)
        batch_planned_events()

    @classmethod
    def config_type(cls) -> Any:
        from dagster import Field, StringSource

        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> EngineReusingSqliteEventLogStorage:
        base_dir = config_value.get("base_dir")
        if not base_dir:
            home = os.environ.get("DAGSTER_HOME")
            if not home:
                raise ValueError("set DAGSTER_HOME, or base_dir in the event_log_storage config")
            base_dir = os.path.join(home, "storage")
        if not checked():
            return SqliteEventLogStorage(base_dir, inst_data=inst_data)  # type: ignore[return-value]
        return cls(base_dir, inst_data=inst_data)

    def _engine(self, shard: str) -> Engine:
        with self._engines_lock:  # taken under _db_lock, or alone (``_reading``)
            engine = self._engines.get(shard)
            if engine is not None:
                self._engines.move_to_end(shard)
                return engine
            engine = create_engine(
                self.conn_string_for_shard(shard),
                # Every use of a shard but the reads of ``_reading`` holds the storage's lock:
                # one connection serves it, a second the reads.
                poolclass=QueuePool,
                pool_size=2,
                max_overflow=2,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            )
            event.listen(engine, "connect", _wal_normal)
            self._engines[shard] = engine
            while len(self._engines) > ENGINES:
                _, oldest = self._engines.popitem(last=False)
                oldest.dispose()
            return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        if self._group() is not None:  # this thread holds the lock for its group
            yield self._grouped(shard, lambda: self._ready(shard).connect())
            return
        with self._db_lock, self._ready(shard).connect() as conn, conn.begin():
            yield conn

    def store_event(self, event: Any) -> None:
        """Dagster's ``store_event`` for a step's materializations and check evaluations — the
        same rows in the same transactions — with the row's values passed as parameters of one
        insert statement: Dagster builds a new statement holding the values for every event, and
        SQLAlchemy derives its cache key from them each time (about a sixth of a run's step)."""
        kind = event.dagster_event_type if event.is_dagster_event else None
        if kind not in STEP_EVENTS:
            super().store_event(event)
            return
        row = self._event_to_row(event)
        with self.run_connection(event.run_id) as conn:
            conn.execute(_INSERT_EVENT, row)
        with self.index_transaction() as conn:
            inserted = conn.execute(_INSERT_EVENT, row).inserted_primary_key
            event_id = inserted[0] if inserted else None
            if event_id is None:
                raise ValueError(f"no storage id for an event of run {event.run_id}")
            if kind == DagsterEventType.ASSET_MATERIALIZATION:
                self._store_asset_event_tags(conn, [event], [event_id])
                self._store_asset_event(conn, event, event_id)
        if kind == DagsterEventType.ASSET_CHECK_EVALUATION:
            self.store_asset_check_event(event, event_id)

    def store_event_batch(self, events: Sequence[Any]) -> None:
        """A batch Dagster hands over (the planned events of a run it creates:
        ``batch_planned_events``), in one group."""
        with self.grouped_writes():
            for event in events:
                self.store_event(event)

    def _ready(self, shard: str) -> Engine:
        engine = self._engine(shard)
        if shard not in self._initialized_dbs:
            self._initdb(engine)
            self._initialized_dbs.add(shard)
        return engine

    def _group_lock(self) -> Any:
        return self._db_lock

    def watch(self, run_id: str, cursor: str | None, callback: Any) -> None:
        """Dagster's ``watch``, with a watcher that also follows the run's WAL file."""
        from watchdog.observers import Observer

        observer: Any = self._obs
        if not observer:
            observer = self._obs = Observer()  # type: ignore[assignment]
            observer.start()
        watchdog = _WatchdogOnWal(self, run_id, callback, cursor)
        self._watchers[run_id][callback] = (
            watchdog,
            observer.schedule(watchdog, self._base_dir, recursive=True),
        )

    def wipe(self) -> None:
        self._close_engines()  # the files are about to be deleted
        super().wipe()

    def _close_engines(self) -> None:
        with self._db_lock, self._engines_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()

    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]:
        table = DynamicPartitionsTable
        mine = table.c.partitions_def_name == partitions_def_name
        with self._reading() as conn:
            # SQLite gives a new row the largest id + 1, so a deleted newest row's id comes back:
            # the key under the largest id is in the fingerprint too.
            last, count = conn.execute(
                select(func.coalesce(func.max(table.c.id), 0), func.count()).where(mine)
            ).one()
            newest = conn.execute(
                select(table.c.partition).where(mine, table.c.id == last)
            ).scalar()
            fingerprint = (int(last), int(count), newest)
            with self._partition_keys_lock:
                known = self._partition_keys.get(partitions_def_name)
            if known is not None and known[0] == fingerprint:
                return list(known[1])
            keys: list[str] = []
            if known is not None and known[0][0] <= last:
                added = conn.execute(
                    select(table.c.partition)
                    .where(mine, table.c.id > known[0][0])
                    .order_by(table.c.id)
                ).scalars()
                keys = [*known[1], *added]
            if (len(keys), keys[-1] if keys else None) != (count, newest):
                # A key was deleted, or nothing was known: read them all.
                keys = list(
                    conn.execute(
                        select(table.c.partition).where(mine).order_by(table.c.id)
                    ).scalars()
                )
            with self._partition_keys_lock:
                self._partition_keys[partitions_def_name] = (fingerprint, keys)
            return list(keys)

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A connection to the index for reads alone, outside the process's lock of its writes
        (``_db_lock``): a WAL database has readers while another connection writes. In a group of
        this thread's, the group's connection, which sees what the group wrote."""
        if self._group() is not None:
            with self._connect(INDEX) as conn:
                yield conn
            return
        with self._ready(INDEX).connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        self._close_engines()
        super().dispose()


_ENGINE_LOCK = threading.Lock()


def _built(
    base_dir: str,
    name: str,
    tables: tuple[str, ...],
    build: Callable[[], Any],
    build_ready: Callable[[str], Any],
) -> Any:
    """Dagster's ``from_local`` (``build()``) for a database that is not there yet or has no
    alembic revision — the only case where it does more than load every migration script to compare
    revisions; ``build_ready(conn_string)`` for one that has a revision and ``tables``."""
    path = os.path.join(base_dir, f"{name}.db")
    if not os.path.exists(path):
        return build()
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_SECONDS)) as db:
            revision = db.execute("SELECT version_num FROM alembic_version").fetchone()
            present = {
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
    except sqlite3.Error:
        return build()
    if revision is None or not revision[0] or not set(tables) <= present:
        return build()
    return build_ready(create_db_conn_string(base_dir, name))


def _base_dir(config_value: dict[str, Any], default: str) -> str:
    base_dir = config_value.get("base_dir")
    if base_dir:
        return str(base_dir)
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise ValueError("set DAGSTER_HOME, or base_dir in the storage's config")
    return os.path.join(home, default)


class _KeptConnections:
    """Dagster's ``from_local`` only for a database that needs it (``_built``), ``connect``
    through one engine per storage with its connections kept open between uses, and the
    schema's tables, columns and indexes remembered once seen; ``FOLDER`` (under
    ``$DAGSTER_HOME``), ``DATABASE`` and ``TABLES`` say which database."""

    FOLDER: ClassVar[str]
    DATABASE: ClassVar[str]
    TABLES: ClassVar[tuple[str, ...]]
    # Dagster's own class, built instead on a release the accelerator was not checked against.
    STOCK: ClassVar[Any]
    _conn_string: str

    @classmethod
    def config_type(cls) -> Any:
        from dagster import Field, StringSource

        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> Any:
        base_dir = _base_dir(config_value, cls.FOLDER)
        if not checked():
            return cls.STOCK.from_local(base_dir, inst_data=inst_data)
        return cls.from_local(base_dir, inst_data=inst_data)

    @classmethod
    def from_local(cls, base_dir: str, inst_data: ConfigurableClassData | None = None) -> Any:
        return _built(
            base_dir,
            cls.DATABASE,
            cls.TABLES,
            partial(super().from_local, base_dir, inst_data),  # type: ignore[misc]
            lambda conn_string: cls(conn_string, inst_data),  # type: ignore[call-arg]
        )

    def _kept_engine(self) -> Engine:
        engine: Engine | None = self.__dict__.get("_kept")
        if engine is None:
            with _ENGINE_LOCK:
                engine = self.__dict__.get("_kept")
                if engine is None:
                    engine = self.__dict__["_kept"] = create_engine(
                        self._conn_string,
                        # The daemon's threads share it; a connection beyond two is closed after use.
                        poolclass=QueuePool,
                        pool_size=2,
                        max_overflow=-1,
                        connect_args={"check_same_thread": False},
                    )
        return engine

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._kept_engine().connect() as conn, conn.begin():
            yield conn

    def _present(self, key: tuple[str, ...], look: Callable[[], bool]) -> bool:
        seen: set[tuple[str, ...]] = self.__dict__.setdefault("_seen", set())
        if key in seen:
            return True
        present = look()
        if present:
            seen.add(key)
        return present

    def has_built_index(self, migration_name: str) -> bool:
        return self._present(
            ("index", migration_name),
            partial(super().has_built_index, migration_name),  # type: ignore[misc]
        )

    def dispose(self) -> None:
        engine: Engine | None = self.__dict__.pop("_kept", None)
        if engine is not None:
            engine.dispose()
        super().dispose()  # type: ignore[misc]


class EngineReusingSqliteRunStorage(BackfillsComparedAndSet, _KeptConnections, SqliteRunStorage):
    """Dagster's SQLite run storage (``$DAGSTER_HOME/history/runs.db``), its schema checked only
    when it has none, its connections kept, and a backfill's planned runs never written over by a
    plan made before them (``backfill_writes``). The product finds ``BACKFILLS`` on it."""

    FOLDER, DATABASE, TABLES = "history", "runs", ("runs", "instance_info")
    STOCK = SqliteRunStorage
    ai_pipeline_acceleration = BACKFILLS

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> Any:
        storage = super().from_config_value(inst_data, config_value)
        if isinstance(storage, cls):
            backfills_wait_for_code()
        return storage

    def has_run_stats_index_cols(self) -> bool:
        return self._present(("run stats columns",), super().has_run_stats_index_cols)

    def has_bulk_actions_selector_cols(self) -> bool:
        return self._present(
            ("bulk action selector columns",), super().has_bulk_actions_selector_cols
        )

    def has_backfill_id_column(self) -> bool:
        return self._present(("backfill id column",), super().has_backfill_id_column)

    def has_bulk_action_job_name_column(self) -> bool:
        return self._present(
            ("bulk action job name column",), super().has_bulk_action_job_name_column
        )

    def has_backfill_tags_table(self) -> bool:
        return self._present(("backfill tags table",), super().has_backfill_tags_table)


class EngineReusingSqliteScheduleStorage(_KeptConnections, SqliteScheduleStorage):
    """Dagster's SQLite schedule storage (``$DAGSTER_HOME/schedules/schedules.db``: sensor and
    schedule states and ticks), its schema checked only when it has none and its connections
    kept."""

    FOLDER, DATABASE, TABLES = "schedules", "schedules", ("jobs", "job_ticks")
    STOCK = SqliteScheduleStorage

    def has_instigators_table(self) -> bool:
        return self._present(("instigators table",), super().has_instigators_table)

    def has_secondary_index_table(self) -> bool:
        return self._present(("secondary index table",), super().has_secondary_index_table)


def _wal_normal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


# The sections of the checkout's ``dagster.yaml`` that put a storage on SQLite.
_SQLITE_SECTIONS = ("event_log_storage:", "run_storage:", "schedule_storage:")


def without_sqlite_storage(instance_yaml: str) -> str:
    """A ``dagster.yaml`` without its top-level ``event_log_storage``, ``run_storage`` and
    ``schedule_storage`` sections: for putting the instance on PostgreSQL (``storage: postgres``),
    which Dagster refuses beside them."""
    kept, skipping = [], False
    for line in instance_yaml.splitlines(keepends=True):
        if line and not line[0].isspace() and not line.startswith("#"):
            skipping = line.startswith(_SQLITE_SECTIONS)
        if not skipping:
            kept.append(line)
    return "".join(kept)
