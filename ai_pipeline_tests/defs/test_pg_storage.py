"""The production instance's storage (``deploy/dagster.yaml``): dagster-postgres's, keeping its
connections between calls, and replacing one that the server dropped."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
import sqlalchemy as sa

from ai_pipeline.accelerator.postgres import PooledPostgresStorage
from ai_pipeline_tests.postgres import PG_HOST, PG_PORT, PG_USER, PostgresDatabases
from ai_pipeline_tests.support import REPO

pytestmark = pytest.mark.postgres


def _connections(engine: sa.engine.Engine) -> list[int]:
    """A list that grows by one for every new connection the engine opens."""
    opened: list[int] = []
    sa.event.listen(engine, "connect", lambda *_: opened.append(1))
    return opened


@pytest.fixture
def deployed_instance(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_databases: PostgresDatabases,
    pg_skip_reason: str | None,
) -> dg.DagsterInstance:
    from ai_pipeline_tests.postgres import skip_or_fail

    if pg_skip_reason:
        skip_or_fail(pg_skip_reason)
    name = postgres_databases.create("dagster")
    shutil.copy(REPO / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    for var, value in {
        "DAGSTER_PG_HOST": PG_HOST,
        "DAGSTER_PG_PORT": str(PG_PORT),
        "DAGSTER_PG_DB": name,
        "DAGSTER_PG_USERNAME": PG_USER,
        "DAGSTER_PG_PASSWORD": "",
    }.items():
        monkeypatch.setenv(var, value)
    return dg.DagsterInstance.from_config(str(tmp_path))


def test_the_deployed_instance_keeps_its_connections(deployed_instance: dg.DagsterInstance) -> None:
    """Forty event writes and a read through deploy/dagster.yaml's storage open two connections
    at most, where dagster-postgres's own storage opens one per call."""
    with deployed_instance as instance:
        ref = instance.get_ref()
        assert ref.storage_data is not None
        assert ref.storage_data.class_name == PooledPostgresStorage.__name__
        storage = instance.event_log_storage
        opened = _connections(storage._engine)  # type: ignore[attr-defined]  # noqa: SLF001
        for i in range(40):
            instance.report_runless_asset_event(dg.AssetMaterialization("probe", metadata={"i": i}))
        records = instance.fetch_materializations(dg.AssetKey("probe"), limit=100).records
        assert len(records) == 40
        assert len(opened) <= 2  # a call may hold two at once; dagster-postgres: one per call


def test_the_instances_of_a_process_share_its_connections(
    deployed_instance: dg.DagsterInstance,
) -> None:
    """A process builds a Dagster instance for many things (a code server: one for every sensor
    tick). After the first, another instance of the same database opens no connection: its
    storages use the ones the first kept, still open after it was disposed; it asks whether
    Dagster's tables exist with one query."""
    opened: list[int] = []
    sent: list[str] = []

    def connected(*_: object) -> None:
        opened.append(1)

    def executed(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    runs_engine = deployed_instance.run_storage._engine  # type: ignore[attr-defined]  # noqa: SLF001
    sa.event.listen(sa.pool.Pool, "connect", connected)
    sa.event.listen(runs_engine, "before_cursor_execute", executed)
    try:
        with deployed_instance as instance:
            instance.report_runless_asset_event(dg.AssetMaterialization("probe"))
            assert instance.get_runs_count() == 0
        first = len(opened)
        assert first >= 2  # its event log's and its run storage's
        sent.clear()
        for i in range(5):
            with dg.DagsterInstance.from_config(deployed_instance.root_directory) as again:
                again.report_runless_asset_event(dg.AssetMaterialization("probe"))
                assert again.get_runs_count() == 0
                assert len(again.fetch_materializations(dg.AssetKey("probe"), 10).records) == i + 2
        assert len(opened) == first
        catalog = [s for s in sent if "pg_catalog.pg_class" in s]
        assert len(catalog) == 5
    finally:
        sa.event.remove(sa.pool.Pool, "connect", connected)
        sa.event.remove(runs_engine, "before_cursor_execute", executed)


def test_a_connection_the_server_dropped_is_replaced(
    deployed_instance: dg.DagsterInstance, postgres_databases: PostgresDatabases
) -> None:
    """After the server ends every session of the instance's database (as a restart does), the
    next writes go through on new connections instead of failing on the kept one."""
    with deployed_instance as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("probe"))
        assert instance.get_runs_count() == 0
        database = instance.event_log_storage._engine.url.database  # type: ignore[attr-defined]  # noqa: SLF001
        with postgres_databases.engine.connect() as conn:
            ended = conn.execute(
                sa.text(
                    # With a timeout it returns once each backend has exited (its socket
                    # closed), as after a restart; without one it only signals them, and the
                    # next checkout may race a session still ending.
                    "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": database},
            ).scalar_one()
        assert ended >= 1  # the kept connection was there, and is gone now
        instance.report_runless_asset_event(dg.AssetMaterialization("probe"))
        assert instance.get_runs_count() == 0  # the run storage's kept connection too
        records = instance.fetch_materializations(dg.AssetKey("probe"), limit=10).records
        assert len(records) == 2


def test_a_group_of_step_events_is_three_statements_on_a_pool_of_its_own(
    deployed_instance: dg.DagsterInstance,
) -> None:
    """Through deploy/dagster.yaml's storage, a group of six materializations of two assets is
    three statements — the ids taken, the events' rows, the two assets' rows — on a connection of
    the storage's pool for groups (READ COMMITTED from the start: none switched over and back),
    and the rows are all there after it."""
    from ai_pipeline_tests.defs.test_grouped_writes import _materialization

    with deployed_instance as instance:
        storage = instance.event_log_storage
        engines = {"storage": storage._engine, "groups": storage._group_engine}  # type: ignore[attr-defined]  # noqa: SLF001
        sent: list[str] = []
        checkouts: list[str] = []
        for name, engine in engines.items():
            sa.event.listen(engine, "checkout", lambda *_, name=name: checkouts.append(name))
            sa.event.listen(
                engine,
                "before_cursor_execute",
                lambda _c, _k, statement, *_: sent.append(statement),
            )

        def group(documents: tuple[str, ...]) -> None:
            with storage.grouped_writes():  # type: ignore[attr-defined]
                for document in documents:
                    for asset in ("document_text", "llm_analysis"):
                        instance.handle_new_event(_materialization(asset, document))

        group(("d0",))  # the first: the storage looks at its tables once
        sent.clear()
        checkouts.clear()
        group(("d1", "d2", "d3"))
        assert checkouts == ["groups"]
        assert [" ".join(s.split()[:2]) for s in sent] == [
            "SELECT nextval(pg_get_serial_sequence('event_logs',",
            "WITH inserted",
            "INSERT INTO",
        ]
        assert "INSERT INTO asset_keys" in sent[2]
        for asset in ("document_text", "llm_analysis"):
            records = instance.fetch_materializations(dg.AssetKey(asset), limit=10).records
            assert sorted(r.partition_key for r in records) == ["d0", "d1", "d2", "d3"]
            latest = instance.get_asset_records([dg.AssetKey(asset)])[0].asset_entry
            assert latest.last_materialization_record.partition_key == "d3"  # type: ignore[union-attr]


@pytest.mark.parametrize("grouped", [False, True], ids=["one by one", "grouped"])
def test_a_steps_events_are_dagster_postgres_rows(
    postgres_databases: PostgresDatabases, pg_skip_reason: str | None, grouped: bool
) -> None:
    """On PostgreSQL too, the project's event log keeps the rows dagster-postgres's own storage
    writes for a step's materializations and check evaluations (a check evaluation's row written
    with the text of its event-log row, ``EventsSerializedOnce``), planned or not — written one
    by one, or as a group whose step events go in one insert and their check rows in one update
    (``PooledPostgresEventLogStorage._send_deferred``)."""
    from dagster_postgres import PostgresEventLogStorage
    from dagster_postgres.event_log.event_log import CHANNEL_NAME

    from ai_pipeline.accelerator.postgres import PooledPostgresEventLogStorage
    from ai_pipeline_tests.postgres import skip_or_fail
    from ai_pipeline_tests.step_events import assert_same_rows, rows_kept, step_events

    if pg_skip_reason:
        skip_or_fail(pg_skip_reason)
    events = step_events()
    written, notified, inserts = {}, {}, {}
    for name, cls in (
        ("dagster", PostgresEventLogStorage),
        ("ours", PooledPostgresEventLogStorage),
    ):
        database = postgres_databases.create(name)
        url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"
        storage = cls(url)
        sent: list[str] = []
        sa.event.listen(
            storage._engine,  # noqa: SLF001
            "before_cursor_execute",
            lambda _conn, _cursor, statement, *_, sent=sent: sent.append(statement),
        )
        listener = psycopg2.connect(url.replace("+psycopg2", ""))
        try:
            listener.autocommit = True
            listener.cursor().execute(f"LISTEN {CHANNEL_NAME}")
            group = getattr(storage, "grouped_writes", contextlib.nullcontext)
            with group() if grouped else contextlib.nullcontext():
                for event in events:
                    storage.store_event(event)
            inserts[name] = sum("INSERT INTO event_logs" in s for s in sent)
            written[name] = rows_kept(storage)
            listener.poll()
            notified[name] = [n.payload for n in listener.notifies]
        finally:
            listener.close()
            storage.dispose()
    assert len(written["ours"]["run events"]) == 6
    assert_same_rows(written["ours"], written["dagster"])
    # The notification of every event, as dagster-postgres sends it (``<run id>_<event id>``).
    assert len(notified["ours"]) == 6
    assert notified["ours"] == notified["dagster"]
    # Grouped, the planned event's own insert and one for the five step events after it.
    assert inserts == {"dagster": 6, "ours": 2 if grouped else 6}
