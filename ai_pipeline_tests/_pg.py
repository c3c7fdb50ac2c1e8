"""A PostgreSQL database for the unit tests of the store, created per test session via psycopg2.

Import ``pg_test_database_url`` into a test module to use it (``conftest.py`` belongs to the
integration fixtures). The database is named ``aip_test_<random>`` and is dropped at the end of the
session, after terminating any connection still open to it. When the server cannot be reached the
tests that need it are skipped locally and fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

PG_HOST = os.environ.get("AI_PIPELINE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AI_PIPELINE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("AI_PIPELINE_TEST_PG_USER", "postgres")
PG_ADMIN_DSN = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set to something other than a false value."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _admin_connection():  # type: ignore[no-untyped-def]
    import psycopg2

    conn = psycopg2.connect(PG_ADMIN_DSN, connect_timeout=3)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="session")
def pg_test_database_url() -> Iterator[str]:
    """The URL (``postgresql://``) of a fresh database that lives for the whole test session."""
    try:
        admin = _admin_connection()
    except Exception as e:  # any reason the server cannot be used
        reason = (
            f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}) is not reachable: "
            f"{type(e).__name__}: {str(e).strip()}"
        )
        if in_ci():
            pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
        pytest.skip(reason)

    from psycopg2 import sql

    name = f"aip_test_{secrets.token_hex(6)}"
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.close()
