"""The rows the store hands out: frozen dataclasses and enums, never dicts indexed by string.

Times are always timezone-aware (UTC), whichever database they came from (SQLite returns naive
datetimes for ``DateTime(timezone=True)``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any

from ai_pipeline.failures import Category, Layer
from ai_pipeline.states import State


def aware(value: datetime) -> datetime:
    """A datetime in UTC; a naive one (SQLite) is taken to be UTC already."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _category(value: str | None) -> Category | None:
    return Category(value) if value else None


class ReviewStatus(str, enum.Enum):
    """Where a review item stands: a person has it, decided it, or the approved rerun completed;
    or its task was cancelled, which leaves nothing to decide (nor to re-submit)."""

    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    RESOLVED = "resolved"
    CANCELLED = "cancelled"


class Decision(str, enum.Enum):
    """What a reviewer decided about an item."""

    ACCEPT_OUTPUT = "accept_output"
    RETRY = "retry"
    REJECT = "reject"


@dataclass(frozen=True)
class DocumentRow:
    """A document's registration and state, without its text (listings never load texts)."""

    document_id: str
    source: str
    kind: str
    size_bytes: int
    rejected_reason: str | None
    state: State
    category: Category | None
    last_error: str | None
    attempts: int
    task_id: str | None
    run_id: str | None
    status_message: str | None
    rejected_by_reviewer: bool
    created_at: datetime
    updated_at: datetime
    cancel_requested: bool = False
    sections: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> DocumentRow:
        return cls(**_document_fields(row))


@dataclass(frozen=True)
class StoredDocument(DocumentRow):
    """A document with its normalised text (None when the file could not be read)."""

    text: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> StoredDocument:
        return cls(**_document_fields(row), text=row.text)


def _document_fields(row: Any) -> dict[str, Any]:
    return {
        "document_id": row.document_id,
        "source": row.source,
        "kind": row.kind,
        "size_bytes": row.size_bytes,
        "rejected_reason": row.rejected_reason,
        "state": State(row.state),
        "category": _category(row.category),
        "last_error": row.last_error,
        "attempts": row.attempts,
        "task_id": row.task_id,
        "run_id": row.run_id,
        "status_message": row.status_message,
        "rejected_by_reviewer": bool(row.rejected_by_reviewer),
        "cancel_requested": bool(row.cancel_requested),
        "sections": row.sections,
        "created_at": aware(row.created_at),
        "updated_at": aware(row.updated_at),
    }


@dataclass(frozen=True)
class ResultRow:
    """One document's output in the results table: the analysis's fields in ``output``."""

    document_id: str
    output: dict[str, Any]
    task_id: str
    model: str
    prompt_version: str
    sources: list[str]
    prompt_tokens: int | None
    completion_tokens: int | None
    # A sectioned document's per-section outputs, in order; None when it took one call.
    sections: list[dict[str, Any]] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any, fields: Sequence[str]) -> ResultRow:
        values = dict(row._mapping)
        for name in ("created_at", "updated_at"):
            if values[name] is not None:
                values[name] = aware(values[name])
        output = {name: values.pop(name) for name in fields}
        return cls(output=output, **{k: v for k, v in values.items() if k in _ROW_FIELDS})

    @classmethod
    def from_record(cls, record: dict[str, Any], fields: Sequence[str]) -> ResultRow:
        """A row from a flat record, as ``as_record`` gives it (a DataFrame's row)."""
        output = {name: record[name] for name in fields}
        return cls(output=output, **{k: v for k, v in record.items() if k in _ROW_FIELDS})

    def as_record(self) -> dict[str, Any]:
        """The row flat, the output's fields as columns: as the results table holds it."""
        values = asdict(self)
        return {"document_id": values.pop("document_id"), **values.pop("output"), **values}


# What a results row records beside the output's fields.
_ROW_FIELDS = {f.name for f in fields(ResultRow)} - {"output"}


@dataclass(frozen=True)
class FailureEvent:
    """One classification of a failure (a retried request, or a document's final failure)."""

    id: int
    at: datetime
    document_id: str
    task_id: str | None
    run_id: str | None
    category: Category
    layer: Layer
    attempt: int
    error: str

    @classmethod
    def from_row(cls, row: Any) -> FailureEvent:
        return cls(
            id=row.id,
            at=aware(row.at),
            document_id=row.document_id,
            task_id=row.task_id,
            run_id=row.run_id,
            category=Category(row.category),
            layer=Layer(row.layer),
            attempt=row.attempt,
            error=row.error,
        )


@dataclass(frozen=True)
class HistoryEntry:
    """Something people or the pipeline did to a document (review, override, dead letter…)."""

    id: int
    at: datetime
    document_id: str
    task_id: str | None
    event: str
    detail: str | None

    @classmethod
    def from_row(cls, row: Any) -> HistoryEntry:
        return cls(row.id, aware(row.at), row.document_id, row.task_id, row.event, row.detail)


@dataclass(frozen=True)
class InputSnapshot:
    """What a reviewer needs to see of a document's input, without opening the file."""

    source: str
    kind: str
    size_bytes: int
    sha256: str | None
    first_characters: str
    rejected_reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReviewItem:
    """A document in front of a person, with the failure that put it there."""

    document_id: str
    task_id: str | None
    category: Category
    error: str
    snapshot: InputSnapshot
    status: ReviewStatus
    decision: Decision | None
    decided_by: str | None
    note: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> ReviewItem:
        return cls(
            document_id=row.document_id,
            task_id=row.task_id,
            category=Category(row.category),
            error=row.error,
            snapshot=InputSnapshot(**row.snapshot),
            status=ReviewStatus(row.status),
            decision=Decision(row.decision) if row.decision else None,
            decided_by=row.decided_by,
            note=row.note,
            created_at=aware(row.created_at),
            updated_at=aware(row.updated_at),
        )


@dataclass(frozen=True)
class QuarantinedOutput:
    """An LLM output whose grounded values are not in the document: kept for audit, never used."""

    task_id: str
    document_id: str
    output: str
    reason: str
    at: datetime

    @classmethod
    def from_row(cls, row: Any) -> QuarantinedOutput:
        return cls(row.task_id, row.document_id, row.output, row.reason, aware(row.at))


@dataclass(frozen=True)
class Override:
    """A stored output a reviewer accepted although a check failed on it."""

    task_id: str
    document_id: str
    decided_by: str
    note: str | None
    at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Override:
        return cls(row.task_id, row.document_id, row.decided_by, row.note, aware(row.at))


@dataclass(frozen=True)
class SubmitterMessage:
    """A message to whoever submitted a rejected document (the outbox)."""

    id: int
    at: datetime
    document_id: str
    source: str
    reason: str
    message_zh: str
    message_en: str

    @classmethod
    def from_row(cls, row: Any) -> SubmitterMessage:
        return cls(
            row.id,
            aware(row.at),
            row.document_id,
            row.source,
            row.reason,
            row.message_zh,
            row.message_en,
        )


@dataclass(frozen=True)
class Replan:
    """Documents of a backfill whose runs Dagster planned, run in fewer runs: each one's
    documents."""

    seq: int
    backfill_id: str
    runs: list[list[str]]
    named: bool
    created_at: datetime

    @property
    def documents(self) -> list[str]:
        return [d for run in self.runs for d in run]

    @classmethod
    def from_row(cls, row: Any) -> Replan:
        return cls(
            row.seq,
            row.backfill_id,
            [list(r) for r in row.runs],
            bool(row.named),
            aware(row.created_at),
        )


@dataclass(frozen=True)
class Batch:
    """A named set of documents submitted together; its id is derived from their ids."""

    batch_id: str
    name: str
    document_ids: list[str]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Batch:
        return cls(
            row.batch_id,
            row.name,
            list(row.document_ids),
            aware(row.created_at),
            aware(row.updated_at),
        )
