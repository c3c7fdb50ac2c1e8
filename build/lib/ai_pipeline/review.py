"""The human review queue: what goes in front of a person, and what a
person's decision does.

- ``send_to_review``: a document failed in a way only a person can settle (its category needs a
  person, ``ai_pipeline.failures``): it gets an item with a snapshot of its input.
- ``approve``: the reviewer lets the document go again under its original task id. For a
  model-layer failure they choose to accept the stored output despite the failed check (recorded
  with who and why) or to discard that answer and ask the model again. The caller then re-submits
  the document through Dagster (``ai_pipeline.defs.launch.approve``).
- ``reject``: the standard message «您的材料存在{R}问题，请修正后重新提交» (and an English twin) goes to
  the document's status and the submitter-messages outbox; the document is settled, nothing
  downstream happens and it is never analysed again.
- ``resolve_if_approved``: an approved document that then completes is resolved, and its history
  records ``MANUAL_OVERRIDE_SUCCESS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category, Layer
from ai_pipeline.store import Store
from ai_pipeline.store.rows import (
    Decision,
    InputSnapshot,
    ReviewItem,
    ReviewStatus,
    StoredDocument,
)
from ai_pipeline.tasks import ANALYSE_STEP

MODEL_LAYER = frozenset(c for c in Category if c.rule.layer == Layer.MODEL)
MANUAL_OVERRIDE_SUCCESS = "MANUAL_OVERRIDE_SUCCESS"
REJECTION_ZH = "您的材料存在{reason}问题，请修正后重新提交"
REJECTION_EN = "Your submission has a problem ({reason}). Please correct it and submit it again."
SNAPSHOT_CHARS = 200
# Who decided, for a decision taken on the review page (``ai_pipeline.service``): the approvals
# sensor re-submits those; ``ai-pipeline review approve`` re-submits its own at once.
WEB_REVIEWER = "review page: "


def snapshot(doc: StoredDocument) -> InputSnapshot:
    """What a reviewer needs to see of a document's input, without opening the file."""
    text = doc.text or ""
    return InputSnapshot(
        source=doc.source,
        kind=doc.kind,
        size_bytes=doc.size_bytes,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None,
        first_characters=text[:SNAPSHOT_CHARS],
        rejected_reason=doc.rejected_reason,
    )


def send_to_review(
    store: Store, doc: StoredDocument, category: Category, error: str, task: str | None
) -> None:
    """Put a failed document in front of a person (a later failure updates the same item)."""
    store.reviews.open(doc.document_id, category, error, snapshot(doc), task_id=task)


def open_items(store: Store, categories: Iterable[Category] | None = None) -> list[ReviewItem]:
    """The items waiting for a person, oldest first (only these categories, when given)."""
    wanted = set(categories) if categories else None
    return [i for i in store.reviews.items() if wanted is None or i.category in wanted]


def _open_item(store: Store, document_id: str) -> ReviewItem:
    item = store.reviews.get(document_id)
    if item is None or item.status != ReviewStatus.OPEN:
        raise InputError(f"{document_id} has no open review item (see: ai-pipeline review list)")
    return item


@dataclass(frozen=True)
class Approval:
    document_id: str
    task_id: str | None
    decision: Decision


def approve(
    store: Store,
    document_id: str,
    *,
    decision: Decision | None,
    by: str,
    note: str | None = None,
) -> Approval:
    """Record a reviewer's approval; the document is then to be re-submitted under its task id.

    ``decision`` is ACCEPT_OUTPUT or RETRY; it must be given for a model-layer failure (None means
    RETRY for the others).
    """
    item = _open_item(store, document_id)
    doc = store.documents.get(document_id)
    assert doc is not None, f"a review item without its document {document_id}"
    if decision == Decision.REJECT:
        raise InputError("a rejection is not an approval: use reject")
    if item.category in MODEL_LAYER and decision is None:
        raise InputError(
            f"{item.category.value} is a model-layer failure: choose --accept-output (keep the "
            "stored output despite the failed check) or --retry (call the model again, same task "
            "id)"
        )
    if doc.rejected_reason:
        raise InputError(
            f"{doc.source} could not be read ({doc.rejected_reason}): fix the file and submit it "
            "again (new content is a new document), or reject the item"
        )
    task = item.task_id
    if decision == Decision.ACCEPT_OUTPUT:
        if task is None or store.checkpoints.get(task) is None:
            raise InputError(f"{document_id} has no stored output to accept (task {task})")
        store.reviews.add_override(task, document_id, by, note)
    else:
        decision = Decision.RETRY
        # Counted as an attempt like any other call; the task id stays the same.
        if item.category in MODEL_LAYER and task is not None and store.checkpoints.delete(task):
            store.events.add_history(document_id, "CHECKPOINT_DISCARDED", f"{ANALYSE_STEP} {task}")
    store.reviews.decide(
        document_id, status=ReviewStatus.APPROVED, decision=decision, decided_by=by, note=note
    )
    store.events.add_history(
        document_id, "REVIEW_APPROVED", f"{decision.value} by {by}", task_id=task
    )
    return Approval(document_id, task, decision)


@dataclass(frozen=True)
class Rejection:
    document_id: str
    message_zh: str
    message_en: str


def reject(store: Store, document_id: str, *, reason: str, by: str) -> Rejection:
    """Reject an item with the standard message to its submitter; nothing downstream happens."""
    _open_item(store, document_id)
    doc = store.documents.get(document_id)
    assert doc is not None, f"a review item without its document {document_id}"
    zh = REJECTION_ZH.format(reason=reason)
    en = REJECTION_EN.format(reason=reason)
    store.reviews.decide(
        document_id,
        status=ReviewStatus.REJECTED,
        decision=Decision.REJECT,
        decided_by=by,
        note=reason,
    )
    store.reviews.add_message(document_id, doc.source, reason, zh, en)
    store.documents.mark_rejected(document_id, f"{zh} / {en}")
    store.events.add_history(document_id, "REVIEW_REJECTED", f"by {by}: {reason}")
    return Rejection(document_id, zh, en)


def resolve_if_approved(store: Store, document_id: str, task: str) -> str | None:
    """When an approved document completes: record MANUAL_OVERRIDE_SUCCESS and resolve the item.

    Returns the line to log (who approved it and why), or None when no approval was pending.
    """
    item = store.reviews.get(document_id)
    if item is None or item.status != ReviewStatus.APPROVED or item.decision is None:
        return None
    detail = f"{item.decision.value} by {item.decided_by}: {item.note or ''}"
    store.events.add_history(document_id, MANUAL_OVERRIDE_SUCCESS, detail, task_id=task)
    store.reviews.resolve(document_id)
    return f"{MANUAL_OVERRIDE_SUCCESS} ({detail})"
