"""Failure events and history (appended), the review queue, overrides, quarantine, the outbox."""

from __future__ import annotations

import pytest

from ai_pipeline.failures import Category, Layer
from ai_pipeline.store import Store
from ai_pipeline.store.rows import Decision, InputSnapshot, ReviewStatus

SNAPSHOT = InputSnapshot(
    source="inbox/scan.pdf",
    kind="pdf",
    size_bytes=1234,
    sha256=None,
    first_characters="",
    rejected_reason="the PDF has no extractable text",
)


def test_record_failure_appends_events_with_their_layer(store: Store) -> None:
    """Every recorded failure is a new event carrying category, layer, attempt and error."""
    events = store.events
    events.record_failure("doc-1", Category.NETWORK_TIMEOUT, "timeout 1", task_id="t", attempt=1)
    events.record_failure("doc-1", Category.NETWORK_TIMEOUT, "timeout 2", task_id="t", attempt=2)
    events.record_failure("doc-2", Category.SCHEMA_VIOLATION, "not JSON: 无效", run_id="run-9")
    got = events.failures()
    assert [(e.document_id, e.category, e.layer, e.attempt, e.error) for e in got] == [
        ("doc-1", Category.NETWORK_TIMEOUT, Layer.NETWORK, 1, "timeout 1"),
        ("doc-1", Category.NETWORK_TIMEOUT, Layer.NETWORK, 2, "timeout 2"),
        ("doc-2", Category.SCHEMA_VIOLATION, Layer.MODEL, 1, "not JSON: 无效"),
    ]
    assert got[0].id < got[1].id < got[2].id
    assert (got[2].task_id, got[2].run_id) == (None, "run-9")
    assert [e.category for e in events.failures("doc-2")] == [Category.SCHEMA_VIOLATION]
    assert events.failures("doc-3") == []


def test_history_is_appended_in_order(store: Store) -> None:
    """History entries of a document come back oldest first, with their task ids."""
    store.events.add_history("d", "REVIEW_APPROVED", "retry by ana", task_id="t1")
    store.events.add_history("d", "MANUAL_OVERRIDE_SUCCESS", "retry by ana: ok", task_id="t1")
    store.events.add_history("other", "REQUEUED", "by ops")
    got = store.events.history("d")
    assert [(h.event, h.detail, h.task_id) for h in got] == [
        ("REVIEW_APPROVED", "retry by ana", "t1"),
        ("MANUAL_OVERRIDE_SUCCESS", "retry by ana: ok", "t1"),
    ]


def test_a_review_item_moves_open_approved_resolved(store: Store) -> None:
    """An item opens with its snapshot, is decided once, and is resolved after approval."""
    reviews = store.reviews
    reviews.open("d1", Category.INPUT_QUALITY_ISSUE, "no text", SNAPSHOT, task_id="t1")
    (item,) = reviews.items()
    assert (item.status, item.category, item.snapshot) == (
        ReviewStatus.OPEN,
        Category.INPUT_QUALITY_ISSUE,
        SNAPSHOT,
    )
    assert reviews.resolve("d1") is False  # only an approved item resolves
    reviews.decide(
        "d1", status=ReviewStatus.APPROVED, decision=Decision.RETRY, decided_by="ana", note="ok"
    )
    with pytest.raises(KeyError, match="no open review item"):
        reviews.decide(
            "d1", status=ReviewStatus.REJECTED, decision=Decision.REJECT, decided_by="x", note=None
        )
    assert reviews.items() == []
    item = reviews.get("d1")
    assert item is not None
    assert (item.status, item.decision, item.decided_by) == (
        ReviewStatus.APPROVED,
        Decision.RETRY,
        "ana",
    )
    assert reviews.resolve("d1") is True
    resolved = reviews.get("d1")
    assert resolved is not None and resolved.status == ReviewStatus.RESOLVED
    assert [i.document_id for i in reviews.items(None)] == ["d1"]


def test_a_later_failure_reopens_the_same_item(store: Store) -> None:
    """Opening an item for a document that has one updates it: one item per document."""
    store.reviews.open("d1", Category.LOW_CONFIDENCE, "0.42", SNAPSHOT, task_id="t1")
    store.reviews.open("d1", Category.MODEL_REFUSAL, "refused", SNAPSHOT, task_id="t1")
    (item,) = store.reviews.items()
    assert (item.category, item.error) == (Category.MODEL_REFUSAL, "refused")


def test_overrides_quarantine_and_outbox(store: Store) -> None:
    """An override is kept once per task; quarantined outputs and messages are listed."""
    store.reviews.add_override("t1", "d1", "ana", "the figure is right")
    store.reviews.add_override("t1", "d1", "bob", "again")
    override = store.reviews.override("t1")
    assert override is not None and (override.decided_by, override.note) == (
        "ana",
        "the figure is right",
    )
    assert store.reviews.override("t2") is None
    store.reviews.quarantine("d1", "t1", '{"entities": ["Globex"]}', "Globex not in the text")
    store.reviews.quarantine("d1", "t1", "again", "again")
    (q,) = store.reviews.quarantined("d1")
    assert (q.task_id, q.reason) == ("t1", "Globex not in the text")
    store.reviews.add_message("d1", "inbox/a.txt", "文件损坏", "您的材料…", "Your submission…")
    (m,) = store.reviews.messages("d1")
    assert (m.source, m.reason, m.message_zh) == ("inbox/a.txt", "文件损坏", "您的材料…")
    assert store.reviews.messages("d2") == []


def test_batches_are_saved_once_and_renamed(store: Store) -> None:
    """Saving a batch id again keeps its documents and takes the new name."""
    store.batches.save("b1", "first name", ["d1", "d2"])
    store.batches.save("b1", "second name", ["d1", "d2"])
    batch = store.batches.get("b1")
    assert batch is not None
    assert (batch.name, batch.document_ids) == ("second name", ["d1", "d2"])
    assert store.batches.get("nope") is None
