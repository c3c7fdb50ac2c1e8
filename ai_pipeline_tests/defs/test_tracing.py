"""Spans: a document's work is one trace, every span in it carries the task id."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from ai_pipeline.tracing import CATEGORY, DOCUMENT_ID, LAYER, TASK_ID
from ai_pipeline_tests.support import doc_id, make_inbox, process_inbox, sample_text, task_of

TEXT = (
    "Memo for Corvid Analytics in Porto. Maria Sousa reviewed the quarterly figures and asked "
    "the team to prepare the budget."
)


def test_two_retries_and_a_refusal_are_three_attempt_spans_all_with_their_task_id(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, span_exporter
) -> None:
    inbox = make_inbox(tmp_path / "inbox", {"memo.txt": TEXT, "fine.txt": sample_text(7)})
    document, task = doc_id(TEXT), task_of(doc_id(TEXT))
    simulator.set_faults(
        [
            {"kind": "status", "status": 503, "times": 2, "match": task},
            {"kind": "refuse", "match": task},
        ]
    )

    process_inbox(inbox)

    spans = span_exporter.get_finished_spans()
    (root,) = [
        s
        for s in spans
        if s.name == "ai_pipeline.document" and s.attributes.get(DOCUMENT_ID) == document
    ]
    mine = [s for s in spans if s.context.trace_id == root.context.trace_id]
    assert root.parent is None  # a trace of its own
    assert root.attributes[CATEGORY] == "MODEL_REFUSAL" and root.attributes[LAYER] == "model"
    missing = [s.name for s in mine if s.attributes.get(TASK_ID) != task]
    assert missing == [], f"spans without the document's task id: {missing}"
    assert all(s.attributes.get(DOCUMENT_ID) == document for s in mine)
    attempts = sorted((s for s in mine if s.name == "llm.attempt"), key=lambda s: s.start_time)
    assert [s.attributes["attempt"] for s in attempts] == [1, 2, 3]
    assert [s.attributes.get(CATEGORY) for s in attempts] == [
        "NETWORK_TIMEOUT",
        "NETWORK_TIMEOUT",
        None,  # the answer came back; the refusal is the check's verdict, on the root
    ]
    assert attempts[2].attributes["llm.completion_tokens"] > 0
    waits = [s for s in mine if s.name == "retry.wait"]
    assert [w.attributes["seconds"] for w in waits] == [1.0, 2.0]
    assert any(s.name == "store.write" for s in mine)
    # The other document's spans are in its own trace, with its own task id.
    other = [
        s
        for s in spans
        if s.name == "ai_pipeline.document" and s.attributes.get(DOCUMENT_ID) != document
    ]
    assert len(other) == 1 and other[0].context.trace_id != root.context.trace_id


def test_json_lines_log_every_line_with_its_ids_and_category(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch
) -> None:
    """AI_PIPELINE_JSON_LOG: the run's lines as JSON, next to Dagster's log; the retries and the
    refusal of one document carry its task, document, run, layer and category."""
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("AI_PIPELINE_JSON_LOG", str(log))
    inbox = make_inbox(tmp_path / "inbox", {"memo.txt": TEXT, "fine.txt": sample_text(7)})
    document, task = doc_id(TEXT), task_of(doc_id(TEXT))
    simulator.set_faults(
        [
            {"kind": "status", "status": 503, "times": 2, "match": task},
            {"kind": "refuse", "match": task},
        ]
    )

    report = process_inbox(inbox)

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and all(
        set(line)
        == {
            "timestamp",
            "level",
            "task_id",
            "document_id",
            "run_id",
            "layer",
            "category",
            "message",
        }
        for line in lines
    )
    assert {line["run_id"] for line in lines} == {report["runs"][0]["run_id"]}
    mine = [line for line in lines if line["task_id"] == task]
    assert all(line["document_id"] == document for line in mine)
    assert [(m["category"], m["layer"]) for m in mine if m["category"]] == [
        ("NETWORK_TIMEOUT", "network"),
        ("NETWORK_TIMEOUT", "network"),
        ("MODEL_REFUSAL", "model"),
    ]
    assert mine[-1]["level"] == "ERROR"
