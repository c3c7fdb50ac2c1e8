"""The typed rows of Batch API jobs: a job (``BatchJob``) and its status, a line (``BatchLine``)
and its state, a task a job is planned with, and how a table row becomes each. The table's
reads and writes are :mod:`ai_pipeline.store.openai_batches`'."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ai_pipeline.failures import Category
from ai_pipeline.store.rows import aware


class JobStatus(str, enum.Enum):
    """Where a Batch API job stands: ours before it goes out, then the remote batch's status,
    then ours again once every line is settled."""

    PLANNED = "planned"
    UPLOADED = "uploaded"
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    INGESTED = "ingested"
    # Never went out (its request file could not be rebuilt as planned): its tasks are free.
    ABANDONED = "abandoned"

    @property
    def remote_ended(self) -> bool:
        """The remote batch is over: its files are final, its lines can be read."""
        return self in (
            JobStatus.COMPLETED,
            JobStatus.FAILED,
            JobStatus.EXPIRED,
            JobStatus.CANCELLED,
        )

    @property
    def finished(self) -> bool:
        """Nothing is left to do for the job."""
        return self in (JobStatus.INGESTED, JobStatus.ABANDONED)


class LineState(str, enum.Enum):
    PENDING = "pending"
    ANSWERED = "answered"  # its reply is the task's checkpoint
    FAILED = "failed"  # an error line: its category and status code say why
    EXPIRED = "expired"  # batch_expired: the window closed before it was done
    UNANSWERED = "unanswered"  # the job ended without a line for it (cancelled, failed)


@dataclass(frozen=True)
class BatchJob:
    intent_id: str
    model: str
    endpoint: str
    task_count: int
    content_hash: str
    content_bytes: int
    file_id: str | None
    batch_id: str | None
    status: JobStatus
    remote_status: str | None
    request_total: int | None
    request_completed: int | None
    request_failed: int | None
    output_file_id: str | None
    error_file_id: str | None
    error: str | None
    budget_keys: list[str]
    completion_cap: int | None
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True)
class BatchLine:
    intent_id: str
    task_id: str
    ordinal: int
    document_id: str
    step: str
    state: LineState
    category: Category | None
    status_code: int | None
    error: str | None


@dataclass(frozen=True)
class PlannedTask:
    """A task a job carries: its id, document and step (its line's ``custom_id`` is the id)."""

    task_id: str
    document_id: str
    step: str
    # What its line reserves of the job's budgets (at the batch price) until it is settled.
    reserved_tokens: int = 0
    reserved_usd: float = 0.0


class TasksTaken(ValueError):
    """Some of the tasks of a planned job are in another open job already."""


def job_from_row(row: sa.Row) -> BatchJob:  # type: ignore[type-arg]
    def when(value: datetime | None) -> datetime | None:
        return aware(value) if value is not None else None

    return BatchJob(
        intent_id=row.intent_id,
        model=row.model,
        endpoint=row.endpoint,
        task_count=row.task_count,
        content_hash=row.content_hash,
        content_bytes=row.content_bytes,
        file_id=row.file_id,
        batch_id=row.batch_id,
        status=JobStatus(row.status),
        remote_status=row.remote_status,
        request_total=row.request_total,
        request_completed=row.request_completed,
        request_failed=row.request_failed,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        error=row.error,
        budget_keys=list(row.budget_keys or []),
        completion_cap=row.completion_cap,
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        submitted_at=when(row.submitted_at),
        ended_at=when(row.ended_at),
    )


def line_from_row(row: sa.Row) -> BatchLine:  # type: ignore[type-arg]
    return BatchLine(
        intent_id=row.intent_id,
        task_id=row.task_id,
        ordinal=row.ordinal,
        document_id=row.document_id,
        step=row.step,
        state=LineState(row.state),
        category=Category(row.category) if row.category else None,
        status_code=row.status_code,
        error=row.error,
    )
