"""The analysis of a batch of documents, stage by stage, with a checkpoint before every effect.

One document goes through five stages, each of which is an asset in Dagster:

``document_text`` → ``llm_analysis`` → ``validated_analysis`` → ``analysis_results`` →
``completion_notice`` (only when a webhook is configured)

The batch runs its documents concurrently (bounded by the LLM client) and reports, per document
and per stage, what happened as plain ``StageDone``/``StageFailed`` events; the Dagster step in
``ai_pipeline.defs.assets`` turns them into materializations and check evaluations. Nothing here
imports Dagster, so the same code serves the CLI, the benchmark and the tests.

The rules that make a rerun safe:

- the LLM is called only when no checkpoint exists for the task id, and its reply is stored before
  anything else is done with it;
- results are upserted (one row per document, ever), through the callable the caller passes in —
  the results IO manager's own upsert;
- a completion notice is sent only when no checkpoint exists for its own task id, with that id as
  ``Idempotency-Key``, and never for a document that failed a check;
- a document's state moves only along the transitions of ``ai_pipeline.states``; a document that
  failed retryably ``retry_budget`` times moves to DEAD_LETTER, out of automatic retries.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient, LLMReply
from ai_pipeline.notify import Notifier
from ai_pipeline.redaction import redact
from ai_pipeline.schema import DEFAULT_MIN_CONFIDENCE, CheckOutcome, evaluate
from ai_pipeline.states import State
from ai_pipeline.store import Store

STAGES = (
    "document_text",
    "llm_analysis",
    "validated_analysis",
    "analysis_results",
    "completion_notice",
)
ANALYSE_STEP = "analyse"
NOTIFY_STEP = "notify"
DEFAULT_RETRY_BUDGET = 3
MANUAL_OVERRIDE_SUCCESS = "MANUAL_OVERRIDE_SUCCESS"


def task_id(document_id: str, step: str, prompt_version: str, model: str) -> str:
    """The idempotency key of one external call: a retry is the same task, a new prompt is not.

    The model name is hashed (it may hold ``/`` or ``:``, e.g. ``meta-llama/Llama-3:8b``) so that the
    id stays safe in headers, file names and log prefixes.
    """
    model_tag = hashlib.sha256(model.encode("utf-8")).hexdigest()[:8]
    return f"{document_id}-{step}-{prompt_version}-{model_tag}"


SNAPSHOT_CHARS = 200


def snapshot(doc: dict[str, Any]) -> dict[str, Any]:
    """What a reviewer needs to see of a document's input, without opening the file."""
    text = doc.get("text") or ""
    return {
        "source": doc["source"],
        "kind": doc["kind"],
        "size_bytes": doc["size_bytes"],
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None,
        "first_characters": text[:SNAPSHOT_CHARS],
        "rejected_reason": doc.get("rejected_reason"),
    }


class Log(Protocol):
    def info(self, msg: str) -> Any: ...
    def warning(self, msg: str) -> Any: ...
    def error(self, msg: str) -> Any: ...


@dataclass(frozen=True)
class StageDone:
    document_id: str
    stage: str
    metadata: dict[str, Any]
    checks: tuple[CheckOutcome, ...] = ()


@dataclass(frozen=True)
class StageFailed:
    document_id: str
    stage: str
    category: Category
    error: str
    task_id: str | None = None


Event = StageDone | StageFailed


class TaskLog:
    """Prefixes every line about a document's work with ``[TASK:<task id>]`` (seed 002 §2)."""

    def __init__(self, log: Log, task: str):
        self._log, self.prefix = log, f"[TASK:{task}]"

    def info(self, msg: str) -> None:
        self._log.info(redact(f"{self.prefix} {msg}"))

    def warning(self, msg: str) -> None:
        self._log.warning(redact(f"{self.prefix} {msg}"))

    def error(self, msg: str) -> None:
        self._log.error(redact(f"{self.prefix} {msg}"))


def _claim(store: Store, document_id: str, run_id: str | None) -> State:
    """Move a document to RUNNING along the legal path; returns the state it was in.

    COMPLETED and CANCELLED documents keep their state: a rerun only re-reports their checkpoints.
    """
    current = State(store.get_document(document_id)["state"])  # type: ignore[index]
    if current in (State.COMPLETED, State.CANCELLED):
        return current
    if current != State.QUEUED:
        # From PENDING, FAILED or DEAD_LETTER; or RUNNING left behind by a run that died.
        store.transition(document_id, State.QUEUED)
    store.transition(document_id, State.RUNNING, run_id=run_id)
    return current


class Analyser:
    """Runs the four stages for documents of one batch."""

    def __init__(
        self,
        store: Store,
        llm: LLMClient,
        upsert: Callable[[Sequence[dict[str, Any]]], Any],
        *,
        log: Log | None = None,
        run_id: str | None = None,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        notifier: Notifier | None = None,
        retry_budget: int = DEFAULT_RETRY_BUDGET,
    ):
        self.store = store
        self.llm = llm
        self.upsert = upsert
        self.log: Log = log or logging.getLogger("ai_pipeline")
        self.run_id = run_id
        self.min_confidence = min_confidence
        self.notifier = notifier
        self.retry_budget = retry_budget
        if llm.on_failure is None:
            llm.on_failure = self._record_attempt

    def task_for(self, document_id: str) -> str:
        return task_id(document_id, ANALYSE_STEP, self.llm.prompt.version, self.llm.model)

    async def process(self, document_id: str) -> list[Event]:
        """All stage events for one document; failures are events, never exceptions."""
        events: list[Event] = []
        task = self.task_for(document_id)
        log = TaskLog(self.log, task)
        doc = self.store.get_document(document_id)
        if doc is None:
            events.append(
                StageFailed(
                    document_id,
                    "document_text",
                    Category.INTERNAL_ERROR,
                    f"document {document_id} is not registered in the results database",
                    task,
                )
            )
            log.error(events[-1].error)  # type: ignore[union-attr]
            return events
        if doc["status_message"]:
            # A reviewer rejected it: nothing about it runs again, nothing downstream happens.
            category = Category(doc["category"]) if doc["category"] else Category.INTERNAL_ERROR
            events.append(
                StageFailed(
                    document_id,
                    "document_text",
                    category,
                    f"rejected by a reviewer: {doc['status_message']}",
                    task,
                )
            )
            log.info("rejected by a reviewer; not processed")
            return events
        previous = _claim(self.store, document_id, self.run_id)
        if previous == State.CANCELLED:
            log.info("cancelled; skipped")
            return events
        try:
            # Stages append as they finish, so the ones done before a failure are still reported.
            await self._stages(doc, task, log, events)
        except ClassifiedError as e:
            events.append(
                StageFailed(document_id, _stage_of(e), e.category, redact(e.message), task)
            )
        except Exception as e:  # a bug must fail this document, not the batch
            message = redact(f"{type(e).__name__}: {e}")[:500]
            log.error(f"unexpected error: {message}")
            stage = STAGES[min(len(events), len(STAGES) - 1)]
            events.append(StageFailed(document_id, stage, Category.INTERNAL_ERROR, message, task))
        failure = next((e for e in events if isinstance(e, StageFailed)), None)
        if previous == State.COMPLETED:
            return events
        if failure is None:
            self.store.transition(document_id, State.COMPLETED, task_id=task)
            review = self.store.get_review(document_id)
            if review is not None and review["status"] == "approved":
                detail = f"{review['decision']} by {review['decided_by']}: {review['note'] or ''}"
                self.store.add_history(document_id, MANUAL_OVERRIDE_SUCCESS, detail, task_id=task)
                self.store.decide_review_done(document_id)
                log.info(f"{MANUAL_OVERRIDE_SUCCESS} ({detail})")
            log.info("completed")
        else:
            self._fail(doc, failure, log)
        return events

    def _fail(self, doc: dict[str, Any], failure: StageFailed, log: TaskLog) -> None:
        """Record a document's failure: its state, a failure event, and a person's queue if due."""
        document_id, task = doc["document_id"], failure.task_id
        self.store.transition(
            document_id,
            State.FAILED,
            category=failure.category,
            error=failure.error,
            task_id=task,
            count_attempt=True,
        )
        attempts = self.store.get_document(document_id)["attempts"]  # type: ignore[index]
        self.store.record_failure(
            document_id,
            failure.category,
            failure.error,
            task_id=task,
            run_id=self.run_id,
            attempt=attempts,
        )
        if failure.category.needs_person:
            self.store.open_review(
                document_id, failure.category, failure.error, snapshot(doc), task_id=task
            )
        log.error(f"failed at {failure.stage}: {failure.category.value}: {failure.error}")
        if failure.category.retryable and attempts >= self.retry_budget:
            self.store.transition(document_id, State.DEAD_LETTER)
            detail = f"{attempts} retryable failures (budget {self.retry_budget})"
            self.store.add_history(document_id, "DEAD_LETTER", detail, task_id=task)
            log.error(f"moved to DEAD_LETTER after {detail}; `ai-pipeline requeue` puts it back")

    def _record_attempt(self, task: str, category: Category, request: int, error: str) -> None:
        """A failed request that the client retries or waits out: an event, not a state.

        ``attempt`` in the failure events is always the document's attempt (the run that tried
        it), the same number its final failure is recorded under; the request is in the text.
        """
        document_id = task.split("-", 1)[0]
        doc = self.store.get_document(document_id)
        attempt = (doc["attempts"] if doc else 0) + 1
        self.store.record_failure(
            document_id,
            category,
            f"request {request}: {error}",
            task_id=task,
            run_id=self.run_id,
            attempt=attempt,
        )

    async def _stages(
        self, doc: dict[str, Any], task: str, log: TaskLog, events: list[Event]
    ) -> None:
        document_id = doc["document_id"]
        sources = self.store.sources([document_id]).get(document_id, [doc["source"]])

        if doc["rejected_reason"]:
            raise _StageError(
                "document_text",
                Category.INPUT_QUALITY_ISSUE,
                f"{doc['source']}: {doc['rejected_reason']}",
            )
        text: str = doc["text"]
        events.append(
            StageDone(
                document_id,
                "document_text",
                {
                    "source": doc["source"],
                    "aliases": len(sources) - 1,
                    "kind": doc["kind"],
                    "size_bytes": doc["size_bytes"],
                    "characters": len(text),
                },
            )
        )

        payload = self.store.get_checkpoint(task)
        from_checkpoint = payload is not None
        if payload is None:
            log.info(f"calling {self.llm.model} (prompt {self.llm.prompt.version})")
            try:
                reply = await self.llm.analyse(task, text, log=log)
            except ClassifiedError as e:
                raise _StageError("llm_analysis", e.category, e.message) from e
            # Durable before anything else is done with it: a crash after this line never pays
            # for the same call again.
            payload = self.store.put_checkpoint(task, document_id, ANALYSE_STEP, reply.to_payload())
        else:
            log.info("LLM checkpoint found; no call")
        reply = LLMReply.from_payload(payload)
        verdict = evaluate(
            reply.content,
            text,
            finish_reason=reply.finish_reason,
            min_confidence=self.min_confidence,
        )
        events.append(
            StageDone(
                document_id,
                "llm_analysis",
                {
                    "task_id": task,
                    "model": reply.model,
                    "prompt_version": self.llm.prompt.version,
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "latency_ms": reply.latency_ms,
                    "from_checkpoint": from_checkpoint,
                    "source": doc["source"],
                },
                checks=tuple(verdict.outcomes),
            )
        )
        failed_check = verdict.failure
        override = self.store.get_override(task) if failed_check is not None else None
        if override is not None and verdict.analysis is not None:
            # A reviewer accepted this stored output although a check failed.
            log.warning(
                f"check {failed_check.name} failed but the output was accepted by "  # type: ignore[union-attr]
                f"{override['decided_by']}: {override['note'] or ''}"
            )
            failed_check = None
        if failed_check is not None or verdict.analysis is None:
            assert failed_check is not None and failed_check.category is not None
            if failed_check.category == Category.MODEL_HALLUCINATION:
                # Kept for the audit, never used as a result.
                self.store.quarantine_output(document_id, task, reply.content, failed_check.message)
            raise _StageError("validated_analysis", failed_check.category, failed_check.message)
        analysis = verdict.analysis
        events.append(
            StageDone(
                document_id,
                "validated_analysis",
                {
                    "task_id": task,
                    "sentiment": analysis.sentiment,
                    "confidence": analysis.confidence,
                    "keywords": ", ".join(analysis.keywords),
                    "summary": analysis.summary,
                },
            )
        )
        self.upsert(
            [
                {
                    "document_id": document_id,
                    **analysis.model_dump(),
                    "task_id": task,
                    "model": reply.model,
                    "prompt_version": self.llm.prompt.version,
                    "sources": sources,
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                }
            ]
        )
        events.append(
            StageDone(
                document_id,
                "analysis_results",
                {"task_id": task, "source": doc["source"], "sources": len(sources)},
            )
        )
        if self.notifier is not None:
            await self._notify(document_id, analysis.model_dump(), task, sources, events)
        else:
            # Reported as done-without-sending so that a run with failures does not show every
            # document's notice as failed; the metadata says why nothing was sent.
            events.append(
                StageDone(
                    document_id,
                    "completion_notice",
                    {"sent": False, "reason": "no webhook configured (AI_PIPELINE_WEBHOOK_URL)"},
                )
            )

    async def _notify(
        self,
        document_id: str,
        analysis: dict[str, Any],
        analysis_task: str,
        sources: list[str],
        events: list[Event],
    ) -> None:
        assert self.notifier is not None
        notice_task = task_id(document_id, NOTIFY_STEP, self.llm.prompt.version, self.llm.model)
        log = TaskLog(self.log, notice_task)
        payload = self.store.get_checkpoint(notice_task)
        if payload is None:
            notice = {
                "document_id": document_id,
                "task_id": notice_task,
                "analysis_task_id": analysis_task,
                "sources": sources,
                "summary": analysis["summary"],
                "sentiment": analysis["sentiment"],
                "keywords": analysis["keywords"],
            }
            try:
                delivery = await self.notifier.send(notice_task, notice, log)
            except ClassifiedError as e:
                raise _StageError("completion_notice", e.category, e.message) from e
            payload = self.store.put_checkpoint(
                notice_task, document_id, NOTIFY_STEP, delivery.to_payload()
            )
            log.info(f"notice delivered (HTTP {payload['status']})")
        events.append(
            StageDone(
                document_id,
                "completion_notice",
                {
                    "task_id": notice_task,
                    "sent": True,
                    "status": payload["status"],
                    "duplicate": payload["duplicate"],
                    "url": self.notifier.url,
                },
            )
        )


class _StageError(ClassifiedError):
    def __init__(self, stage: str, category: Category, message: str):
        super().__init__(category, message)
        self.stage = stage


def _stage_of(error: ClassifiedError) -> str:
    return getattr(error, "stage", "llm_analysis")


class _ForwardedLog:
    """Log lines written on the worker thread, handed to the caller's thread to be logged there
    (Dagster's run log belongs to the step's thread)."""

    def __init__(self, out: queue.Queue[Any]):
        self._out = out

    def info(self, msg: str) -> None:
        self._out.put(("log", "info", msg))

    def warning(self, msg: str) -> None:
        self._out.put(("log", "warning", msg))

    def error(self, msg: str) -> None:
        self._out.put(("log", "error", msg))


def run_batch(analyser: Analyser, document_ids: Sequence[str]) -> Iterator[tuple[str, list[Event]]]:
    """Process documents concurrently; yields ``(document_id, events)`` as each one finishes.

    The documents run on an event loop in a worker thread, so that LLM calls, notices and database
    writes go on while the caller reports the documents already done (a Dagster step writes each
    event to its event log before it goes on, which takes long enough to matter). Log lines come
    back to the caller's thread. Closing the generator early cancels what is still running.
    """
    out: queue.Queue[Any] = queue.Queue()
    caller_log = analyser.log
    analyser.log = _ForwardedLog(out)
    loop = asyncio.new_event_loop()
    main: list[asyncio.Task[None]] = []

    async def one(document_id: str) -> None:
        try:
            events = await analyser.process(document_id)
        except Exception as e:  # a bug must fail this document, not the batch
            message = redact(f"{type(e).__name__}: {e}")[:500]
            events = [StageFailed(document_id, STAGES[0], Category.INTERNAL_ERROR, message)]
        out.put(("done", document_id, events))

    async def run_all() -> None:
        try:
            await asyncio.gather(*(one(d) for d in document_ids))
        finally:
            await analyser.llm.aclose()
            if analyser.notifier is not None:
                await analyser.notifier.aclose()

    def work() -> None:
        try:
            main.append(loop.create_task(run_all()))
            loop.run_until_complete(main[0])
        except BaseException as e:  # handed to the caller, who raises it
            out.put(("error", e))
        finally:
            out.put(("end",))
            loop.close()

    worker = threading.Thread(target=work, name="ai-pipeline-batch", daemon=True)
    worker.start()
    try:
        while True:
            item = out.get()
            if item[0] == "log":
                getattr(caller_log, item[1])(item[2])
            elif item[0] == "done":
                yield item[1], item[2]
            elif item[0] == "error":
                if not isinstance(item[1], asyncio.CancelledError):
                    raise item[1]
            else:
                break
    finally:
        analyser.log = caller_log
        if worker.is_alive():
            if main:
                loop.call_soon_threadsafe(main[0].cancel)
            worker.join()
