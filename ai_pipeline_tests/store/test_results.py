"""Checkpoints (first write wins) and results (one upserted row per document, ever)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from ai_pipeline.store import Store
from ai_pipeline.store import results as results_module
from ai_pipeline.store.rows import ResultRow


def _result_row(document_id: str) -> ResultRow:
    return ResultRow(
        document_id=document_id,
        output={
            "keywords": ["物流", "合同", "delivery"],
            "summary": "杭州星禾科技有限公司与 ACME Logistics 签订了仓储合同。",
            "sentiment": "neutral",
            "entities": ["杭州星禾科技有限公司", "ACME Logistics"],
            "confidence": 0.9,
        },
        task_id=f"{document_id}-analyse-v1-sim",
        model="sim-analyst-1",
        prompt_version="v1",
        sources=["inbox/合同.txt", "inbox/contract-copy.txt"],
        prompt_tokens=120,
        completion_tokens=45,
    )


def _utc(t: datetime) -> datetime:
    """A stored time in UTC (SQLite gives them back without their zone)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _with_output(row: ResultRow, **changes: object) -> ResultRow:
    return replace(row, output={**row.output, **changes})


def test_put_checkpoint_first_write_wins(store: Store) -> None:
    """A second put for the same task keeps and returns the first payload."""
    first = {"summary": "第一次", "confidence": 0.9, "keywords": ["a"]}
    second = {"summary": "second attempt", "confidence": 0.1}
    assert store.checkpoints.put("task-1", "doc-1", "analyse", first) == first
    assert store.checkpoints.put("task-1", "doc-1", "analyse", second) == first
    assert store.checkpoints.get("task-1") == first
    assert store.checkpoints.count() == 1
    assert store.checkpoints.count("analyse") == 1
    assert store.checkpoints.count("other-step") == 0


def test_checkpoints_lookup_and_delete(store: Store) -> None:
    """get_many returns only existing tasks; delete removes one and reports it."""
    store.checkpoints.put("t1", "d1", "analyse", {"n": 1})
    store.checkpoints.put("t2", "d2", "analyse", {"n": 2})
    assert store.checkpoints.get_many(["t1", "t2", "t3"]) == {"t1": {"n": 1}, "t2": {"n": 2}}
    assert store.checkpoints.get_many([]) == {}
    assert store.checkpoints.get("t3") is None
    assert store.checkpoints.delete("t1") is True
    assert store.checkpoints.delete("t1") is False
    assert store.checkpoints.get("t1") is None
    assert store.checkpoints.put("t1", "d1", "analyse", {"n": 3}) == {"n": 3}


def test_upsert_results_twice_keeps_one_row_with_new_values(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two upserts of one document leave one row: the second values, the first created_at."""
    t1 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    t2 = t1 + timedelta(hours=1)
    times = iter([t1, t2])
    monkeypatch.setattr(results_module, "utcnow", lambda: next(times))
    assert store.results.upsert([_result_row("doc-1")]) == 1
    changed = _with_output(
        _result_row("doc-1"), summary="更新后的摘要", sentiment="positive", confidence=0.8
    )
    assert store.results.upsert([changed]) == 1
    assert store.results.count() == 1
    (row,) = store.results.get()
    assert (row.output["summary"], row.output["sentiment"], row.output["confidence"]) == (
        "更新后的摘要",
        "positive",
        0.8,
    )
    assert (row.created_at, row.updated_at) == (t1, t2)


def test_an_analysis_another_task_replaces_is_kept_as_it_was(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upserted again under the same task, a document's row is replaced; under another task (a
    new version or model), the row it replaces goes to results_history as it was, named with the
    task that replaced it. On PostgreSQL a lone row's upsert is one statement outside a
    transaction (the archive a CTE of it); on SQLite, a read, the archive and the upsert."""
    t1 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    times = iter([t1, t1 + timedelta(hours=1), t1 + timedelta(hours=2)])
    monkeypatch.setattr(results_module, "utcnow", lambda: next(times))
    sent: list[tuple[str, bool]] = []  # (statement's first word, whether it was autocommitted)
    for engine in {store.db.engine, store.db._autocommit}:  # noqa: SLF001
        sa.event.listen(
            engine,
            "before_cursor_execute",
            lambda conn, _c, statement, *_: sent.append(
                (statement.split()[0], conn.engine is store.db._autocommit)  # noqa: SLF001
            ),
        )
    first = _result_row("d")
    store.results.upsert([first])
    store.results.upsert([_with_output(first, summary="the same task, again")])
    assert store.results.history("d") == []
    sent.clear()
    store.results.upsert([replace(first, task_id="d-analyse-v2-sim", prompt_version="v2")])
    if store.db.dialect == "postgresql":
        assert sent == [("WITH", True)]  # alone, on the autocommit pool
    else:
        assert [kind for kind, _ in sent] == ["SELECT", "INSERT", "INSERT"]
    (earlier,) = store.results.history("d")
    assert (earlier["task_id"], earlier["summary"], earlier["prompt_version"]) == (
        first.task_id,
        "the same task, again",
        "v1",
    )
    assert earlier["replaced_by_task"] == "d-analyse-v2-sim"
    times_kept = [_utc(earlier[c]) for c in ("created_at", "updated_at", "replaced_at")]
    assert times_kept == [t1, t1 + timedelta(hours=1), t1 + timedelta(hours=2)]
    (row,) = store.results.get()
    assert (row.task_id, row.prompt_version) == ("d-analyse-v2-sim", "v2")
    assert row.output["summary"] == first.output["summary"]


def test_upsert_of_one_document_twice_in_one_call_keeps_the_last(store: Store) -> None:
    """Two rows for one document in one call give one row, the last one's values."""
    first, last = _result_row("d"), _with_output(_result_row("d"), summary="the last word")
    assert store.results.upsert([first, last]) == 1
    (row,) = store.results.get()
    assert row.output["summary"] == "the last word"


def test_upsert_results_of_several_documents(store: Store, sent: list[tuple[str, int]]) -> None:
    """One call can insert several documents, in one statement (on PostgreSQL too, where an
    executemany would send one a row); get filters and sorts by id."""
    assert store.results.upsert([]) == 0
    rows = [_result_row("b"), _result_row("a"), _result_row("c")]
    sent.clear()
    assert store.results.upsert(rows) == 3
    assert [on_the_wire for verb, on_the_wire in sent if verb == "INSERT"] == [
        1 if store.db.dialect == "postgresql" else 3
    ]
    assert [r.document_id for r in store.results.get()] == ["a", "b", "c"]
    assert [r.document_id for r in store.results.get(["c", "a"])] == ["a", "c"]
    assert store.results.count() == 3


def test_result_json_columns_round_trip_chinese_lists(store: Store) -> None:
    """keywords, entities and sources come back as the same lists, Chinese text intact."""
    row = _with_output(_result_row("doc-zh"), entities=["杭州星禾科技有限公司", "ＡＣＭＥ", "Zoë"])
    store.results.upsert([row])
    (got,) = store.results.get(["doc-zh"])
    for field in ("keywords", "entities"):
        assert got.output[field] == row.output[field]
        assert isinstance(got.output[field], list)
    assert got.sources == row.sources
    assert got.output == row.output
    assert (got.prompt_tokens, got.completion_tokens) == (120, 45)


def test_stale_is_decided_by_task_id_not_by_the_served_model_name(store: Store) -> None:
    """A row whose task id is its document's current analysis task is current, whatever model
    name the endpoint served it under; a row of another prompt version is stale — in SQL."""
    from ai_pipeline.tasks import ANALYSE_STEP, task_id, task_suffix

    current = task_suffix(ANALYSE_STEP, "v2", "gpt-4o-mini")
    fresh = replace(
        _result_row("aa" * 8),
        task_id=task_id("aa" * 8, ANALYSE_STEP, "v2", "gpt-4o-mini"),
        model="gpt-4o-mini-2024-07-18",
        prompt_version="v2",
    )
    old = replace(
        _result_row("bb" * 8),
        task_id=task_id("bb" * 8, ANALYSE_STEP, "v1", "gpt-4o-mini"),
        model="gpt-4o-mini-2024-07-18",
    )
    other_model = replace(
        _result_row("cc" * 8),
        task_id=task_id("cc" * 8, ANALYSE_STEP, "v2", "gpt-4o"),
        model="gpt-4o-2024-08-06",
        prompt_version="v2",
    )
    store.results.upsert([fresh, old, other_model])

    assert [r.document_id for r in store.results.stale(current)] == ["bb" * 8, "cc" * 8]
    assert store.results.count_stale(current) == {
        "v1 / gpt-4o-mini-2024-07-18": 1,
        "v2 / gpt-4o-2024-08-06": 1,
    }


@pytest.fixture
def fresh_url(backend: str, tmp_path, request: pytest.FixtureRequest) -> str:
    """A database no test used yet, on the parametrized backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    dbs = request.getfixturevalue("postgres_databases")
    return str(dbs.url(dbs.create("results")))


def test_an_analysis_fields_are_sql_columns_on_either_backend(fresh_url: str) -> None:
    """contract_review's output fields are columns of their own: SQL filters on them, and the
    clauses' reviews come back beside the report."""
    import sqlalchemy as sa

    from ai_pipeline.analyses import CONTRACT_REVIEW

    store = Store(fresh_url, analysis=CONTRACT_REVIEW)
    try:
        rows = [
            ResultRow(
                document_id=f"c{i}",
                output={"overall_risk": risk, "summary": f"report {i}", "confidence": 0.8},
                task_id=f"c{i}-analyse-x-y",
                model="m",
                prompt_version=CONTRACT_REVIEW.tag(),
                sources=[f"c{i}.txt"],
                prompt_tokens=1,
                completion_tokens=1,
                sections=[{"index": 1, "title": "1. Term", "output": {"risk_level": risk}}],
            )
            for i, risk in enumerate(["high", "low", "high"])
        ]
        store.results.upsert(rows)
        table = store.results.table
        query = sa.select(table.c.document_id).where(table.c.overall_risk == "high")
        assert sorted(r.document_id for r in store.db.rows(query)) == ["c0", "c2"]
        assert isinstance(table.c.confidence.type, sa.Float)
        (got,) = store.results.get(["c1"])
        assert got.output == rows[1].output and got.sections == rows[1].sections
    finally:
        store.db.dispose()


def test_a_database_refuses_another_analysis(fresh_url: str) -> None:
    """A results database records the analysis it holds; another analysis is refused with a
    message naming both, before anything is written."""
    from ai_pipeline.analyses import CONTRACT_REVIEW
    from ai_pipeline.store import OtherAnalysis

    Store(fresh_url).db.dispose()
    with pytest.raises(OtherAnalysis, match="'document_analysis', not 'contract_review'"):
        Store(fresh_url, analysis=CONTRACT_REVIEW)
