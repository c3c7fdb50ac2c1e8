"""PostgreSQL for the tests: is the server there, and databases a test creates and drops.

One setup for every test that needs PostgreSQL (the store's unit tests and the integration tests
on both backends): when the server cannot be reached those tests are skipped locally and fail when
``CI`` is set to anything but a false value.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

PG_HOST = os.environ.get("AI_PIPELINE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AI_PIPELINE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("AI_PIPELINE_TEST_PG_USER", "postgres")
PG_ADMIN_URL = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set to something other than a false value."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable_reason() -> str | None:
    """None when the server answers; else why not (for the skip or failure message)."""
    try:
        engine = sa.create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
        return None
    except Exception as e:  # any reason the server cannot be used
        return f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}) is not reachable: {e!r}"[:300]


def skip_or_fail(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


class PostgresDatabases:
    """Creates databases for one test (or session) and drops them, with any open connections."""

    def __init__(self) -> None:
        self.engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        self.created: list[str] = []

    def create(self, purpose: str, template: str | None = None) -> str:
        """A new database, empty or a copy of ``template``; a commit there returns before its WAL
        reaches the disk (the shared server is never crashed under a test, and the tests that
        stop a server own theirs)."""
        name = f"aip_{purpose}_{uuid.uuid4().hex[:10]}"
        with self.engine.connect() as conn:
            if template is None:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            else:
                # PostgreSQL copies a template only while nobody is connected to it.
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": template},
                )
                conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit TO off'))
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


PG_BIN = (
    Path("/usr/lib/postgresql")
    / (
        sorted(os.listdir("/usr/lib/postgresql"))[-1]
        if os.path.isdir("/usr/lib/postgresql")
        else "-"
    )
    / "bin"
)


class OwnedPostgres:
    """A PostgreSQL server of the test's own (``initdb`` in a temporary folder, a free port), to
    stop and start again without touching the machine's server on 5432. Run as the ``postgres``
    OS user when the tests run as root (the server refuses to run as root)."""

    def __init__(self, port: int) -> None:
        # Under /tmp itself: the server's user must reach the folder, and a test's tmp_path is
        # private to root.
        self.folder = Path(tempfile.mkdtemp(prefix="aip-pg-", dir="/tmp"))
        os.chmod(self.folder, 0o755)
        self.data = self.folder / "data"
        self.port = port
        self.log = self.folder / "server.log"

    def _as_postgres(self, *argv: str) -> list[str]:
        command = [str(PG_BIN / argv[0]), *argv[1:]]
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        subprocess.run(
            self._as_postgres(
                "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            self._as_postgres(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start"
            ),
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        subprocess.run(
            self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"),
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create a database; returns its URL."""
        engine = sa.create_engine(
            f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres",
            isolation_level="AUTOCOMMIT",
        )
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"
