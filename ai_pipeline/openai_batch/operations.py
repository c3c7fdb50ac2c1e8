"""The Batch API path as commands and sensors use it: a client for the configured endpoint,
submitting documents (planned and sent at once), one bounded pass that follows the jobs, and a
job as people and ``--json`` read it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.openai_batch.planning import plan
from ai_pipeline.openai_batch.request_files import NO_SUCH_DOCUMENT
from ai_pipeline.openai_batch.results import PhaseHook
from ai_pipeline.redaction import register_secret
from ai_pipeline.settings import Settings
from ai_pipeline.spend import Budget, Prices
from ai_pipeline.states import State
from ai_pipeline.store import Store, open_store
from ai_pipeline.store.openai_batch_rows import BatchJob
from ai_pipeline.tasks import document_of

DEFAULT_BASE_URL = "https://api.openai.com/v1"


def batch_client(settings: Settings, api_key: str) -> Any:
    """A sync openai client for the Batch API of the configured endpoint: no SDK retries (a
    failed step is taken again at the next one), the call timeout of the settings."""
    import openai

    register_secret(api_key)
    return openai.OpenAI(
        base_url=settings.base_url or DEFAULT_BASE_URL,
        api_key=api_key,
        max_retries=0,
        timeout=settings.llm_timeout_seconds,
    )


def open_jobs(settings: Settings, api_key: str, *, on_phase: PhaseHook | None = None) -> BatchJobs:
    """The Batch API jobs of the configured results database, against the configured endpoint."""
    return BatchJobs(
        open_store(settings),
        batch_client(settings, api_key),
        Prices.of(settings),
        on_phase=on_phase,
        section_chars=settings.section_chars,
    )


# Documents a submission without ids takes: registered, readable, and not settled.
UNSETTLED = (State.PENDING, State.QUEUED, State.FAILED)


def submit(
    jobs: BatchJobs,
    model: str,
    document_ids: Sequence[str] | None = None,
    *,
    budget: Budget | None = None,
    budget_keys: Sequence[str] = (),
) -> dict[str, Any]:
    """Plan jobs for these documents (None: every unsettled one) and send them: uploaded and
    created now, followed by ``follow``. Under ``budget`` (a budget of this submission's own)
    and the budgets ``budget_keys`` names, the jobs reserve them at the batch price. What was
    planned, and what was left out and why; ``left_to_sync`` lists the documents the synchronous
    path is to finish (a checkpoint already, not batchable, or given up on)."""
    store = jobs.store
    keys = list(budget_keys)
    if budget is not None:
        key = f"launch:{uuid.uuid4().hex}"
        keys.append(store.spend.set_budget(key, tokens=budget.tokens, usd=budget.usd).key)
    if document_ids is None:
        document_ids = [
            row.document_id
            for row in store.documents.rows()
            if row.state in UNSETTLED and not row.rejected_reason
        ]
    planned = plan(
        store,
        document_ids,
        model,
        section_chars=jobs.section_chars,
        budget_keys=keys,
        prices=jobs.prices,
    )
    sent = [jobs.send(job) for job in planned.jobs]
    left = {document_of(t) for t in [*planned.done, *planned.gave_up]}
    left.update(d for d, why in planned.not_batchable.items() if why != NO_SUCH_DOCUMENT)
    return {
        "left_to_sync": sorted(left),
        "documents_in_jobs": sorted(
            {
                job_line.document_id
                for job in sent
                for job_line in store.openai_batches.lines(job.intent_id)
            }
            | {document_of(t) for t in planned.in_open_jobs}
        ),
        "jobs": [job_report(store, job) for job in sent],
        "tasks": sum(job.task_count for job in sent),
        "already_done": len(planned.done),
        "in_open_jobs": len(planned.in_open_jobs),
        "not_batchable": planned.not_batchable,
        "gave_up": planned.gave_up,
        "over_budget": len(planned.over_budget),
        "budget": planned.budget_message,
    }


def follow(jobs: BatchJobs, *, max_jobs: int = 20) -> dict[str, Any]:
    """One bounded pass over the unfinished jobs (``BatchJobs.tick``), as a report."""
    progress = jobs.tick(max_jobs=max_jobs)
    return {
        "advanced": len(progress.advanced),
        "answered": progress.answered,
        "failed": progress.failed,
        "expired": progress.expired,
        "finished": [job_report(jobs.store, job) for job in progress.finished],
        "documents": sorted(progress.documents),
        "open": [job_report(jobs.store, job) for job in jobs.store.openai_batches.unfinished()],
    }


def job_report(store: Store, job: BatchJob, *, with_lines: bool = False) -> dict[str, Any]:
    """A job as people and ``--json`` read it: ids, status, counts, and its lines by state."""
    lines = store.openai_batches.lines(job.intent_id)
    by_state: dict[str, int] = {}
    for line in lines:
        by_state[line.state.value] = by_state.get(line.state.value, 0) + 1
    out: dict[str, Any] = {
        "intent_id": job.intent_id,
        "batch_id": job.batch_id,
        "file_id": job.file_id,
        "status": job.status.value,
        "remote_status": job.remote_status,
        "model": job.model,
        "tasks": job.task_count,
        "request_counts": {
            "total": job.request_total,
            "completed": job.request_completed,
            "failed": job.request_failed,
        },
        "lines": by_state,
        "error": job.error,
        "created_at": job.created_at.isoformat(),
        "submitted_at": job.submitted_at.isoformat() if job.submitted_at else None,
        "ended_at": job.ended_at.isoformat() if job.ended_at else None,
    }
    if with_lines:
        out["line_details"] = [
            {
                "task_id": line.task_id,
                "document_id": line.document_id,
                "state": line.state.value,
                "category": line.category.value if line.category else None,
                "status_code": line.status_code,
                "error": line.error,
            }
            for line in lines
        ]
    return out
