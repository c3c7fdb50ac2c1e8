"""The human side: review queue, approve, reject, quarantine and dead letter.

Documents fail through Dagster against the simulator; people act through the real CLI
(``ai_pipeline.cli.main`` in this process), and the outcome is asserted on counts at the simulator
and the webhook receiver, on rows, states, categories and the Dagster event log.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.cli import main
from ai_pipeline.defs.assets import ANALYSIS_RESULTS, COMPLETION_NOTICE
from ai_pipeline.documents import normalise_text
from ai_pipeline.rehearsal.receiver import ReceiverServer
from ai_pipeline.review import MANUAL_OVERRIDE_SUCCESS
from ai_pipeline_tests.support import (
    by_id,
    doc_id,
    make_inbox,
    notice_key,
    process_inbox,
    results_store,
    sample_text,
    statuses,
    task_of,
    user_messages,
)

STATUS = dg.AssetPartitionStatus
REJECTION_ZH = "您的材料存在文件损坏问题，请修正后重新提交"
REJECTION_EN = "Your submission has a problem (文件损坏). Please correct it and submit it again."


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run one ``ai-pipeline`` command in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code, out, err = cli(capsys, *argv, "--json")
    assert out.lstrip().startswith("{"), f"no JSON on stdout: {out!r} {err!r}"
    return code, json.loads(out)


def events(document_id: str) -> list[str]:
    return [h.event for h in results_store().events.history(document_id)]


def test_input_quality_issue_listed_then_approved_under_the_original_task_id(
    instance: dg.DagsterInstance,
    simulator,
    webhook_receiver: ReceiverServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An LLM 400 shows in `review list` with a snapshot; approving it re-submits the same task."""
    text = "Blurred scan from Vega Instruments in Oslo. " + sample_text(201)
    inbox = make_inbox(tmp_path / "inbox", {"blurred.txt": text, "ok.txt": sample_text(202)})
    d, ok = doc_id(text), doc_id(sample_text(202))
    task = task_of(d)
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Blurred scan"}])
    first = process_inbox(inbox)
    assert (by_id(first)[d]["state"], by_id(first)[d]["category"]) == (
        "FAILED",
        "INPUT_QUALITY_ISSUE",
    )
    assert simulator.requests_for(task) == 1

    code, listed = cli_json(capsys, "review", "list")

    assert code == 0 and listed["count"] == 1
    (item,) = listed["items"]
    assert (item["document_id"], item["task_id"]) == (d, task)
    assert item["category"] == "INPUT_QUALITY_ISSUE"
    assert "400" in item["error"]
    snap = item["snapshot"]
    assert Path(snap["source"]).name == "blurred.txt"
    assert snap["size_bytes"] == len(text.encode("utf-8"))
    assert snap["sha256"] == hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()
    assert snap["first_characters"] == normalise_text(text)[:200]
    assert isinstance(item["age_seconds"], int) and 0 <= item["age_seconds"] < 600
    assert item["created_at"]

    simulator.set_faults([])
    code, approved = cli_json(
        capsys, "review", "approve", d, "--by", "qa-reviewer", "--note", "scan is readable"
    )

    assert code == 0
    assert simulator.requests_for(task) == 2, "one new request under the original task id"
    assert simulator.requests_for(task_of(ok)) == 1
    assert results_store().documents.get(d).state == "COMPLETED"  # type: ignore[union-attr]
    history = events(d)
    assert history.index("REVIEW_APPROVED") < history.index(MANUAL_OVERRIDE_SUCCESS)
    assert [h["event"] for h in approved["history"]] == history
    review = results_store().reviews.get(d)
    assert review is not None
    assert (review.status, review.decision, review.decided_by) == (
        "resolved",
        "retry",
        "qa-reviewer",
    )
    (run,) = approved["runs"]
    override_lines = [
        m for m in user_messages(instance, run["run_id"]) if MANUAL_OVERRIDE_SUCCESS in m
    ]
    assert len(override_lines) == 1 and override_lines[0].startswith(f"[TASK:{task}]")
    assert webhook_receiver.accepted(notice_key(d)) == 1
    assert webhook_receiver.requests_for(notice_key(d)) == 1
    assert [r.document_id for r in results_store().results.get([d])] == [d]
    assert cli_json(capsys, "review", "list")[1]["count"] == 0


def test_model_layer_failure_needs_a_mode_then_accept_output_or_retry(
    instance: dg.DagsterInstance,
    simulator,
    webhook_receiver: ReceiverServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """LOW_CONFIDENCE needs --accept-output (no new call) or --retry (one call, same task id)."""
    texts = {"accept.txt": sample_text(211), "retry.txt": sample_text(212)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    accept, retry = doc_id(texts["accept.txt"]), doc_id(texts["retry.txt"])
    simulator.set_faults(
        [
            {"kind": "low_confidence", "match": task_of(accept)},
            {"kind": "low_confidence", "match": task_of(retry)},
        ]
    )
    report = process_inbox(inbox)
    assert {by_id(report)[d]["category"] for d in (accept, retry)} == {"LOW_CONFIDENCE"}
    store = results_store()

    # No mode: a usage error that says what to choose; nothing changes.
    code, out, err = cli(capsys, "review", "approve", accept, "--by", "qa")
    assert code == 2
    assert "model-layer failure" in err and "--accept-output" in err and "--retry" in err
    assert store.reviews.get(accept).status == "open"  # type: ignore[union-attr]
    assert store.documents.get(accept).state == "FAILED"  # type: ignore[union-attr]

    # --accept-output: the stored answer is used as it is, the override recorded.
    code, _ = cli_json(
        capsys, "review", "approve", accept, "--accept-output", "--note", "checked", "--by", "qa"
    )
    assert code == 0
    assert simulator.requests_for(task_of(accept)) == 1, "no new LLM request"
    assert store.documents.get(accept).state == "COMPLETED"  # type: ignore[union-attr]
    override = store.reviews.override(task_of(accept))
    assert override is not None
    assert (override.decided_by, override.note) == ("qa", "checked")
    assert MANUAL_OVERRIDE_SUCCESS in events(accept)
    (row,) = store.results.get([accept])
    assert row.output["confidence"] == pytest.approx(0.42)
    assert webhook_receiver.accepted(notice_key(accept)) == 1
    assert webhook_receiver.requests_for(notice_key(accept)) == 1

    # --retry: the checkpoint is discarded and the model asked again under the same task id.
    simulator.set_faults([])
    code, _ = cli_json(capsys, "review", "approve", retry, "--retry", "--by", "qa")
    assert code == 0
    assert simulator.requests_for(task_of(retry)) == 2
    history = events(retry)
    assert history.index("CHECKPOINT_DISCARDED") < history.index(MANUAL_OVERRIDE_SUCCESS)
    assert store.documents.get(retry).state == "COMPLETED"  # type: ignore[union-attr]
    assert store.reviews.override(task_of(retry)) is None
    assert store.checkpoints.get(task_of(retry)) is not None
    (row,) = store.results.get([retry])
    assert row.output["confidence"] >= 0.75
    assert webhook_receiver.accepted(notice_key(retry)) == 1
    assert webhook_receiver.requests_for(notice_key(retry)) == 1
    assert webhook_receiver.stats()["requests"] == 2
    ids = [accept, retry]
    assert statuses(instance, COMPLETION_NOTICE, ids) == {d: STATUS.MATERIALIZED for d in ids}


CORRUPT_PDF = b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n\x00\x13\x37 truncated"


def _reject_corrupt_file(
    simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, dict[str, Any]]:
    """A corrupt PDF fails as INPUT_QUALITY_ISSUE and is rejected by a reviewer."""
    inbox = make_inbox(
        tmp_path / "inbox", {"contract.pdf": CORRUPT_PDF, "ok.txt": sample_text(221)}
    )
    report = process_inbox(inbox)
    (d,) = [r["document_id"] for r in report["documents"] if r["source"].endswith("contract.pdf")]
    assert (by_id(report)[d]["state"], by_id(report)[d]["category"]) == (
        "FAILED",
        "INPUT_QUALITY_ISSUE",
    )
    code, rejected = cli_json(capsys, "review", "reject", d, "--reason", "文件损坏", "--by", "qa")
    assert code == 0
    return d, rejected


def test_reject_sends_the_standard_message_and_triggers_nothing_downstream(
    instance: dg.DagsterInstance,
    simulator,
    webhook_receiver: ReceiverServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`review reject` records the standard message in both languages and triggers nothing."""
    d, rejected = _reject_corrupt_file(simulator, tmp_path, capsys)

    assert rejected == {"document_id": d, "message_zh": REJECTION_ZH, "message_en": REJECTION_EN}
    store = results_store()
    (message,) = store.reviews.messages(d)
    assert (message.reason, message.message_zh, message.message_en) == (
        "文件损坏",
        REJECTION_ZH,
        REJECTION_EN,
    )
    assert Path(message.source).name == "contract.pdf"
    doc = store.documents.get(d)
    assert doc is not None and doc.state == "FAILED" and doc.rejected_by_reviewer
    assert doc.status_message and REJECTION_ZH in doc.status_message
    assert REJECTION_EN in doc.status_message
    review = store.reviews.get(d)
    assert review is not None
    assert (review.status, review.decision, review.note) == (
        "rejected",
        "reject",
        "文件损坏",
    )
    assert "REVIEW_REJECTED" in events(d)

    # Nothing downstream: no notice, no results row, no LLM call for it.
    assert webhook_receiver.requests_for(notice_key(d)) == 0
    assert store.results.get([d]) == []
    assert simulator.requests_for(task_of(d)) == 0
    assert simulator.stats()["total"] == 1, "only the healthy document was analysed"
    assert statuses(instance, ANALYSIS_RESULTS, [d]) == {d: STATUS.FAILED}

    # A later failed-only backfill leaves it out.
    code, plan = cli_json(capsys, "backfill", "--failed", "--dry-run")
    assert code == 0
    assert d not in [s["document_id"] for s in plan["selected"]]
    (skipped,) = [s for s in plan["skipped"] if s["document_id"] == d]
    assert skipped["skipped"] == "rejected by a reviewer"
    assert cli_json(capsys, "review", "list")[1]["count"] == 0


def test_status_shows_the_rejection_message(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`status --json` shows the standard rejection message of a rejected document."""
    d, _ = _reject_corrupt_file(simulator, tmp_path, capsys)

    code, status = cli_json(capsys, "status")

    assert code == 0
    (row,) = [r for r in status["documents"] if r["document_id"] == d]
    assert row["state"] == "FAILED"
    assert REJECTION_ZH in json.dumps(row, ensure_ascii=False)


def test_hallucination_is_quarantined_reviewed_and_never_stored_or_notified(
    instance: dg.DagsterInstance,
    simulator,
    webhook_receiver: ReceiverServer,
    tmp_path: Path,
) -> None:
    """An invented entity quarantines the output, opens a review item, and stores nothing."""
    texts = {"invented.txt": sample_text(231), "ok.txt": sample_text(232)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    h, ok = doc_id(texts["invented.txt"]), doc_id(texts["ok.txt"])
    simulator.set_faults([{"kind": "hallucinate", "match": task_of(h)}])

    report = process_inbox(inbox)

    assert (by_id(report)[h]["state"], by_id(report)[h]["category"]) == (
        "FAILED",
        "MODEL_HALLUCINATION",
    )
    store = results_store()
    (kept,) = store.reviews.quarantined(h)
    assert kept.task_id == task_of(h)
    entities = json.loads(kept.output)["entities"]
    invented = [e for e in entities if e not in texts["invented.txt"]]
    assert "Globex Corporation" in invented
    assert all(name in kept.reason for name in invented)
    review = store.reviews.get(h)
    assert review is not None
    assert (review.category, review.status, review.task_id) == (
        "MODEL_HALLUCINATION",
        "open",
        task_of(h),
    )
    assert store.results.get([h]) == []
    assert webhook_receiver.requests_for(notice_key(h)) == 0
    assert webhook_receiver.stats()["requests_by_key"] == {notice_key(ok): 1}
    assert store.reviews.quarantined(ok) == []


def test_dead_letter_after_the_retry_budget_then_requeue(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two retryable failures with a budget of 2 dead-letter a document; requeue puts it back."""
    monkeypatch.setenv("AI_PIPELINE_RETRY_BUDGET", "2")
    texts = {"flaky.txt": sample_text(241), "ok.txt": sample_text(242)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    d, ok = doc_id(texts["flaky.txt"]), doc_id(texts["ok.txt"])
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(d)}])
    store = results_store()

    first = process_inbox(inbox)
    assert (by_id(first)[d]["state"], by_id(first)[d]["attempts"]) == ("FAILED", 1)
    assert "DEAD_LETTER" not in events(d)
    second = process_inbox(inbox)

    assert (by_id(second)[d]["state"], by_id(second)[d]["category"]) == (
        "DEAD_LETTER",
        "NETWORK_TIMEOUT",
    )
    assert by_id(second)[d]["attempts"] == 2
    assert events(d).count("DEAD_LETTER") == 1
    assert simulator.requests_for(task_of(d)) == 6, "3 requests per run (2 network retries)"
    code, plan = cli_json(capsys, "backfill", "--failed", "--dry-run")
    assert code == 0
    assert plan["selected"] == []
    (skipped,) = [s for s in plan["skipped"] if s["document_id"] == d]
    assert "dead letter" in skipped["skipped"]

    # Requeue: back to QUEUED with its attempts reset; a document not in the dead letter stays.
    code, out, _ = cli(capsys, "requeue", d, ok, "--by", "ops")
    assert code == 0
    assert "requeued" in out and "not in the dead letter" in out
    doc = store.documents.get(d)
    assert doc is not None and (doc.state, doc.attempts) == ("QUEUED", 0)
    assert events(d)[-1] == "REQUEUED"
    assert store.documents.get(ok).state == "COMPLETED"  # type: ignore[union-attr]
    assert "REQUEUED" not in events(ok)

    simulator.set_faults([])
    third = process_inbox(inbox)

    assert by_id(third)[d]["state"] == "COMPLETED"
    assert simulator.requests_for(task_of(d)) == 7
    assert simulator.requests_for(task_of(ok)) == 1
    assert [r.document_id for r in store.results.get([d])] == [d]
