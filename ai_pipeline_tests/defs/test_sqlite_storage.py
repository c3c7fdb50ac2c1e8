"""The embedded default's event log keeps the keys of dynamic partitions, and stays exact: keys
added or deleted through another storage (another process) are seen at the next read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from dagster._core.events import AssetMaterializationPlannedData

from ai_pipeline.accelerator.sqlite import EngineReusingSqliteEventLogStorage


def test_dynamic_partition_keys_follow_every_writer(tmp_path: Path) -> None:
    reader = EngineReusingSqliteEventLogStorage(str(tmp_path))
    writer = EngineReusingSqliteEventLogStorage(str(tmp_path))  # as another process would
    assert reader.get_dynamic_partitions("documents") == []
    writer.add_dynamic_partitions("documents", ["a", "b", "c"])
    writer.add_dynamic_partitions("other", ["x"])
    assert reader.get_dynamic_partitions("documents") == ["a", "b", "c"]
    writer.add_dynamic_partitions("documents", ["d", "b"])  # "b" is there already
    assert reader.get_dynamic_partitions("documents") == ["a", "b", "c", "d"]
    writer.delete_dynamic_partition("documents", "b")
    assert reader.get_dynamic_partitions("documents") == ["a", "c", "d"]
    writer.delete_dynamic_partition("documents", "d")  # the newest: the largest id goes down
    writer.add_dynamic_partitions("documents", ["e"])
    assert reader.get_dynamic_partitions("documents") == ["a", "c", "e"]
    writer.delete_dynamic_partition("documents", "a")
    writer.add_dynamic_partitions("documents", ["f"])  # count unchanged, largest id up
    assert reader.get_dynamic_partitions("documents") == ["c", "e", "f"]
    # What the reader hands out is its caller's to change.
    keys = reader.get_dynamic_partitions("documents")
    keys.append("mutated")  # type: ignore[attr-defined]
    assert reader.get_dynamic_partitions("documents") == ["c", "e", "f"]
    assert reader.get_dynamic_partitions("other") == ["x"]
    reader.dispose()
    writer.dispose()


def test_partition_keys_are_read_while_another_thread_holds_the_write_lock(tmp_path: Path) -> None:
    """The daemon's threads that create runs each read the partition keys for every planned
    event: the read does not wait for the lock the process's event-log writes hold (a group of
    them holds it for its whole transaction), and still sees what another writer added."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    storage = EngineReusingSqliteEventLogStorage(str(tmp_path))
    writer = EngineReusingSqliteEventLogStorage(str(tmp_path))
    writer.add_dynamic_partitions("documents", ["a", "b"])
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with storage._db_lock:
            held.set()
            release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(hold_the_lock)
        assert held.wait(10)
        try:
            read = pool.submit(storage.get_dynamic_partitions, "documents")
            assert read.result(timeout=10) == ["a", "b"]
            writer.add_dynamic_partitions("documents", ["c"])
            read = pool.submit(storage.get_dynamic_partitions, "documents")
            assert read.result(timeout=10) == ["a", "b", "c"]
        finally:
            release.set()
        holder.result()
    storage.dispose()
    writer.dispose()


def test_a_runs_planned_events_are_one_batch_written_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage has Dagster batch a run's planned events (``DAGSTER_EVENT_BATCH_SIZE``, unless
    the deployment set it), and writes a batch in one transaction: a batch whose last event fails
    leaves none of them (Dagster then writes them one by one)."""
    import dagster as dg
    from dagster._core.events import DagsterEvent
    from dagster._core.events.log import EventLogEntry

    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    storage = EngineReusingSqliteEventLogStorage(str(tmp_path))
    assert os.environ["DAGSTER_EVENT_BATCH_SIZE"] == "100"
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "7")
    EngineReusingSqliteEventLogStorage(str(tmp_path)).dispose()
    assert os.environ["DAGSTER_EVENT_BATCH_SIZE"] == "7"

    def planned(key: str) -> EventLogEntry:
        event = DagsterEvent.build_asset_materialization_planned_event(
            "__ASSET_JOB", "analyse", AssetMaterializationPlannedData(dg.AssetKey(key))
        )
        return EventLogEntry(
            error_info=None,
            level="debug",
            user_message="",
            run_id="r1",
            timestamp=time.time(),
            dagster_event=event,
        )

    store_event = storage.store_event
    written: list[str] = []

    def failing_third(event: EventLogEntry) -> None:
        if len(written) == 2:
            raise RuntimeError("the disk is full")
        store_event(event)
        written.append(event.dagster_event.asset_key.to_user_string())  # type: ignore[union-attr]

    monkeypatch.setattr(storage, "store_event", failing_third)
    with pytest.raises(RuntimeError):
        storage.store_event_batch([planned("a"), planned("b"), planned("c")])
    assert written == ["a", "b"]
    assert storage.get_logs_for_run("r1") == []
    monkeypatch.setattr(storage, "store_event", store_event)
    storage.store_event_batch([planned("a"), planned("b"), planned("c")])
    assert len(storage.get_logs_for_run("r1")) == 3
    storage.dispose()


def test_planned_checks_are_dagsters_rows_each_with_its_own_partitions_event(
    tmp_path: Path,
) -> None:
    """A run's planned check over a range of documents writes, through the project's event log,
    the asset_check_executions rows Dagster's own storage writes — one per document, the same
    columns — except that each row's event is the planned event of that row's document alone
    (Dagster puts the whole run's event, every key of the range, in every row), and Dagster reads
    them back as the same PLANNED executions."""
    import time

    import dagster as dg
    import sqlalchemy as sa
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationPlanned,
    )
    from dagster._core.events import DagsterEvent, DagsterEventType
    from dagster._core.events.log import EventLogEntry
    from dagster._serdes import deserialize_value

    from ai_pipeline.accelerator.internals import AssetCheckExecutionsTable, SqliteEventLogStorage

    documents = dg.DynamicPartitionsDefinition(name="documents")
    keys = [f"{i:016x}" for i in range(300)]
    subset = documents.empty_subset().with_partition_keys(keys)
    check_key = dg.AssetCheckKey(dg.AssetKey("llm_analysis"), "schema")
    event = EventLogEntry(
        error_info=None,
        level="DEBUG",
        user_message="",
        run_id="r1",
        timestamp=time.time(),
        dagster_event=DagsterEvent(
            event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value,
            job_name="j",
            event_specific_data=AssetCheckEvaluationPlanned(
                asset_key=check_key.asset_key, check_name=check_key.name, partitions_subset=subset
            ),
        ),
    )
    written, history = {}, {}
    for name, cls in (
        ("dagster", SqliteEventLogStorage),
        ("ours", EngineReusingSqliteEventLogStorage),
    ):
        storage = cls(str(tmp_path / name))
        storage.store_event(event)
        with storage.index_connection() as conn:
            rows = conn.execute(
                sa.select(AssetCheckExecutionsTable).order_by(AssetCheckExecutionsTable.c.partition)
            ).all()
        history[name] = storage.get_asset_check_execution_history(check_key, limit=1000)
        storage.dispose()
        written[name] = [{k: v for k, v in r._mapping.items() if k != "id"} for r in rows]
    ours, theirs = written["ours"], written["dagster"]
    assert [r["partition"] for r in ours] == sorted(keys)

    def without_event(rows: list[dict]) -> list[dict]:
        # create_timestamp is the database's clock at the insert, a second apart or not.
        skip = ("evaluation_event", "create_timestamp")
        return [{k: v for k, v in r.items() if k not in skip} for r in rows]

    for a, b in zip(without_event(ours), without_event(theirs), strict=True):
        assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    for row in ours:
        planned = deserialize_value(row["evaluation_event"], EventLogEntry)
        assert planned.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED
        assert planned.run_id == "r1" and planned.timestamp == event.timestamp
        data = planned.dagster_event.event_specific_data
        assert (data.asset_key, data.check_name) == (check_key.asset_key, check_key.name)
        assert list(data.partitions_subset.get_partition_keys()) == [row["partition"]]
    # Dagster's rows hold the whole event each: 300 copies of every key.
    size = {name: sum(len(r["evaluation_event"]) for r in rows) for name, rows in written.items()}
    assert size["ours"] * 5 < size["dagster"]
    assert sorted((r.partition, r.status, r.run_id) for r in history["ours"]) == sorted(
        (r.partition, r.status, r.run_id) for r in history["dagster"]
    )
    assert len(history["ours"]) == len(keys)


def test_the_check_table_is_looked_up_once_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster asks whether the asset-check table exists before every check evaluation it stores;
    the project's event log asks the database until the table is there, then never again."""
    storage = EngineReusingSqliteEventLogStorage(str(tmp_path))
    asked: list[str] = []
    real = storage.has_table

    def has_table(name: str) -> bool:
        asked.append(name)
        return real(name)

    monkeypatch.setattr(storage, "has_table", has_table)
    assert all(storage.supports_asset_checks for _ in range(20))
    assert len(asked) == 1
    storage.dispose()


def _log_entry(run_id: str, message: str) -> object:
    import time

    from dagster._core.events.log import EventLogEntry

    return EventLogEntry(
        error_info=None,
        level="INFO",
        user_message=message,
        run_id=run_id,
        timestamp=time.time(),
    )


def _messages(storage: EngineReusingSqliteEventLogStorage, run_id: str) -> list[str]:
    return [r.event_log_entry.user_message for r in storage.get_records_for_run(run_id).records]


def test_a_shard_keeps_one_connection_and_writes_without_an_fsync_per_event(
    tmp_path: Path,
) -> None:
    """Events written one after another go through one kept connection per shard (Dagster's
    storage opened and closed one per event), in WAL mode with synchronous=NORMAL; another
    storage sees every one of them at once."""
    import sqlalchemy as sa

    writer = EngineReusingSqliteEventLogStorage(str(tmp_path))
    reader = EngineReusingSqliteEventLogStorage(str(tmp_path))
    opened: list[str] = []

    def on_connect(dbapi_connection: object, _record: object) -> None:
        opened.append(dbapi_connection.execute("PRAGMA database_list").fetchone()[2])  # type: ignore[attr-defined]

    writer.store_event(_log_entry("run-a", "event 0"))  # type: ignore[arg-type]  # creates it
    sa.event.listen(sa.engine.Engine, "connect", on_connect)
    try:
        for i in range(1, 50):
            writer.store_event(_log_entry("run-a", f"event {i}"))  # type: ignore[arg-type]
        assert opened == []
        assert _messages(reader, "run-a") == [f"event {i}" for i in range(50)]
        with writer.run_connection("run-a") as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    finally:
        sa.event.remove(sa.engine.Engine, "connect", on_connect)
        writer.dispose()
        reader.dispose()


def test_the_ui_watching_a_run_is_told_of_events_written_through_a_kept_connection(
    tmp_path: Path,
) -> None:
    """Dagster's UI follows a running run through ``watch``, which learns of new events from the
    file system. A connection kept open writes to the WAL file, not the database file: the
    watcher hears of it all the same."""
    import threading

    writer = EngineReusingSqliteEventLogStorage(str(tmp_path))
    watcher = EngineReusingSqliteEventLogStorage(str(tmp_path))  # the webserver's
    seen: list[str] = []
    arrived = threading.Event()

    def callback(entry: object, _cursor: str) -> None:
        seen.append(entry.user_message)  # type: ignore[attr-defined]
        if "second" in seen:
            arrived.set()

    try:
        writer.store_event(_log_entry("run-b", "first"))  # type: ignore[arg-type]
        watcher.watch("run-b", None, callback)
        writer.store_event(_log_entry("run-b", "second"))  # type: ignore[arg-type]
        assert arrived.wait(15), f"the watcher heard of {seen}"
        assert seen[-1] == "second"
    finally:
        watcher.end_watch("run-b", callback)
        writer.dispose()
        watcher.dispose()


def test_events_written_after_a_wipe_land_in_the_new_files(tmp_path: Path) -> None:
    """``wipe`` deletes the runs' files: a storage that kept a connection to one writes the next
    events to a new file that every other storage reads, not to the deleted one."""
    storage = EngineReusingSqliteEventLogStorage(str(tmp_path))
    try:
        storage.store_event(_log_entry("run-c", "before"))  # type: ignore[arg-type]
        storage.wipe()
        storage.store_event(_log_entry("run-c", "after"))  # type: ignore[arg-type]
        fresh = EngineReusingSqliteEventLogStorage(str(tmp_path))
        assert _messages(fresh, "run-c") == ["after"]
        fresh.dispose()
    finally:
        storage.dispose()


def test_a_steps_materializations_and_check_evaluations_are_dagsters_rows(tmp_path: Path) -> None:
    """The project's event log writes a step's materializations and check evaluations with one
    insert statement of its own (``store_event``), and a check evaluation's row with the text of
    its event-log row (``EventsSerializedOnce``): the rows — in the run's database, the index, the
    asset-key table and the check table, planned or not — are those Dagster's own storage writes."""
    from ai_pipeline.accelerator.internals import SqliteEventLogStorage
    from ai_pipeline_tests.step_events import assert_same_rows, rows_kept, step_events

    events = step_events()
    written = {}
    for name, cls in (
        ("dagster", SqliteEventLogStorage),
        ("ours", EngineReusingSqliteEventLogStorage),
    ):
        storage = cls(str(tmp_path / name))
        for event in events:
            storage.store_event(event)
        written[name] = rows_kept(storage)
        storage.dispose()
    assert len(written["ours"]["run events"]) == 6
    assert_same_rows(written["ours"], written["dagster"])


@pytest.mark.parametrize(
    "keys",
    [
        [f"{i:020x}" for i in range(50)],
        ["报告-2026", 'a "quoted" key', "back\\slash", "tab\there", "ü", "\u2028"],
        [None],
    ],
)
def test_each_planned_row_is_serialized_as_its_own_event_would_be(keys: list[str | None]) -> None:
    """The planned rows' texts are made by serializing the event once and putting each key in:
    each is exactly what serializing that key's own event gives, whatever the key holds."""
    import time

    import dagster as dg
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationPlanned,
    )
    from dagster._core.events import DagsterEvent, DagsterEventType
    from dagster._core.events.log import EventLogEntry

    from ai_pipeline.accelerator.event_log import _each_key
    from ai_pipeline.accelerator.internals import DefaultPartitionsSubset, serialize_value

    now = time.time()

    def serialized(key: str | None) -> str:
        subset = None if key is None else DefaultPartitionsSubset({key})
        planned = AssetCheckEvaluationPlanned(
            asset_key=dg.AssetKey("llm_analysis"), check_name="schema", partitions_subset=subset
        )
        event = EventLogEntry(
            error_info=None,
            level="DEBUG",
            user_message="",
            run_id="r1",
            timestamp=now,
            dagster_event=DagsterEvent(
                event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value,
                job_name="j",
                event_specific_data=planned,
            ),
        )
        return serialize_value(event)

    made = {"count": 0}

    def counted(key: str | None) -> str:
        made["count"] += 1
        return serialized(key)

    assert _each_key(counted, keys) == [serialized(key) for key in keys]
    # Once, with the stand-in; a key of None (no subset) is serialized by itself too.
    assert made["count"] == (2 if None in keys else 1)


def _home(tmp_path: Path) -> Path:
    """A DAGSTER_HOME holding the checkout's dagster.yaml (its SQLite storage)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        (Path(__file__).resolve().parents[2] / "dagster.yaml").read_text()
    )
    return home


def test_run_and_schedule_storage_are_dagsters_files_checked_only_when_unstamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkout's dagster.yaml keeps runs and sensor states in Dagster's own files. An instance
    built on databases that have their alembic revision and tables (every sensor tick's, in the
    code server) does not load the migration scripts to compare revisions again; a database file
    that has none gets Dagster's creation and stamping, as before."""
    import dagster as dg
    from dagster._core.storage.runs.sqlite import sqlite_run_storage
    from dagster._core.storage.schedules.sqlite import sqlite_schedule_storage

    from ai_pipeline.accelerator.sqlite import (
        EngineReusingSqliteRunStorage,
        EngineReusingSqliteScheduleStorage,
    )

    checked: list[str] = []
    for module, name in ((sqlite_run_storage, "runs"), (sqlite_schedule_storage, "schedules")):
        real = module.check_alembic_revision
        monkeypatch.setattr(
            module,
            "check_alembic_revision",
            lambda config, conn, real=real, name=name: checked.append(name) or real(config, conn),
        )
    home = _home(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_config(str(home)) as first:
        assert isinstance(first.run_storage, EngineReusingSqliteRunStorage)
        assert isinstance(first.schedule_storage, EngineReusingSqliteScheduleStorage)
        assert sorted(checked) == ["runs", "schedules"]  # new files: created and stamped
        first.add_run(dg.DagsterRun(job_name="job", run_id="run-1"))
        ref = first.get_ref()
    assert (home / "history" / "runs.db").exists()
    assert (home / "schedules" / "schedules.db").exists()
    checked.clear()
    for _ in range(5):
        with dg.DagsterInstance.from_ref(ref) as again:
            assert again.get_run_by_id("run-1") is not None
            assert again.schedule_storage.all_instigator_state() == []
    assert checked == []
    # A file that is there but was never stamped goes through Dagster's own building.
    (home / "history" / "runs.db").unlink()
    for suffix in ("-wal", "-shm"):
        (home / "history" / f"runs.db{suffix}").unlink(missing_ok=True)
    (home / "history" / "runs.db").touch()
    with dg.DagsterInstance.from_ref(ref) as fresh:
        assert checked == ["runs"]
        assert fresh.get_run_by_id("run-1") is None
        fresh.add_run(dg.DagsterRun(job_name="job", run_id="run-2"))
        assert fresh.get_run_by_id("run-2") is not None


def test_run_and_schedule_storage_keep_their_connections_and_known_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's loops read runs and sensor states many times a second: through two kept
    connections per storage (Dagster's opened one per statement), shared by threads, with the
    schema's tables asked for once (Dagster asked before every instigator read)."""
    from concurrent.futures import ThreadPoolExecutor

    import dagster as dg
    import sqlalchemy as sa

    home = _home(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    opened: list[object] = []
    statements: list[str] = []

    def on_connect(dbapi_connection: object, _record: object) -> None:
        opened.append(dbapi_connection)

    def on_execute(*args: object) -> None:
        statements.append(str(args[2]))

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_run(dg.DagsterRun(job_name="job", run_id="run-1"))
        instance.schedule_storage.all_instigator_state()
        sa.event.listen(sa.engine.Engine, "connect", on_connect)
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_execute)
        try:
            for _ in range(30):
                assert instance.get_runs_count() == 1
                assert instance.schedule_storage.all_instigator_state() == []
            with ThreadPoolExecutor(4) as pool:
                assert set(pool.map(lambda _: instance.get_runs_count(), range(40))) == {1}
        finally:
            sa.event.remove(sa.engine.Engine, "connect", on_connect)
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_execute)
    # The threads may each have needed one beyond the two kept; the loop above none.
    assert len(opened) <= 4
    assert not any("sqlite_master" in s for s in statements)
