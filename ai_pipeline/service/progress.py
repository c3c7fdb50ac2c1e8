"""A task as its submitter sees it: state, progress, current step, result or error.

Everything is read from the results database, so any web process answers the same: the task's
status (its document's state-machine state, as the API names it: ``TaskStatus``), how far its work
got (its analysis checkpoint, its results row), for a
completed task the upserted analysis, and for a task a reviewer rejected the standard message its
submitter is sent (and that a person decided). Progress only grows while the task is live, which lets the
event stream number its ``progress`` events by their value (``Last-Event-ID`` resumes after it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.rows import DocumentRow, ReviewStatus
from ai_pipeline.store.tasks import TenantTask
from ai_pipeline.tasks import SECTION_STEP_PREFIX

# Where a live task stands: (progress 0–100, current step).
QUEUED = (0, "queued")
ANALYSING = (10, "analysing")
CHECKING = (60, "checking and storing the analysis")
NOTIFYING = (90, "sending the completion notice")
DONE = (100, "completed")
# States after which a task's event stream ends (FAILED may be retried later: a new stream).
FINAL = frozenset({State.COMPLETED, State.CANCELLED, State.FAILED, State.DEAD_LETTER})


class TaskStatus(str, enum.Enum):
    """A task's status in the API. A submitted task is QUEUED from the moment it is accepted:
    whether the submissions sensor has launched its run yet (document PENDING → QUEUED) is the
    state machine's business, not the submitter's."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DEAD_LETTER = "DEAD_LETTER"
    CANCELLED = "CANCELLED"

    @classmethod
    def of(cls, state: State) -> TaskStatus:
        return cls.QUEUED if state == State.PENDING else cls(state.value)

    def states(self) -> list[State]:
        """The document states this status stands for (what a listing filters on)."""
        return [s for s in State if TaskStatus.of(s) == self]


@dataclass(frozen=True)
class Rejection:
    """A reviewer turned the task down: the standard message its submitter receives."""

    message_zh: str
    message_en: str
    decided_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "decision": "rejected",
            "decided_by": "person",
            "decided_at": self.decided_at.isoformat(),
            "message": self.message_zh,
            "message_en": self.message_en,
        }


@dataclass(frozen=True)
class TaskView:
    # The analysis the task is for (its results database's).
    analysis: str
    task: TenantTask
    doc: DocumentRow
    progress: int
    current_step: str
    result: dict[str, Any] | None
    completed_at: datetime | None
    sections_done: int = 0
    rejection: Rejection | None = None

    @property
    def final(self) -> bool:
        return self.doc.state in FINAL

    @property
    def status(self) -> TaskStatus:
        return TaskStatus.of(self.doc.state)

    def as_json(self, dagster_url: str) -> dict[str, Any]:
        doc = self.doc
        failed = doc.state in (State.FAILED, State.DEAD_LETTER)
        return {
            "task_id": self.task.task_id,
            "analysis": self.analysis,
            "name": self.task.name,
            "status": self.status.value,
            "cancel_requested": doc.cancel_requested and doc.state == State.RUNNING,
            "progress": self.progress,
            "current_step": self.current_step,
            "sections": {"done": self.sections_done, "total": doc.sections or 1},
            "result": self.result,
            "category": doc.category.value if failed and doc.category else None,
            # After a reviewer's rejection the submitter is told the standard message, not the
            # failure a person has since looked at.
            "error": (
                f"{self.rejection.message_zh} / {self.rejection.message_en}"
                if self.rejection
                else doc.last_error
            )
            if failed
            else None,
            "review": self.rejection.as_json() if self.rejection else None,
            "created_at": self.task.created_at.isoformat(),
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "dagster_run_url": f"{dagster_url.rstrip('/')}/runs/{doc.run_id}"
            if doc.run_id
            else None,
        }


def view(store: Store, task: TenantTask) -> TaskView:
    doc = store.documents.get(task.document_id)
    assert doc is not None, f"task {task.task_id} has no document"
    result = None
    completed_at = None
    if doc.state == State.COMPLETED:
        progress, step = DONE
        rows = store.results.get([doc.document_id])
        if rows:
            row = rows[0]
            result = {
                **row.output,
                "analysis": store.analysis.name,
                "model": row.model,
                "prompt_version": row.prompt_version,
                **({"sections": row.sections} if row.sections is not None else {}),
            }
        completed_at = doc.updated_at
    elif doc.state == State.RUNNING:
        if store.results.get([doc.document_id]):
            progress, step = NOTIFYING
        elif doc.sections:
            done = store.checkpoints.count_for(doc.document_id, SECTION_STEP_PREFIX)
            if done >= doc.sections:
                progress, step = CHECKING
            else:
                # "analysing clause k/n" (as the analysis names its sections): 10 % at the
                # first, 60 % when every one is done.
                progress = ANALYSING[0] + (CHECKING[0] - ANALYSING[0]) * done // doc.sections
                sections = store.analysis.sections
                label = sections.label if sections is not None else "section"
                step = f"analysing {label} {min(done + 1, doc.sections)}/{doc.sections}"
        elif doc.task_id and store.checkpoints.get(doc.task_id) is not None:
            progress, step = CHECKING
        else:
            progress, step = ANALYSING
    elif doc.state in FINAL:
        progress, step = 0, doc.state.value.lower().replace("_", " ")
    else:
        progress, step = QUEUED
    sections_done = (
        store.checkpoints.count_for(doc.document_id, SECTION_STEP_PREFIX)
        if doc.sections
        else int(doc.state == State.COMPLETED)
    )
    return TaskView(
        store.analysis.name,
        task,
        doc,
        progress,
        step,
        result,
        completed_at,
        sections_done,
        rejection(store, doc),
    )


def rejection(store: Store, doc: DocumentRow) -> Rejection | None:
    """The reviewer's rejection of the document, with the message its submitter was sent."""
    if not doc.rejected_by_reviewer:
        return None
    item = store.reviews.get(doc.document_id)
    messages = store.reviews.messages(doc.document_id)
    if item is None or item.status != ReviewStatus.REJECTED or not messages:
        return None
    sent = messages[-1]
    return Rejection(sent.message_zh, sent.message_en, item.updated_at)
