"""Shared fixtures: a real simulator over HTTP, a temporary Dagster instance, and both backends.

``backend`` runs a test twice: on the embedded default (SQLite files under a temporary
DAGSTER_HOME) and on PostgreSQL as both the Dagster instance storage and the results database,
each test with databases of its own, created here and dropped afterwards. Without a reachable
PostgreSQL the PostgreSQL variants are skipped locally and fail in CI (``CI`` set).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from ai_pipeline.rehearsal.simulator import SimulatorServer

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PG_HOST = os.environ.get("AI_PIPELINE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AI_PIPELINE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("AI_PIPELINE_TEST_PG_USER", "postgres")
PG_ADMIN_URL = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
TEST_API_KEY = "sk-test-0123456789abcdef"
TEST_MODEL = "sim-analyst-1"


def _pg_available() -> str | None:
    try:
        engine = sa.create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
        return None
    except Exception as e:  # any reason the server cannot be used
        return f"PostgreSQL at {PG_HOST}:{PG_PORT} is not reachable: {e.__class__.__name__}"


class PostgresDatabases:
    """Creates databases for one test and drops them (with any open connections) at the end."""

    def __init__(self) -> None:
        self.engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        self.created: list[str] = []

    def create(self, purpose: str) -> str:
        name = f"aip_{purpose}_{uuid.uuid4().hex[:10]}"
        with self.engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        self.created.append(name)
        return name

    def url(self, name: str) -> str:
        return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"

    def drop_all(self) -> None:
        from ai_pipeline.store import dispose_stores

        dispose_stores()
        with self.engine.connect() as conn:
            for name in self.created:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.engine.dispose()


@pytest.fixture(scope="session")
def pg_skip_reason() -> str | None:
    return _pg_available()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, pg_skip_reason: str | None) -> str:
    if request.param == "postgres" and pg_skip_reason:
        if os.environ.get("CI"):
            pytest.fail(pg_skip_reason)
        pytest.skip(pg_skip_reason)
    return request.param


@pytest.fixture
def postgres_databases() -> Iterator[PostgresDatabases]:
    dbs = PostgresDatabases()
    yield dbs
    dbs.drop_all()


def write_instance_yaml(home: Path, backend: str, dbs: PostgresDatabases | None) -> None:
    if backend == "sqlite":
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        return
    assert dbs is not None
    name = dbs.create("dagster")
    (home / "dagster.yaml").write_text(
        (REPO / "dagster.yaml").read_text()
        + f"""
storage:
  postgres:
    postgres_db:
      hostname: {PG_HOST}
      port: {PG_PORT}
      db_name: {name}
      username: {PG_USER}
      scheme: postgresql+psycopg2
"""
    )


@pytest.fixture
def dagster_home(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """A fresh DAGSTER_HOME (and results database) on the test's backend."""
    from ai_pipeline.store import dispose_stores

    home = tmp_path / "dagster_home"
    home.mkdir()
    dbs = request.getfixturevalue("postgres_databases") if backend == "postgres" else None
    write_instance_yaml(home, backend, dbs)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
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
    monkeypatch.setenv("OPENAI_BASE_URL", simulator_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", TEST_API_KEY)
    monkeypatch.setenv("AI_PIPELINE_MODEL", TEST_MODEL)
    yield simulator_server
    simulator_server.set_faults([])


def make_inbox(folder: Path, files: dict[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return folder


def sample_text(i: int) -> str:
    """A small, distinct, valid English document that the simulator analyses cleanly."""
    return (
        f"Order {i} for Harbor Supplies was delivered to Lisbon on time. "
        f"Customer Ana Ribeiro praised the excellent packaging of shipment {i}. "
        "The team resolved every question quickly."
    )


@pytest.fixture
def webhook_receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A fresh reference webhook receiver, with AI_PIPELINE_WEBHOOK_URL pointing at it."""
    from ai_pipeline.rehearsal.receiver import ReceiverServer

    with ReceiverServer() as server:
        monkeypatch.setenv("AI_PIPELINE_WEBHOOK_URL", server.url)
        yield server


# --- real Dagster processes (ai_pipeline_tests/dagster_procs.py) ----------------------------------


@pytest.fixture
def no_inbox_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inbox settings in the environment (nor in that of the processes the test starts)."""
    for name in (
        "AI_PIPELINE_INBOX",
        "AI_PIPELINE_DOCUMENTS_PER_RUN",
        "AI_PIPELINE_SETTLE_SECONDS",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def daemon(tmp_path: Path, dagster_home: Path) -> Iterator[object]:
    """A ``dagster-daemon`` (a ``DagsterProcess``) for the test to start; stopped at the end, and
    nothing started for this test's instance may survive it: not the daemon, its code server, nor
    any run worker, wherever it ended up."""
    from ai_pipeline_tests.dagster_procs import DagsterProcess, running

    with running(DagsterProcess.daemon(tmp_path / "daemon.log"), dagster_home) as process:
        yield process


def user_messages(instance: object, run_id: str) -> list[str]:
    """The log lines our code wrote in a run (Dagster's own events left out)."""
    return [r.user_message for r in instance.all_logs(run_id) if r.dagster_event is None]  # type: ignore[attr-defined]


def kill_when(
    script: str, args: list[str], window: Callable[[], bool], tmp_path: Path, *, settle: float = 0
) -> None:
    """Run ``script`` in a child process and SIGKILL it once ``window()`` is true.

    The script monkeypatches one store method to stall, which holds the child inside the window
    (after one durable write, before the next); everything else it runs is the real code.
    """
    path = tmp_path / "run_and_stall.py"
    path.write_text(script)
    proc = subprocess.Popen(
        [sys.executable, str(path), *args],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not window():
            assert proc.poll() is None, "the run ended before it could be killed"
            if time.monotonic() > deadline:
                pytest.fail("the run never reached the window it should be killed in")
            time.sleep(0.05)
        time.sleep(settle)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
