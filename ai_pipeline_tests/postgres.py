"""PostgreSQL for the tests: is the server there, and databases a test creates and drops.

One setup for every test that needs PostgreSQL (the store's unit tests and the integration tests
on both backends): when the server cannot be reached those tests are skipped locally and fail when
``CI`` is set to anything but a false value.
"""

from __future__ import annotations

import os
import uuid

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
