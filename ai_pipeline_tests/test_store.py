"""Unit tests of ai_pipeline.store on a temporary SQLite file and on a PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from ai_pipeline import store as store_module
from ai_pipeline.documents import Document, RejectedFile, parse_document
from ai_pipeline.failures import Category
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store, get_store, metadata, normalise_url, redact_url
from ai_pipeline_tests._pg import pg_test_database_url  # noqa: F401  (a fixture)

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL on the parametrized backend (a new SQLite file, or the session's PG db)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    return request.getfixturevalue("pg_test_database_url")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A Store on empty tables; its connections are closed afterwards."""
    s = Store(db_url)
    with s.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield s
    s.engine.dispose()


def _doc(text: str, source: str = "doc.txt") -> Document:
    return parse_document(text.encode("utf-8"), source)


def _result_row(document_id: str, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "document_id": document_id,
        "keywords": ["物流", "合同", "delivery"],
        "summary": "杭州星禾科技有限公司与 ACME Logistics 签订了仓储合同。",
        "sentiment": "neutral",
        "entities": ["杭州星禾科技有限公司", "ACME Logistics"],
        "confidence": 0.9,
        "task_id": f"{document_id}:analyse:v1:sim",
        "model": "sim-analyst-1",
        "prompt_version": "v1",
        "sources": ["inbox/合同.txt", "inbox/contract-copy.txt"],
        "prompt_tokens": 120,
        "completion_tokens": 45,
    }
    row.update(changes)
    return row


def _utc(value: datetime) -> datetime:
    """SQLite gives back naive datetimes (written in UTC), PostgreSQL aware ones."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


# --- documents and sources ---------------------------------------------------------------------


def test_register_new_document_returns_true_then_false(store: Store) -> None:
    """The first registration of a document is new; registering it again is not."""
    doc = _doc("Quarterly report of Northwind Traders.", "q3.txt")
    assert store.register(doc) is True
    assert store.register(doc) is False
    rows = store.get_documents()
    assert len(rows) == 1
    row = rows[0]
    assert row["document_id"] == doc.document_id
    assert row["state"] == State.PENDING.value
    assert row["attempts"] == 0
    assert row["text"] == doc.text
    assert row["rejected_reason"] is None
    assert (row["source"], row["kind"], row["size_bytes"]) == ("q3.txt", "txt", doc.size_bytes)


def test_same_content_under_another_name_is_an_alias(store: Store) -> None:
    """A second file with the same content adds a source, not a document; the first name stays."""
    first = _doc("Same content.", "inbox/a.txt")
    second = _doc("Same content.", "inbox/copy-of-a.txt")
    assert first.document_id == second.document_id
    assert store.register(first) is True
    assert store.register(second) is False
    assert store.register(second) is False
    assert store.sources() == {first.document_id: ["inbox/a.txt", "inbox/copy-of-a.txt"]}
    assert store.sources([first.document_id]) == store.sources()
    assert store.sources(["unknown"]) == {}
    assert store.get_document(first.document_id)["source"] == "inbox/a.txt"  # type: ignore[index]
    assert len(store.get_documents()) == 1


def test_rejected_file_is_registered_with_its_reason(store: Store, tmp_path: Path) -> None:
    """A rejected file becomes a PENDING document without text and with its reason."""
    path = tmp_path / "sheet.xlsx"
    path.write_bytes(b"PK\x03\x04 not a workbook")
    rejected = RejectedFile(
        document_id="0123456789abcdef0123",
        source=str(path),
        kind="xlsx",
        size_bytes=22,
        reason="unsupported file type '.xlsx'",
    )
    assert store.register(rejected) is True
    row = store.get_document(rejected.document_id)
    assert row is not None
    assert row["text"] is None
    assert row["rejected_reason"] == "unsupported file type '.xlsx'"
    assert (row["kind"], row["size_bytes"], row["state"]) == ("xlsx", 22, "PENDING")
    assert store.sources() == {rejected.document_id: [str(path)]}


def test_rejected_file_with_a_long_suffix_can_be_registered(
    store: Store, db_url: str, request: pytest.FixtureRequest
) -> None:
    """A file whose "suffix" is longer than 16 characters is registered like any rejected file."""
    from ai_pipeline.documents import load

    path = Path(request.getfixturevalue("tmp_path")) / "Meeting notes v2.final-version-approved"
    path.write_text("minutes", encoding="utf-8")
    rejected = load(path)
    assert isinstance(rejected, RejectedFile)
    assert rejected.kind == "other"
    assert store.register(rejected) is True
    assert store.get_document(rejected.document_id)["state"] == "PENDING"  # type: ignore[index]


def test_get_document_of_unknown_id_is_none(store: Store) -> None:
    """Looking up an id that was never registered gives None."""
    assert store.get_document("does-not-exist") is None
    assert store.get_documents(["does-not-exist"]) == []


def test_get_documents_filters_by_id(store: Store) -> None:
    """get_documents returns only the requested documents."""
    a, b, c = _doc("a"), _doc("b"), _doc("c")
    for d in (a, b, c):
        store.register(d)
    got = {r["document_id"] for r in store.get_documents([a.document_id, c.document_id])}
    assert got == {a.document_id, c.document_id}
    assert len(store.get_documents()) == 3


# --- state transitions -------------------------------------------------------------------------


def test_transitions_follow_the_state_machine_and_count_attempts(store: Store) -> None:
    """Legal moves update state, error, category and attempts; the old state is returned."""
    doc = _doc("A document that fails once and then completes.")
    store.register(doc)
    did = doc.document_id
    assert store.transition(did, State.QUEUED) is State.PENDING
    assert store.transition(did, State.RUNNING, run_id="run-1", count_attempt=True) is State.QUEUED
    assert (
        store.transition(
            did,
            State.FAILED,
            category=Category.NETWORK_TIMEOUT,
            error="timed out after 60 s",
            task_id="task-1",
        )
        is State.RUNNING
    )
    row = store.get_document(did)
    assert row is not None
    assert (row["state"], row["attempts"], row["run_id"], row["task_id"]) == (
        "FAILED",
        1,
        "run-1",
        "task-1",
    )
    assert (row["category"], row["last_error"]) == ("NETWORK_TIMEOUT", "timed out after 60 s")
    store.transition(did, State.QUEUED)
    store.transition(did, State.RUNNING, run_id="run-2", count_attempt=True)
    assert store.transition(did, State.COMPLETED) is State.RUNNING
    row = store.get_document(did)
    assert row is not None
    assert (row["state"], row["attempts"], row["run_id"]) == ("COMPLETED", 2, "run-2")
    assert row["category"] is None and row["last_error"] is None


def test_illegal_transition_raises_and_changes_nothing(store: Store) -> None:
    """An illegal move raises IllegalTransition and leaves state and attempts as they were."""
    doc = _doc("Illegal moves are refused.")
    store.register(doc)
    did = doc.document_id
    with pytest.raises(IllegalTransition) as info:
        store.transition(did, State.COMPLETED, count_attempt=True)
    assert (info.value.current, info.value.target) == (State.PENDING, State.COMPLETED)
    assert "PENDING -> COMPLETED" in str(info.value)
    row = store.get_document(did)
    assert row is not None and (row["state"], row["attempts"]) == ("PENDING", 0)
    store.transition(did, State.CANCELLED)
    with pytest.raises(IllegalTransition, match="CANCELLED -> QUEUED"):
        store.transition(did, State.QUEUED)
    assert store.get_document(did)["state"] == "CANCELLED"  # type: ignore[index]


def test_same_state_transition_is_a_no_op_that_may_count_an_attempt(store: Store) -> None:
    """Moving to the current state succeeds; count_attempt still counts it."""
    doc = _doc("Same state twice.")
    store.register(doc)
    did = doc.document_id
    assert store.transition(did, State.PENDING) is State.PENDING
    store.transition(did, State.QUEUED)
    store.transition(did, State.RUNNING, count_attempt=True)
    store.transition(did, State.RUNNING, count_attempt=True)
    row = store.get_document(did)
    assert row is not None and (row["state"], row["attempts"]) == ("RUNNING", 2)


def test_transition_of_unknown_document_is_a_key_error(store: Store) -> None:
    """Moving a document that was never registered raises KeyError naming it."""
    with pytest.raises(KeyError, match="unknown document nope"):
        store.transition("nope", State.QUEUED)


# --- checkpoints -------------------------------------------------------------------------------


def test_put_checkpoint_first_write_wins(store: Store) -> None:
    """A second put for the same task keeps and returns the first payload."""
    first = {"summary": "第一次", "confidence": 0.9, "keywords": ["a"]}
    second = {"summary": "second attempt", "confidence": 0.1}
    assert store.put_checkpoint("task-1", "doc-1", "analyse", first) == first
    assert store.put_checkpoint("task-1", "doc-1", "analyse", second) == first
    assert store.get_checkpoint("task-1") == first
    assert store.count_checkpoints() == 1
    assert store.count_checkpoints("analyse") == 1
    assert store.count_checkpoints("other-step") == 0


def test_checkpoints_lookup_and_delete(store: Store) -> None:
    """get_checkpoints returns only existing tasks; delete removes one and reports it."""
    store.put_checkpoint("t1", "d1", "analyse", {"n": 1})
    store.put_checkpoint("t2", "d2", "analyse", {"n": 2})
    assert store.get_checkpoints(["t1", "t2", "t3"]) == {"t1": {"n": 1}, "t2": {"n": 2}}
    assert store.get_checkpoints([]) == {}
    assert store.get_checkpoint("t3") is None
    assert store.delete_checkpoint("t1") is True
    assert store.delete_checkpoint("t1") is False
    assert store.get_checkpoint("t1") is None
    assert store.put_checkpoint("t1", "d1", "analyse", {"n": 3}) == {"n": 3}


# --- results -----------------------------------------------------------------------------------


def test_upsert_results_twice_keeps_one_row_with_new_values(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two upserts of one document leave one row: the second values, the first created_at."""
    t1 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    t2 = t1 + timedelta(hours=1)
    times = iter([t1, t2])
    monkeypatch.setattr(store_module, "utcnow", lambda: next(times))
    assert store.upsert_results([_result_row("doc-1")]) == 1
    assert (
        store.upsert_results(
            [_result_row("doc-1", summary="更新后的摘要", sentiment="positive", confidence=0.8)]
        )
        == 1
    )
    assert store.count_results() == 1
    (row,) = store.get_results()
    assert (row["summary"], row["sentiment"], row["confidence"]) == (
        "更新后的摘要",
        "positive",
        0.8,
    )
    assert _utc(row["created_at"]) == t1
    assert _utc(row["updated_at"]) == t2


def test_upsert_results_of_several_documents(store: Store) -> None:
    """One call can insert several documents; get_results filters and sorts by id."""
    assert store.upsert_results([]) == 0
    assert store.upsert_results([_result_row("b"), _result_row("a"), _result_row("c")]) == 3
    assert [r["document_id"] for r in store.get_results()] == ["a", "b", "c"]
    assert [r["document_id"] for r in store.get_results(["c", "a"])] == ["a", "c"]
    assert store.count_results() == 3


def test_result_json_columns_round_trip_chinese_lists(store: Store) -> None:
    """keywords, entities and sources come back as the same lists, Chinese text intact."""
    row = _result_row("doc-zh", entities=["杭州星禾科技有限公司", "ＡＣＭＥ", "Zoë"])
    store.upsert_results([row])
    (got,) = store.get_results(["doc-zh"])
    for column in ("keywords", "entities", "sources"):
        assert got[column] == row[column]
        assert isinstance(got[column], list)
    assert got["summary"] == row["summary"]
    assert (got["prompt_tokens"], got["completion_tokens"]) == (120, 45)


# --- failure events ----------------------------------------------------------------------------


def test_record_failure_appends_events_with_their_layer(store: Store) -> None:
    """Every recorded failure is a new event carrying category, layer, attempt and error."""
    store.record_failure("doc-1", Category.NETWORK_TIMEOUT, "timeout 1", task_id="t", attempt=1)
    store.record_failure("doc-1", Category.NETWORK_TIMEOUT, "timeout 2", task_id="t", attempt=2)
    store.record_failure("doc-2", Category.SCHEMA_VIOLATION, "not JSON: 无效", run_id="run-9")
    events = store.failure_events()
    assert [
        (e["document_id"], e["category"], e["layer"], e["attempt"], e["error"]) for e in events
    ] == [
        ("doc-1", "NETWORK_TIMEOUT", "network", 1, "timeout 1"),
        ("doc-1", "NETWORK_TIMEOUT", "network", 2, "timeout 2"),
        ("doc-2", "SCHEMA_VIOLATION", "model", 1, "not JSON: 无效"),
    ]
    assert events[0]["id"] < events[1]["id"] < events[2]["id"]
    assert (events[2]["task_id"], events[2]["run_id"]) == (None, "run-9")
    only_two = store.failure_events("doc-2")
    assert len(only_two) == 1 and only_two[0]["category"] == "SCHEMA_VIOLATION"
    assert store.failure_events("doc-3") == []


# --- the store cache and URLs ------------------------------------------------------------------


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
            s.engine.dispose()


def test_get_store_without_url_uses_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a URL, get_store uses AI_PIPELINE_DATABASE_URL, else a file under DAGSTER_HOME."""
    monkeypatch.setattr(store_module, "_stores", {})
    monkeypatch.delenv("AI_PIPELINE_DATABASE_URL", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    try:
        default = get_store()
        assert default.url == f"sqlite:///{tmp_path.resolve() / 'ai_pipeline.sqlite'}"
        assert (tmp_path / "ai_pipeline.sqlite").exists()
        explicit = f"sqlite:///{tmp_path / 'explicit.sqlite'}"
        monkeypatch.setenv("AI_PIPELINE_DATABASE_URL", explicit)
        assert get_store().url == explicit
        assert get_store() is get_store(explicit)
    finally:
        for s in store_module._stores.values():
            s.engine.dispose()


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
        assert store.engine.dialect.driver == "psycopg2"
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
