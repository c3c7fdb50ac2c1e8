"""Fixtures: a real simulator over HTTP, a temporary Dagster instance, both backends, daemons.

``backend`` runs a test twice: on the embedded default (SQLite files under a temporary
DAGSTER_HOME) and on PostgreSQL as both the Dagster instance storage and the results database,
each test with databases of its own, created here and dropped afterwards. Without a reachable
PostgreSQL the PostgreSQL variants are skipped locally and fail in CI (``ai_pipeline_tests.postgres``).
An instance has Dagster's own storage, as a team's has, unless the test asks for the accelerator
(``@pytest.mark.accelerated``, or ``accelerated`` parametrized). Helpers that test modules import
are in ``ai_pipeline_tests.support``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.postgres import (
    PG_BIN,
    PG_HOST,
    PG_PORT,
    PG_USER,
    OwnedPostgres,
    PostgresDatabases,
    skip_or_fail,
    unavailable_reason,
)
from ai_pipeline_tests.support import (
    instance_yaml,
    instance_yaml_on_postgres,
    point_llm_at,
)

# Dagster's switches: no test sets one for the product, and the processes the tests start inherit
# none (the accelerator's storages set theirs in the process that builds them).
DAGSTER_SWITCHES = (
    "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS",
    "DAGSTER_BACKFILL_RETRY_DEFINITION_CHANGED_ERROR",
    "DAGSTER_EVENT_BATCH_SIZE",
)


@pytest.fixture(autouse=True)
def no_dagster_switches() -> Iterator[None]:
    """Each test starts with none of ``DAGSTER_SWITCHES`` set, whatever an accelerated storage a
    test before it built in this process set."""
    for name in DAGSTER_SWITCHES:
        os.environ.pop(name, None)
    yield
    for name in DAGSTER_SWITCHES:
        os.environ.pop(name, None)


def _read_migrations_once() -> None:
    """In this process, read each folder of Dagster's alembic migrations once.

    Every Dagster storage a test opens checks (or stamps) its schema's alembic revision, and alembic
    builds a ``ScriptDirectory`` for that each time, executing every migration file of the folder
    again: about a sixth of an in-process test's CPU (py-spy over the category, notification and
    checklist tests), paid for each instance and each run's event-log shard. What it reads is the
    installed package's files, the same for the whole session; the revision it finds, the stamp
    and the database are unchanged. The processes the tests start (daemons, run workers, commands)
    read them as a deployment's do.
    """
    from alembic.script import ScriptDirectory

    build = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
    read: dict[str, ScriptDirectory] = {}

    def from_config(cls: type[ScriptDirectory], config: Any) -> ScriptDirectory:
        location = config.get_alembic_option("script_location")
        if location not in read:
            read[location] = build(cls, config)
        return read[location]

    ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[method-assign,assignment]


_read_migrations_once()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spread the long tests (those that start Dagster processes, then the other slow ones) over
    the first part of the run, a few short ones between two of them. With ``--maxschedchunk 2``
    (pyproject.toml) a worker takes the next two tests whenever it runs short, so each worker
    alternates: the long tests, mostly waiting on daemons, overlap the short ones, mostly busy in
    their worker, and no long test starts late enough to be the last one running. In collection
    order (one worker's consecutive share), the long ones would run one after another at the end.
    """
    long = [i for i in items if i.get_closest_marker("daemon")]
    long += [i for i in items if i.get_closest_marker("slow") and i not in long]
    short = [i for i in items if i not in long]
    # The long tests end before the last third of the short ones.
    per_long = max(1, (2 * len(short)) // (3 * max(1, len(long))))
    ordered: list[pytest.Item] = []
    for n, item in enumerate(long):
        ordered.append(item)
        ordered.extend(short[n * per_long : (n + 1) * per_long])
    ordered.extend(short[len(long) * per_long :])
    items[:] = ordered


@pytest.fixture(scope="session")
def pg_skip_reason() -> str | None:
    return unavailable_reason()


# The PostgreSQL half carries the ``postgres`` mark, so that ``-m "not postgres"`` leaves it out.
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, pg_skip_reason: str | None) -> str:
    if request.param == "postgres" and pg_skip_reason:
        skip_or_fail(pg_skip_reason)
    return str(request.param)


@pytest.fixture
def postgres_databases() -> Iterator[PostgresDatabases]:
    dbs = PostgresDatabases()
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def pg_test_database_url(pg_skip_reason: str | None) -> Iterator[str]:
    """A PostgreSQL database that lives for the whole test session (the store's unit tests)."""
    if pg_skip_reason:
        skip_or_fail(pg_skip_reason)
    dbs = PostgresDatabases()
    try:
        yield dbs.url(dbs.create("test"))
    finally:
        dbs.drop_all()


@pytest.fixture
def accelerated(request: pytest.FixtureRequest) -> bool:
    """Whether the test's instance uses the accelerator: ``@pytest.mark.accelerated``, or the
    parameter of ``@pytest.mark.parametrize("accelerated", [False, True], indirect=True)``."""
    param = getattr(request, "param", None)
    if param is not None:
        return bool(param)
    return request.node.get_closest_marker("accelerated") is not None


def _sqlite_template(home: Path, accelerated: bool) -> Path:
    import dagster as dg

    (home / "dagster.yaml").write_text(instance_yaml(accelerated=accelerated))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.get_runs(limit=1)
    for path in home.rglob("*.db"):
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return home


@pytest.fixture(scope="session")
def sqlite_instance_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DAGSTER_HOME on Dagster's own SQLite storage whose instance was created once for this
    process (the xdist worker): its run, schedule and event-log index databases, checkpointed.

    Creating an instance's SQLite storage (every table and index, the alembic stamps, Dagster's
    marks of its data migrations) was about a seventh of the py-spy samples of the in-process
    category, notification, review and asset tests, and copying these files instead saved 4 % of
    their CPU; a process the test starts paid it when it was the first to open the instance. A
    copy is the same storage (only ``instance_info``'s random id is shared); a test about creating
    it asks for ``@pytest.mark.fresh_instance``.
    """
    return _sqlite_template(tmp_path_factory.mktemp("instance_template"), accelerated=False)


@pytest.fixture(scope="session")
def sqlite_accelerated_instance_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sqlite_instance_template`` on the accelerator's storage (the checkout's dagster.yaml)."""
    return _sqlite_template(tmp_path_factory.mktemp("accelerated_template"), accelerated=True)


def _postgres_template(
    tmp_path_factory: pytest.TempPathFactory, pg_skip_reason: str | None, accelerated: bool
) -> Iterator[str]:
    import dagster as dg

    if pg_skip_reason:
        skip_or_fail(pg_skip_reason)
    dbs = PostgresDatabases()
    try:
        name = dbs.create("template")
        home = tmp_path_factory.mktemp("postgres_instance_template")
        (home / "dagster.yaml").write_text(
            instance_yaml_on_postgres(PG_HOST, PG_PORT, name, PG_USER, accelerated=accelerated)
        )
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.get_runs(limit=1)
        yield name
    finally:
        dbs.drop_all()


@pytest.fixture(scope="session")
def postgres_instance_template(
    pg_skip_reason: str | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The PostgreSQL counterpart of ``sqlite_instance_template``: a database holding the schema
    of an instance created once for this process, which each test's Dagster database copies
    (``CREATE DATABASE … TEMPLATE``)."""
    yield from _postgres_template(tmp_path_factory, pg_skip_reason, accelerated=False)


@pytest.fixture(scope="session")
def postgres_accelerated_instance_template(
    pg_skip_reason: str | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``postgres_instance_template`` made through the accelerator's storage."""
    yield from _postgres_template(tmp_path_factory, pg_skip_reason, accelerated=True)


def write_instance_yaml(
    home: Path,
    backend: str,
    dbs: PostgresDatabases | None,
    template: Path | str | None = None,
    *,
    accelerated: bool = False,
) -> None:
    """The checkout's ``dagster.yaml`` with Dagster's own storage (or, ``accelerated``, the
    accelerator's): on SQLite with the databases of the ``template`` folder copied in, or on a new
    PostgreSQL database (a copy of the ``template`` database)."""
    if backend == "sqlite":
        (home / "dagster.yaml").write_text(instance_yaml(accelerated=accelerated))
        if isinstance(template, Path):
            for path in template.rglob("*.db"):
                copy = home / path.relative_to(template)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
        return
    assert dbs is not None
    name = dbs.create("dagster", template if isinstance(template, str) else None)
    (home / "dagster.yaml").write_text(
        instance_yaml_on_postgres(PG_HOST, PG_PORT, name, PG_USER, accelerated=accelerated)
    )


@pytest.fixture
def dagster_home(
    tmp_path: Path,
    backend: str,
    accelerated: bool,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[Path]:
    """A fresh DAGSTER_HOME (and results database) on the test's backend."""
    from ai_pipeline.store import dispose_stores

    home = tmp_path / "dagster_home"
    home.mkdir()
    dbs = request.getfixturevalue("postgres_databases") if backend == "postgres" else None
    template = None
    if request.node.get_closest_marker("fresh_instance") is None:
        kind = "_accelerated" if accelerated else ""
        template = request.getfixturevalue(f"{backend}{kind}_instance_template")
    write_instance_yaml(home, backend, dbs, template, accelerated=accelerated)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    # Tests write their inbox and process it at once; the ones about settling set their own.
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "0")
    if dbs is not None:
        monkeypatch.setenv("AI_PIPELINE_DATABASE_URL", dbs.url(dbs.create("results")))
    else:
        monkeypatch.delenv("AI_PIPELINE_DATABASE_URL", raising=False)
    yield home
    dispose_stores()


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[object]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as inst:
        yield inst


@pytest.fixture(scope="session")
def simulator_server() -> Iterator[SimulatorServer]:
    with SimulatorServer() as server:
        yield server


@pytest.fixture
def simulator(
    simulator_server: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimulatorServer]:
    """The session's simulator, counters and faults reset, and the LLM settings pointing at it."""
    simulator_server.reset()
    simulator_server.set_faults([])
    simulator_server.set_api_keys(None)
    point_llm_at(monkeypatch, simulator_server)
    yield simulator_server
    simulator_server.set_faults([])


@pytest.fixture
def webhook_receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A fresh reference webhook receiver, with AI_PIPELINE_WEBHOOK_URL pointing at it."""
    from ai_pipeline.rehearsal.receiver import ReceiverServer

    with ReceiverServer() as server:
        monkeypatch.setenv("AI_PIPELINE_WEBHOOK_URL", server.url)
        yield server


# --- real Dagster processes (ai_pipeline_tests/dagster_procs.py) ---------------------------------


@pytest.fixture
def no_inbox_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inbox settings in the environment (nor in that of the processes the test starts)."""
    for name in ("AI_PIPELINE_INBOX", "AI_PIPELINE_DOCUMENTS_PER_RUN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "0")


@pytest.fixture
def daemon(tmp_path: Path, dagster_home: Path) -> Iterator[object]:
    """A ``dagster-daemon`` (a ``DagsterProcess``) for the test to start; stopped at the end, and
    nothing started for this test's instance may survive it: not the daemon, its code server, nor
    any run worker, wherever it ended up.

    The instance's storage is created first, as a deployment's is before its processes start:
    Dagster's SQLite schedule storage, created by two processes in the same instant (the daemon
    and a CLI the test starts right after it), can stamp its schema version twice, and every
    later process then fails to load the instance ("more than one head").
    """
    import dagster as dg

    from ai_pipeline_tests.dagster_procs import DagsterProcess, running

    with dg.DagsterInstance.from_config(str(dagster_home)):
        pass
    with running(DagsterProcess.daemon(tmp_path / "daemon.log"), dagster_home) as process:
        yield process


@pytest.fixture
def webserver(daemon: object, tmp_path: Path) -> Iterator[object]:
    """A ``dagster-webserver`` on a free port, for the test to start; stopped at the end."""
    from ai_pipeline_tests.dagster_procs import DagsterProcess, running

    # Depends on ``daemon`` so that it stops first: the daemon fixture then checks that nothing
    # started for this test's instance, the webserver included, is left running.
    with running(DagsterProcess.webserver(tmp_path / "webserver.log")) as server:
        yield server


@pytest.fixture
def owned_postgres(pg_skip_reason: str | None) -> Iterator[OwnedPostgres]:
    """A PostgreSQL server of the test's own, started; the test may stop and start it."""
    if not PG_BIN.is_dir():
        skip_or_fail(f"no PostgreSQL server binaries in {PG_BIN}")
    from ai_pipeline_tests.dagster_procs import free_port

    server = OwnedPostgres(free_port())
    server.init()
    server.start()
    try:
        yield server
    finally:
        from ai_pipeline.store import dispose_stores

        dispose_stores()
        server.remove()


@pytest.fixture
def span_exporter() -> Iterator[object]:
    """This process's spans, kept in memory: an SDK tracer provider with an in-memory exporter
    installed once per process (OpenTelemetry allows one), emptied for each test."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    global _SPAN_EXPORTER
    if _SPAN_EXPORTER is None:
        _SPAN_EXPORTER = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_SPAN_EXPORTER))
        trace.set_tracer_provider(provider)
    _SPAN_EXPORTER.clear()
    yield _SPAN_EXPORTER
    _SPAN_EXPORTER.clear()


_SPAN_EXPORTER: Any = None
