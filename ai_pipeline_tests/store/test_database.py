"""The connection: one Store per URL, URLs normalised and redacted, the additive migration."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import ai_pipeline.store as store_module
from ai_pipeline.failures import Category
from ai_pipeline.settings import Settings
from ai_pipeline.store import Store, database, get_store
from ai_pipeline.store.database import StoreUnavailable, normalise_url, redact_url, transient
from ai_pipeline_tests.postgres import OwnedPostgres


def test_get_store_returns_the_same_object_for_the_same_url(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """get_store caches one Store per (normalised) URL; another URL gets another Store."""
    monkeypatch.setattr(store_module, "_stores", {})
    try:
        first = get_store(db_url)
        assert get_store(db_url) is first
        assert get_store(normalise_url(db_url)) is first
        other = get_store(f"sqlite:///{tmp_path / 'other.sqlite'}")
        assert other is not first
        assert first.dialect == ("sqlite" if db_url.startswith("sqlite") else "postgresql")
    finally:
        for s in store_module._stores.values():
            s.db.dispose()


def test_the_default_database_is_a_file_beside_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without AI_PIPELINE_DATABASE_URL the results live in ai_pipeline.sqlite in DAGSTER_HOME."""
    monkeypatch.delenv("AI_PIPELINE_DATABASE_URL", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert Settings.load().database_url == f"sqlite:///{tmp_path.resolve() / 'ai_pipeline.sqlite'}"
    explicit = f"sqlite:///{tmp_path / 'explicit.sqlite'}"
    monkeypatch.setenv("AI_PIPELINE_DATABASE_URL", explicit)
    assert Settings.load().database_url == explicit


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h:5432/db", "postgresql+psycopg2://u:p@h:5432/db"),
        ("postgres://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:////tmp/x.sqlite", "sqlite:////tmp/x.sqlite"),
    ],
)
def test_normalise_url_maps_bare_postgresql_to_psycopg2(url: str, expected: str) -> None:
    """A bare postgresql:// (or postgres://) URL gets the psycopg2 driver; others are unchanged."""
    assert normalise_url(url) == expected


def test_store_url_is_normalised(store: Store, db_url: str) -> None:
    """A Store keeps the normalised URL, so PostgreSQL runs on the psycopg2 driver."""
    assert store.url == normalise_url(db_url)
    if db_url.startswith("postgresql"):
        assert store.url.startswith("postgresql+psycopg2://")
        assert store.db.engine.dialect.driver == "psycopg2"
    else:
        assert store.url == db_url and store.dialect == "sqlite"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://alice:s3cr3t@db.example:5432/results",
            "postgresql://alice:***@db.example:5432/results",
        ),
        ("postgresql+psycopg2://bob:p%40ss@h/db", "postgresql+psycopg2://bob:***@h/db"),
        ("postgresql://carol@h/db", "postgresql://carol@h/db"),
        ("sqlite:////tmp/results.sqlite", "sqlite:////tmp/results.sqlite"),
    ],
)
def test_redact_url_hides_the_password(url: str, expected: str) -> None:
    """redact_url replaces the password with *** and keeps the rest of the URL."""
    redacted = redact_url(url)
    assert redacted == expected
    assert "s3cr3t" not in redacted and "p%40ss" not in redacted and "p@ss" not in redacted


def test_redact_url_of_garbage_says_unparseable() -> None:
    """A string that is not a URL is not echoed back."""
    assert redact_url("not a url with password hunter2") == "<unparseable database URL>"


def test_a_database_from_before_the_rejection_flag_is_upgraded(tmp_path: Path) -> None:
    """A results database created before ``rejected_by_reviewer`` existed gains the column on
    open, and documents a reviewer had rejected (a status message) are flagged."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE documents (document_id VARCHAR(64) PRIMARY KEY, source TEXT NOT NULL,"
                " kind VARCHAR(16) NOT NULL, size_bytes INTEGER NOT NULL, text TEXT,"
                " rejected_reason TEXT, state VARCHAR(16) NOT NULL, category VARCHAR(32),"
                " last_error TEXT, attempts INTEGER NOT NULL, task_id VARCHAR(128),"
                " run_id VARCHAR(64), status_message TEXT, created_at DATETIME NOT NULL,"
                " updated_at DATETIME NOT NULL)"
            )
        )
        for did, message in (("a" * 20, "您的材料存在X问题 / rejected"), ("b" * 20, None)):
            conn.execute(
                sa.text(
                    "INSERT INTO documents VALUES (:d, 's.txt', 'txt', 1, 'x', NULL, 'FAILED',"
                    " 'MODEL_REFUSAL', NULL, 1, NULL, NULL, :m, '2026-01-01', '2026-01-01')"
                ),
                {"d": did, "m": message},
            )
    engine.dispose()

    store = Store(url)
    try:
        flags = {d.document_id: d.rejected_by_reviewer for d in store.documents.rows()}
        assert flags == {"a" * 20: True, "b" * 20: False}
        Store(url).db.dispose()  # opening again changes nothing
    finally:
        store.db.dispose()


def test_a_write_during_a_database_restart_is_retried(owned_postgres: OwnedPostgres) -> None:
    """The server stops with a connection open and comes back 2 s later: the write in between
    waits and succeeds; nothing is lost, nothing raised."""
    store = Store(owned_postgres.create_database("retry"), retry_seconds=30)
    store.checkpoints.put("t-before", "d", "analyse", {"n": 1})
    owned_postgres.stop()
    restarter = threading.Timer(2.0, owned_postgres.start)
    restarter.start()
    try:
        started = time.monotonic()
        assert store.checkpoints.put("t-during", "d", "analyse", {"n": 2}) == {"n": 2}
        assert time.monotonic() - started >= 1.5
    finally:
        restarter.join()
    assert store.db.retries > 0
    assert store.checkpoints.get_many(["t-before", "t-during"]) == {
        "t-before": {"n": 1},
        "t-during": {"n": 2},
    }
    store.db.dispose()


def test_an_outage_past_the_retries_names_the_database(owned_postgres: OwnedPostgres) -> None:
    """When the database stays away longer than the retries cover, the call raises
    StoreUnavailable (DATABASE_UNAVAILABLE, retryable) naming the database, password hidden."""
    url = owned_postgres.create_database("gone").replace("postgres@", "postgres:s3cr3t@")
    store = Store(url, retry_seconds=1.5)
    owned_postgres.stop()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.documents.get("anything")
    assert 1.4 <= time.monotonic() - started < 10
    assert info.value.category == Category.DATABASE_UNAVAILABLE
    assert info.value.category.retryable
    assert f"127.0.0.1:{owned_postgres.port}/gone" in info.value.message
    assert "s3cr3t" not in info.value.message and "***" in info.value.message
    store.db.dispose()


def test_a_pooled_connection_is_checked_without_a_round_trip_unless_it_sat_idle(
    owned_postgres: OwnedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-to-back calls reuse their pooled connection without a ping (a round trip each); one
    the server closed (its sessions ended, as in a restart) is replaced at checkout, still without
    a ping, and the call succeeds without a retry; one that sat idle past the threshold is
    pinged."""
    monkeypatch.setattr(database, "IDLE_PING_SECONDS", 0.5)
    store = Store(owned_postgres.create_database("pings"), retry_seconds=30)
    # Both of the database's pools (its transactions' and its autocommit one's) are counted.
    dialect = type(store.db.engine.dialect)
    pings: list[bool] = []
    real_ping = dialect.do_ping

    def counted(self: object, dbapi_connection: object) -> bool:
        alive = real_ping(self, dbapi_connection)  # type: ignore[arg-type]
        pings.append(alive)
        return alive

    monkeypatch.setattr(dialect, "do_ping", counted)
    try:
        for i in range(20):
            store.checkpoints.put(f"t-{i}", "d", "analyse", {"n": i})
            assert store.checkpoints.get(f"t-{i}") == {"n": i}
        assert pings == []
        admin = sa.create_engine(normalise_url(owned_postgres.create_database("admin")))
        with admin.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = 'pings'"
                )
            ).scalar_one()
        admin.dispose()
        assert ended >= 1
        time.sleep(0.1)  # the server's farewell reaches the pooled socket
        assert store.checkpoints.get("t-1") == {"n": 1}
        assert store.db.retries == 0, "the closed connection was replaced at checkout"
        assert pings == []
        time.sleep(0.7)
        assert store.checkpoints.get("t-0") == {"n": 0}
        assert pings == [True]
    finally:
        store.db.dispose()


def test_on_postgresql_reads_and_lone_statements_run_outside_a_transaction_on_a_pool_of_their_own(
    pg_test_database_url: str,
) -> None:
    """A read and a write of single statements take a pooled connection in autocommit (no BEGIN
    and ROLLBACK or COMMIT around them), a write a connection in a transaction; each from a pool
    of its own, so that no connection is switched (a round trip, psycopg2's ``SET
    default_transaction_isolation``, each time)."""
    store = Store(pg_test_database_url)
    connections: dict[str, set[int]] = {"autocommit": set(), "transaction": set()}

    def autocommit(conn: sa.Connection) -> bool:
        dbapi_connection = conn.connection.dbapi_connection
        on = bool(dbapi_connection.autocommit)  # type: ignore[union-attr]
        connections["autocommit" if on else "transaction"].add(id(dbapi_connection))
        return on

    try:
        for _ in range(3):
            assert store.db.read(autocommit) is True
            assert store.db.write(autocommit) is False
            assert store.db.write_each(autocommit) is True
        assert connections["autocommit"].isdisjoint(connections["transaction"])
    finally:
        store.db.dispose()


def test_only_connection_errors_are_transient(tmp_path: Path) -> None:
    """A broken statement is raised at once, never retried; SQLite "database is locked" is."""
    store = Store(f"sqlite:///{tmp_path / 'x.sqlite'}", retry_seconds=30)
    with pytest.raises(sa.exc.OperationalError):
        store.db.rows(sa.text("SELECT * FROM no_such_table"))
    assert store.db.retries == 0
    locked = sa.exc.OperationalError("BEGIN", {}, Exception("database is locked"))
    assert transient(locked, "sqlite")
    assert not transient(sa.exc.IntegrityError("INSERT", {}, Exception("UNIQUE")), "postgresql")
    assert transient(
        sa.exc.OperationalError("SELECT", {}, Exception("server closed")), "postgresql"
    )
    store.db.dispose()


def test_two_stores_created_at_once_on_a_fresh_database(tmp_path: Path, db_url: str) -> None:
    """Processes that open a fresh results database at the same time all get its tables."""
    if db_url.startswith("sqlite"):
        db_url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        start.wait()
        try:
            Store(db_url).db.dispose()
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.postgres
def test_a_silent_client_inside_a_transaction_loses_its_locks(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run on a lost worker host may die between two statements of a transaction, its
    connection half-open (or held by a forwarder): PostgreSQL, not knowing it is gone, would keep
    its row locks and block everyone who touches those documents. The store's sessions end when
    idle in a transaction for ``IDLE_IN_TRANSACTION_SECONDS``, and the locks go with them."""
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's session setting")
    monkeypatch.setattr(database, "IDLE_IN_TRANSACTION_SECONDS", 1)
    engine = database.make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE held (id int PRIMARY KEY, v int)"))
        conn.execute(sa.text("INSERT INTO held VALUES (1, 0)"))
    gone = engine.connect()
    gone.begin()
    gone.execute(sa.text("UPDATE held SET v = 1 WHERE id = 1"))  # then silent, never committing
    started = time.monotonic()
    with engine.begin() as conn:
        # Without the setting this waits for ever; the statement timeout makes it a failure.
        conn.execute(sa.text("SET LOCAL statement_timeout = '15s'"))
        conn.execute(sa.text("UPDATE held SET v = 2 WHERE id = 1"))
    waited = time.monotonic() - started
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT v FROM held")).scalar_one() == 2
    assert waited < 10, waited
    gone.invalidate()
    engine.dispose()
