"""The store's fixtures: an empty results database on SQLite (a temporary file) and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ai_pipeline.store import Store
from ai_pipeline.store.tables import metadata

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL on the parametrized backend (a new SQLite file, or the session's PG db)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    return str(request.getfixturevalue("pg_test_database_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A Store on empty tables; its connections are closed afterwards."""
    s = Store(db_url)
    with s.db.engine.begin() as conn:
        for table in (s.results.history_table, s.results.table, *reversed(metadata.sorted_tables)):
            conn.execute(table.delete())
    yield s
    s.db.dispose()


@pytest.fixture
def sent(store: Store) -> Iterator[list[tuple[str, int]]]:
    """What the store's engine has the driver send, as it happens: (the statement's first word,
    the statements that are on the wire) — a row each for an executemany (psycopg2 sends them one
    by one), one for a plain statement or SQLAlchemy's multi-row INSERT."""
    statements: list[tuple[str, int]] = []

    def count(_conn: Any, _cursor: Any, statement: str, params: Any, context: Any, *_: Any) -> None:
        rows = len(params) if context.execute_style.name == "EXECUTEMANY" else 1
        statements.append((statement.split()[0], rows))

    sa.event.listen(store.db.engine, "before_cursor_execute", count)
    yield statements
    sa.event.remove(store.db.engine, "before_cursor_execute", count)
