"""Applying a Batch API job's results: each line of its output and error files becomes its
task's checkpoint (a reply, as a call's, with its usage at the batch price) or a failed or expired
line, classified by the failure taxonomy; what no file mentions is released. Also what a
``tick`` reports (``Progress``) and the hook told of each phase (``PhaseHook``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ai_pipeline.failures import Category, ClassifiedError, category_for_reply
from ai_pipeline.llm import LLMReply, reply_of
from ai_pipeline.llm_access import billed_details
from ai_pipeline.redaction import redact
from ai_pipeline.spend import Prices
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import BatchJob, JobStatus, LineState
from ai_pipeline.store.spend import ANSWER, ESTIMATED_ANSWER, Usage
from ai_pipeline.truncation import larger_limit

logger = logging.getLogger("ai_pipeline.openai_batch")

# Told of a phase's outside effect before it is recorded: ("uploaded", job), ("created", job),
# ("polled", job), ("checkpointed", job) after each line's checkpoint, ("ingested", job).
PhaseHook = Callable[[str, BatchJob], None]


@dataclass
class Progress:
    """What one ``tick`` did."""

    advanced: list[str] = field(default_factory=list)  # intent ids
    held_elsewhere: list[str] = field(default_factory=list)  # another process advances them
    answered: int = 0
    failed: int = 0
    expired: int = 0
    finished: list[BatchJob] = field(default_factory=list)
    # Jobs a step failed for (intent id → category and message); they are tried again at the
    # next tick, except a job never sent whose failure is not retryable: it is abandoned.
    errors: dict[str, str] = field(default_factory=dict)
    documents: set[str] = field(default_factory=set)  # whose lines were settled
    # Documents with a checkpoint from a line, and the job (intent id) that answered each.
    answered_documents: dict[str, str] = field(default_factory=dict)
    # Documents whose line failed or expired: another job may take them (``plan`` decides).
    unanswered_documents: set[str] = field(default_factory=set)


@dataclass
class Ingestion:
    """Settles the lines of one job whose remote batch has ended, from its result files."""

    store: Store
    client: Any
    prices: Prices
    on_phase: PhaseHook

    def ingest(self, job: BatchJob, progress: Progress) -> None:
        pending = {
            line.task_id: line
            for line in self.store.openai_batches.lines(job.intent_id, LineState.PENDING)
        }
        for file_id in (job.output_file_id, job.error_file_id):
            if file_id is None or not pending:
                continue
            for raw in self.client.files.content(file_id).text.splitlines():
                if not raw.strip():
                    continue
                result = json.loads(raw)
                line = pending.pop(str(result.get("custom_id")), None)
                if line is None:
                    continue  # settled before, or not ours
                self._settle(job, line.task_id, line.document_id, line.step, result, progress)
                progress.documents.add(line.document_id)
                if line.document_id not in progress.answered_documents:
                    progress.unanswered_documents.add(line.document_id)
        self._settled_before(job, progress)
        self.on_phase("ingested", job)
        # What no file mentions (a cancelled or failed batch) is released, unanswered; only a
        # failed batch's lines may go again (a cancel was somebody's decision).
        if job.status == JobStatus.FAILED:
            progress.unanswered_documents.update(line.document_id for line in pending.values())
        self.store.openai_batches.finish(job.intent_id, JobStatus.INGESTED)

    def _settled_before(self, job: BatchJob, progress: Progress) -> None:
        """What the lines settled by an earlier pass decided, reported again: a pass killed
        in the middle of a job settled them, and its runs and retries were never asked for.
        (Asking twice does no harm: the sensor's run keys name the job and the document.)"""
        for line in self.store.openai_batches.lines(job.intent_id):
            if line.document_id in progress.documents:
                continue
            if line.state == LineState.ANSWERED:
                progress.answered_documents[line.document_id] = job.intent_id
                progress.unanswered_documents.discard(line.document_id)
            elif (
                line.state in (LineState.FAILED, LineState.EXPIRED)
                and line.document_id not in progress.answered_documents
            ):
                progress.unanswered_documents.add(line.document_id)

    def _settle(
        self,
        job: BatchJob,
        task: str,
        document_id: str,
        step: str,
        result: dict[str, Any],
        progress: Progress,
    ) -> None:
        batches = self.store.openai_batches
        response = result.get("response")
        response = response if isinstance(response, dict) else {}
        status = response.get("status_code")
        if isinstance(status, int) and 200 <= status < 300:
            try:
                reply, usage = self._reply(job, task, document_id, step, response["body"])
            except ClassifiedError as e:
                self._failed(job, task, progress, e.category, status, e.message)
                return
            if reply.finish_reason == "length" and self._asks_again(job.model):
                # The synchronous path would not keep this reply: it asks once more with a
                # larger limit. The line is paid for; its task is left to that path.
                self._failed(
                    job,
                    task,
                    progress,
                    Category.SCHEMA_VIOLATION,
                    status,
                    "cut off at the output limit: left to the synchronous path, which asks again "
                    "with a larger one",
                    usage=usage,
                )
                return
            # As a call's reply: stored before anything else is done with it.
            self.store.checkpoints.put(task, document_id, step, reply.to_payload())
            self.on_phase("checkpointed", job)
            if batches.answer_line(job.intent_id, task, usage):
                progress.answered += 1
            progress.answered_documents[document_id] = job.intent_id
            return
        if isinstance(status, int):
            error = (response.get("body") or {}).get("error") or {}
            category = category_for_reply(
                status, code=_text(error.get("code")), param=_text(error.get("param"))
            )
            message = redact(f"HTTP {status}: {error.get('message', '')}")[:500]
            self._failed(job, task, progress, category, status, message)
            return
        error = result.get("error") or {}
        code = _text(error.get("code")) if isinstance(error, dict) else None
        message = redact(f"{code}: {error.get('message', '') if isinstance(error, dict) else ''}")
        if code == "batch_expired":
            batches.fail_line(
                job.intent_id,
                task,
                LineState.EXPIRED,
                category=None,
                status_code=None,
                error=message,
            )
            progress.expired += 1
        else:
            # No HTTP answer at all: the endpoint's failure, as a lost call would be.
            self._failed(job, task, progress, Category.NETWORK_TIMEOUT, None, message)

    def _failed(
        self,
        job: BatchJob,
        task: str,
        progress: Progress,
        category: Category,
        status_code: int | None,
        error: str,
        usage: Usage | None = None,
    ) -> None:
        """Settle a line as failed (with its usage when it was paid for), and count it."""
        self.store.openai_batches.fail_line(
            job.intent_id,
            task,
            LineState.FAILED,
            category=category,
            status_code=status_code,
            error=error,
            usage=usage,
        )
        progress.failed += 1

    def _asks_again(self, model: str) -> bool:
        """Whether the synchronous path would ask again after a reply cut off at the limit."""
        return larger_limit(model, self.store.analysis.model, None) is not None

    def _reply(
        self, job: BatchJob, task: str, document_id: str, step: str, body: Any
    ) -> tuple[LLMReply, Usage]:
        """A line's reply as the synchronous path stores it, and its usage at the batch price."""
        from openai.types.chat import ChatCompletion

        try:
            completion = ChatCompletion.model_validate(body)
        except ValueError as e:
            raise ClassifiedError(
                Category.SCHEMA_VIOLATION, f"the line's body is not a chat completion: {e}"
            ) from e
        # A line has no latency of its own worth recording (it waited in the batch).
        reply = reply_of(completion, job.model, latency_ms=0)
        usage = completion.usage
        cached, reasoning = billed_details(usage)
        prompt, completion_tokens = reply.prompt_tokens or 0, reply.completion_tokens or 0
        if usage is None:
            logger.warning("%s: the batch line reported no usage; recorded as 0 tokens", task)
        return reply, Usage(
            task_id=task,
            document_id=document_id,
            step=step,
            model=reply.model,
            outcome=ANSWER if usage is not None else ESTIMATED_ANSWER,
            prompt_tokens=prompt,
            completion_tokens=completion_tokens,
            cost_usd=self.prices.batch_cost(reply.model, prompt, completion_tokens, cached or 0),
            cached_tokens=cached,
            reasoning_tokens=reasoning,
            via="batch",
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
