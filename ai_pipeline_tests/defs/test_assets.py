"""The analysis assets run through Dagster against the simulator, on SQLite and on PostgreSQL."""

from __future__ import annotations

import textwrap
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.defs.assets import (
    ANALYSIS_RESULTS,
    COMPLETION_NOTICE,
    DOCUMENT_TEXT,
    LLM_ANALYSIS,
    VALIDATED_ANALYSIS,
)
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.results import Results
from ai_pipeline.tasks import ANALYSE_STEP
from ai_pipeline_tests.support import (
    EXAMPLES,
    STATUS,
    doc_id,
    kill_when,
    latest_materialization,
    launcher,
    make_inbox,
    process_inbox,
    results_store,
    sample_text,
    statuses,
    task_of,
)


def test_range_run_fails_exactly_the_failing_document(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """One document's LLM call fails inside a range run: only it is FAILED, the rest complete."""
    texts = {f"doc-{i}.txt": sample_text(i) for i in range(5)}
    texts["doc-bad.txt"] = "Poison request for Vega Instruments in Oslo. " + sample_text(99)
    inbox = make_inbox(tmp_path / "inbox", texts)
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Poison request"}])

    report = process_inbox(inbox)

    assert len(report["runs"]) == 1, "all documents in one range run"
    assert report["runs"][0]["success"] is False
    bad = doc_id(texts["doc-bad.txt"])
    good = [doc_id(texts[f"doc-{i}.txt"]) for i in range(5)]
    keys = [*good, bad]
    assert statuses(instance, DOCUMENT_TEXT, keys) == {k: STATUS.MATERIALIZED for k in keys}
    for asset_key in (LLM_ANALYSIS, VALIDATED_ANALYSIS, ANALYSIS_RESULTS, COMPLETION_NOTICE):
        expected = {k: STATUS.MATERIALIZED for k in good} | {bad: STATUS.FAILED}
        assert statuses(instance, asset_key, keys) == expected, asset_key

    # Per-document check results were recorded for the documents that got an answer.
    check_key = dg.AssetCheckKey(LLM_ANALYSIS, "grounding")
    history = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=50)
    assert {r.partition: r.status.value for r in history} == {g: "SUCCEEDED" for g in good} | {
        # Planned in the failed run and never evaluated (the UI resolves it to "execution
        # failed" from the run's status): the document got no answer to check.
        bad: "PLANNED"
    }
    # Each evaluation targets its document's materialization (the UI links the two): the one
    # the run remembered storing, which is the one the event log holds.
    for record in history:
        if record.partition in good:
            (stored,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=LLM_ANALYSIS, asset_partitions=[record.partition]),
                limit=1,
            ).records
            evaluation = record.event.dagster_event.event_specific_data
            target = evaluation.target_materialization_data
            assert (target.storage_id, target.run_id, target.timestamp) == (
                stored.storage_id,
                stored.run_id,
                stored.timestamp,
            )

    store = results_store()
    rows = {r.document_id for r in store.results.get()}
    assert rows == set(good)
    by_id = {d["document_id"]: d for d in report["documents"]}
    assert by_id[bad]["state"] == "FAILED"
    assert by_id[bad]["category"] == "INPUT_QUALITY_ISSUE"
    assert all(by_id[g]["state"] == "COMPLETED" for g in good)
    assert simulator.requests_for(task_of(bad)) == 1
    events = store.events.failures(bad)
    assert [e.category for e in events] == ["INPUT_QUALITY_ISSUE"]


def test_a_database_outage_during_the_upsert_fails_analysis_results(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results database gone while one document's row is upserted: Dagster shows that
    document FAILED from analysis_results on, and its analysis, checked, as materialized."""
    texts = {f"doc-{i}.txt": sample_text(300 + i) for i in range(3)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    keys = [doc_id(t) for t in texts.values()]
    lost, good = keys[0], keys[1:]
    upsert = Results.upsert

    def upsert_unless_lost(self: Results, rows):  # type: ignore[no-untyped-def]
        if any(row.document_id == lost for row in rows):
            # What the database layer raises once its retries are over.
            raise StoreUnavailable("the results database is unreachable after 4 attempts over 30 s")
        return upsert(self, rows)

    monkeypatch.setattr(Results, "upsert", upsert_unless_lost)

    report = process_inbox(inbox)

    for asset_key in (DOCUMENT_TEXT, LLM_ANALYSIS, VALIDATED_ANALYSIS):
        materialized = dict.fromkeys(keys, STATUS.MATERIALIZED)
        assert statuses(instance, asset_key, keys) == materialized, asset_key
    for asset_key in (ANALYSIS_RESULTS, COMPLETION_NOTICE):
        expected = dict.fromkeys(good, STATUS.MATERIALIZED) | {lost: STATUS.FAILED}
        assert statuses(instance, asset_key, keys) == expected, asset_key
    by_id = {d["document_id"]: d for d in report["documents"]}
    assert by_id[lost]["state"] == "FAILED"
    assert by_id[lost]["category"] == "DATABASE_UNAVAILABLE"
    assert {r.document_id for r in results_store().results.get()} == set(good)


def test_same_content_two_names_is_one_document(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """The same content under two file names is one partition, one LLM call and one row."""
    text = sample_text(7)
    inbox = make_inbox(
        tmp_path / "inbox", {"a.txt": text, "sub/b-copy.txt": text, "c.md": sample_text(8)}
    )

    report = process_inbox(inbox)

    the_id = doc_id(text)
    assert instance.get_dynamic_partitions("documents").count(the_id) == 1
    assert len(instance.get_dynamic_partitions("documents")) == 2
    assert simulator.requests_for(task_of(the_id)) == 1
    assert simulator.stats()["total"] == 2
    row = next(r for r in results_store().results.get() if r.document_id == the_id)
    assert sorted(Path(s).name for s in row.sources) == ["a.txt", "b-copy.txt"]
    assert report["counts"]["by_state"] == {"COMPLETED": 2}


def test_rerun_makes_no_llm_call(instance: dg.DagsterInstance, simulator, tmp_path: Path) -> None:
    """A rerun of failed and completed documents never pays twice for an answered call."""
    texts = {f"d{i}.txt": sample_text(i) for i in range(4)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    flaky = doc_id(texts["d3.txt"])
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(flaky)}])
    first = process_inbox(inbox)
    assert first["counts"]["by_state"] == {"COMPLETED": 3, "FAILED": 1}
    calls_after_first = simulator.stats()["total"]

    simulator.set_faults([])
    second = process_inbox(inbox)

    assert second["counts"]["by_state"] == {"COMPLETED": 4}
    # Only the failed document was analysed again.
    assert simulator.stats()["total"] == calls_after_first + 1
    assert results_store().results.count() == 4
    assert statuses(instance, ANALYSIS_RESULTS, [flaky]) == {flaky: STATUS.MATERIALIZED}

    # Re-executing the whole range through Dagster (as the UI's "Re-execute" would) is free.
    keys = instance.get_dynamic_partitions("documents")
    (run,) = launcher(instance).execute(keys)
    assert run["success"]
    assert simulator.stats()["total"] == calls_after_first + 1
    assert results_store().results.count() == 4


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import ai_pipeline.store.results as results_module

    original = results_module.Results.upsert
    calls = []

    def upsert_then_stall(self, rows):
        # Widens the window between a document's checkpoint and its results row so that the
        # parent can kill the run inside it; everything else is the real code.
        calls.append(1)
        if len(calls) > 2:
            time.sleep(600)
        return original(self, rows)

    results_module.Results.upsert = upsert_then_stall
    from ai_pipeline.cli import main
    sys.exit(main(["run", "--inbox", sys.argv[1], "--json"]))
    """
)


def test_sigkill_between_checkpoint_and_upsert(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """A run killed after LLM checkpoints but before results resumes without paying again."""
    texts = {f"k{i}.txt": sample_text(100 + i) for i in range(8)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = [doc_id(t) for t in texts.values()]
    store = results_store()
    kill_when(
        KILL_SCRIPT,
        [str(inbox)],
        lambda: store.results.count() == 2 and store.checkpoints.count(ANALYSE_STEP) > 2,
        tmp_path,
    )
    checkpointed = {i for i in ids if store.checkpoints.get(task_of(i)) is not None}
    with_row = {r.document_id for r in store.results.get()}
    assert len(with_row) == 2 and with_row < checkpointed
    calls_before = {i: simulator.requests_for(task_of(i)) for i in ids}
    assert all(calls_before[i] == 1 for i in checkpointed)

    report = process_inbox(inbox)

    assert report["counts"]["by_state"] == {"COMPLETED": len(ids)}
    calls_after = {i: simulator.requests_for(task_of(i)) for i in ids}
    # No second call for any document whose answer was checkpointed before the kill; a document
    # whose answer was lost with the process is asked once more.
    assert {i: calls_after[i] for i in checkpointed} == {i: 1 for i in checkpointed}
    assert all(calls_after[i] == calls_before[i] + 1 for i in set(ids) - checkpointed)
    rows = store.results.get()
    assert sorted(r.document_id for r in rows) == sorted(ids)
    assert statuses(instance, ANALYSIS_RESULTS, ids) == {i: STATUS.MATERIALIZED for i in ids}


def test_html_reaches_the_model_as_its_main_text_only(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """The sample news and review pages, analysed: the text the simulator received has the
    article and none of the navigation bar or footer; the token counts are in the metadata."""
    pages = {
        "news-offshore-wind-farm-approval.html": (
            "Skagen Reef wind farm wins approval",
            ["Subscribe", "Opinion", "All rights reserved", "Contact the newsroom"],
        ),
        "news-city-library-opening-zh.html": (
            "云杉图书馆正式向公众开放",
            ["下载客户端", "版权所有"],
        ),
        "product-review-brevana-espresso-machine.html": (
            "twin boilers",
            ["Newsletter", "Deals", "earns a commission", "Terms"],
        ),
    }
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in pages:
        (inbox / name).write_bytes((EXAMPLES / "inbox" / name).read_bytes())

    report = process_inbox(inbox)

    assert report["counts"]["by_state"] == {"COMPLETED": 3}
    by_source = {Path(d["source"]).name: d["document_id"] for d in report["documents"]}
    for name, (kept, dropped) in pages.items():
        document_id = by_source[name]
        seen = simulator.text_for(task_of(document_id))
        assert seen is not None and kept in seen
        assert [p for p in dropped if p in seen] == [], name
        text_event = latest_materialization(instance, DOCUMENT_TEXT, document_id)
        assert text_event.asset_materialization.metadata["text_tokens"].value > 0
        analysis = latest_materialization(instance, LLM_ANALYSIS, document_id)
        assert analysis.asset_materialization.metadata["prompt_tokens"].value > 0
