"""The analysis of one document, stage by stage, with a checkpoint before every effect.

One document goes through five stages, each of which is an asset in Dagster:

``document_text`` → ``llm_analysis`` → ``validated_analysis`` → ``analysis_results`` →
``completion_notice`` (only sends when a webhook is configured)

:class:`Analyser` reports, per document and per stage, what happened as plain
``StageDone``/``StageFailed`` events; ``ai_pipeline.batch`` runs many documents concurrently and the
Dagster step in ``ai_pipeline.defs.assets`` turns the events into materializations and check
evaluations. Nothing here imports Dagster, so the same code serves the CLI, the benchmark and the
tests.

The rules that make a rerun safe:

- the LLM is called only when no checkpoint exists for the task id, and its reply is stored before
  anything else is done with it — also when the run is stopped while the call is in flight
  (``ai_pipeline.batch``);
- results are upserted (one row per document, ever), through the writer the caller passes in —
  the results IO manager;
- a completion notice is sent only when no checkpoint exists for its own task id, with that id as
  ``Idempotency-Key``, and never for a document that failed a check;
- a run works on a document only while it holds the document's claim (``ai_pipeline.claims``):
  two overlapping launches never both call for it; the second waits, then re-reports the first's
  checkpoints, or leaves the document to it ("in progress elsewhere", ``StageDeferred``);
- a document's state moves only along the transitions of ``ai_pipeline.states``; a document that
  failed retryably ``retry_budget`` times moves to DEAD_LETTER, out of automatic retries;
- when the results database stays away past its retries, the document fails DATABASE_UNAVAILABLE
  (retryable) as far as Dagster can be told; the store catches up when the next run takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from ai_pipeline.claims import DEFAULT_LEASE_SECONDS, DEFAULT_WAIT_SECONDS, Claims
from ai_pipeline.declaration import (
    DEFAULT_MIN_CONFIDENCE,
    DEFAULT_SECTION_CHARS,
    CheckOutcome,
    Evaluation,
    Section,
)
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient, LLMReply, Messages, RunStopped
from ai_pipeline.notify import Notifier
from ai_pipeline.outcomes import Outcomes
from ai_pipeline.redaction import redact
from ai_pipeline.retry import Log
from ai_pipeline.review import resolve_if_approved
from ai_pipeline.spend import count_tokens
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.rows import ResultRow, StoredDocument
from ai_pipeline.tasks import (
    ANALYSE_STEP,
    NOTIFY_STEP,
    REDUCE_STEP,
    SUBMITTED,
    TaskLog,
    document_of,
    section_step,
    task_id,
)
from ai_pipeline.tracing import document_span, mark_failed
from ai_pipeline.truncation import larger_limit, output_limit, recut
from ai_pipeline.window import DocumentWindow

STAGES = (
    "document_text",
    "llm_analysis",
    "validated_analysis",
    "analysis_results",
    "completion_notice",
)
DEFAULT_RETRY_BUDGET = 3


class ResultsWriter(Protocol):
    """Where validated analyses go: the results IO manager in Dagster, the store's results here."""

    def upsert(self, rows: Sequence[ResultRow]) -> int: ...


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


@dataclass(frozen=True)
class StageDeferred:
    """Another live run holds the document: left to it, neither done nor failed here."""

    document_id: str
    task_id: str
    holder: str


Event = StageDone | StageFailed | StageDeferred


class _Cancelled(Exception):
    """The document's submitter cancelled it while this run held it."""


class _StageError(ClassifiedError):
    def __init__(self, stage: str, category: Category, message: str, task: str | None = None):
        super().__init__(category, message)
        self.stage = stage
        self.task = task  # the call it is about, when not the document's own (a section)


def _start(store: Store, doc: StoredDocument, run_id: str | None) -> State:
    """Move a document (whose claim the caller holds, just loaded) to RUNNING along the legal path,
    in one update; returns the state it was in. COMPLETED and CANCELLED documents keep their
    state: a rerun only re-reports their checkpoints."""
    if doc.state in (State.COMPLETED, State.CANCELLED):
        return doc.state
    # From PENDING, FAILED or DEAD_LETTER through QUEUED; or RUNNING left behind by a run that died.
    return store.documents.transition(
        doc.document_id, State.RUNNING, through=State.QUEUED, run_id=run_id
    )


def _owner_id(run_id: str | None) -> str:
    """Who holds a claim: the Dagster run, or this process when there is none."""
    return run_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"[:64]


class Analyser:
    """Runs the stages for the documents of one batch."""

    def __init__(
        self,
        store: Store,
        llm: LLMClient,
        results: ResultsWriter,
        *,
        log: Log | None = None,
        run_id: str | None = None,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        notifier: Notifier | None = None,
        retry_budget: int = DEFAULT_RETRY_BUDGET,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        claim_wait_seconds: float = DEFAULT_WAIT_SECONDS,
        section_chars: int = DEFAULT_SECTION_CHARS,
    ):
        self.store = store
        # What is asked and checked: the analysis whose results this store holds.
        self.analysis = store.analysis
        self.llm = llm
        self.results = results
        self.log: Log = log or logging.getLogger("ai_pipeline")
        self.run_id = run_id
        self.min_confidence = min_confidence
        self.section_chars = section_chars
        self.notifier = notifier
        self.retry_budget = retry_budget
        self.outcomes = Outcomes(store, run_id=run_id, retry_budget=retry_budget)
        self.claims = Claims(
            store, _owner_id(run_id), lease_seconds=lease_seconds, wait_seconds=claim_wait_seconds
        )
        if llm.on_failure is None:
            llm.on_failure = self._record_attempt

    def task_for(self, document_id: str) -> str:
        return task_id(document_id, ANALYSE_STEP, self.analysis.tag(), self.llm.model)

    async def process(self, document_id: str, window: DocumentWindow | None = None) -> list[Event]:
        """All stage events for one document; failures are events, never exceptions. The work
        is one trace (``ai_pipeline.tracing``), its root span this document's. In a batch it
        happens inside the batch's ``window`` (``ai_pipeline.window``)."""
        async with window if window is not None else contextlib.nullcontext():
            return await self._traced(document_id, window)

    async def _traced(self, document_id: str, window: DocumentWindow | None) -> list[Event]:
        task = self.task_for(document_id)
        with document_span(document_id, task, self.run_id) as root:
            events = await self._process(document_id, task, window)
            failed = next((e for e in events if isinstance(e, StageFailed)), None)
            if failed is not None:
                mark_failed(root, failed.category, failed.error)
            return events

    async def _process(
        self, document_id: str, task: str, window: DocumentWindow | None
    ) -> list[Event]:
        log = TaskLog(self.log, task)
        doc = self.store.documents.get(document_id)
        if doc is None:
            error = f"document {document_id} is not registered in the results database"
            log.error(error)
            return [StageFailed(document_id, STAGES[0], Category.INTERNAL_ERROR, error, task)]
        if doc.rejected_by_reviewer:
            # A reviewer rejected it: nothing about it runs again, nothing downstream happens.
            category = doc.category or Category.INTERNAL_ERROR
            log.info("rejected by a reviewer; not processed")
            error = f"rejected by a reviewer: {doc.status_message}"
            return [StageFailed(document_id, STAGES[0], category, error, task)]
        holder = await self.claims.take(
            task, document_id, log, waiting=window.stepped_out if window is not None else None
        )
        if holder is not None:
            return [StageDeferred(document_id, task, holder)]
        try:
            return await self._claimed(document_id, task, log)
        finally:
            self.claims.release(task)

    async def _claimed(self, document_id: str, task: str, log: TaskLog) -> list[Event]:
        """The stages of a document whose claim this run holds, and its settled state."""
        events: list[Event] = []
        doc = self.store.documents.load(document_id)  # with its text, as it is now it is ours
        assert doc is not None
        previous: State | None = None
        try:
            previous = _start(self.store, doc, self.run_id)
            if previous == State.CANCELLED:
                log.info("cancelled; skipped")
                return events
            if doc.cancel_requested:
                raise _Cancelled()
            # Stages append as they finish, so the ones done before a failure are still reported.
            await self._stages(doc, task, log, events)
        except _Cancelled:
            # Back along the state machine; a paid answer stays checkpointed, nothing downstream.
            self.store.documents.transition(document_id, State.QUEUED)
            self.store.documents.transition(document_id, State.CANCELLED)
            log.info("cancelled by its submitter; stopped")
            return events
        except ClassifiedError as e:
            stage = getattr(e, "stage", "llm_analysis")
            failed_task = getattr(e, "task", None) or task
            events.append(
                StageFailed(document_id, stage, e.category, redact(e.message), failed_task)
            )
        except Exception as e:  # a bug must fail this document, not the batch
            message = redact(f"{type(e).__name__}: {e}")[:500]
            log.error(f"unexpected error: {message}")
            stage = STAGES[min(len(events), len(STAGES) - 1)]
            events.append(StageFailed(document_id, stage, Category.INTERNAL_ERROR, message, task))
        failure = next((e for e in events if isinstance(e, StageFailed)), None)
        if previous == State.COMPLETED:
            # Done before. Under a new task (a new prompt version or model) it was analysed again:
            # the new analysis replaced the old (kept in the results history); a failure keeps
            # the old one, and is recorded.
            if failure is None and doc.task_id not in (None, task):
                self.store.documents.set_task_id(document_id, task)
                detail = f"{doc.task_id} replaced by {task}"
                self.store.events.add_history(document_id, "REANALYSED", detail, task_id=task)
                log.info(f"analysed again: {detail}")
            elif failure is not None:
                self.store.events.record_failure(
                    document_id,
                    failure.category,
                    f"re-analysis failed, the earlier analysis stays: {failure.error}",
                    task_id=failure.task_id,
                    run_id=self.run_id,
                    attempt=doc.attempts,
                )
            return events
        try:
            if failure is None:
                self.outcomes.settle(document_id, State.COMPLETED, task_id=task)
                override = resolve_if_approved(self.store, document_id, task)
                if override is not None:
                    log.info(override)
                log.info("completed")
            elif failure.category.stops_run:
                circuit = self.llm.circuit
                reason = circuit.message if circuit is not None else failure.error
                self.outcomes.hold(doc, failure, reason, log)
            else:
                self.outcomes.fail(doc, failure, log)
        except StoreUnavailable as e:
            log.error(f"could not record the outcome: {e.message}")
            if failure is None:
                events.append(StageFailed(document_id, STAGES[-1], e.category, e.message, task))
        return events

    def _record_attempt(self, task: str, category: Category, request: int, error: str) -> None:
        """A failed request that the client retries or waits out: an event, not a state.

        ``attempt`` in the failure events is always the document's attempt (the run that tried
        it), the same number its final failure is recorded under; the request is in the text.
        """
        document_id = document_of(task)
        doc = self.store.documents.get(document_id)
        self.store.events.record_failure(
            document_id,
            category,
            f"request {request}: {error}",
            task_id=task,
            run_id=self.run_id,
            attempt=(doc.attempts if doc else 0) + 1,
        )

    async def _stages(
        self, doc: StoredDocument, task: str, log: TaskLog, events: list[Event]
    ) -> None:
        document_id = doc.document_id
        sources = self.store.documents.sources([document_id]).get(document_id, [doc.source])

        if doc.rejected_reason or doc.text is None:
            raise _StageError(
                "document_text",
                Category.INPUT_QUALITY_ISSUE,
                f"{doc.source}: {doc.rejected_reason or 'no text'}",
            )
        text = doc.text
        events.append(
            StageDone(
                document_id,
                "document_text",
                {
                    "source": doc.source,
                    "aliases": len(sources) - 1,
                    "kind": doc.kind,
                    "size_bytes": doc.size_bytes,
                    "characters": len(text),
                    # What the analysis will pay for (tiktoken's count, or the estimate).
                    "text_tokens": count_tokens(self.llm.model, text),
                },
            )
        )

        sections = self.analysis.cut(text, self.section_chars)
        parts: list[dict[str, Any]] | None = None
        # A reduce call makes the document's output (another model than a section's): a text of
        # one section goes through it too.
        whole = len(sections) == 1 and not (self.analysis.reduce and self.analysis.reduce.is_call)
        if whole:
            try:
                reply, from_checkpoint = await self._call(
                    doc, task, ANALYSE_STEP, self.analysis.messages(text), log
                )
            except _StageError as e:
                # Too long for the model's context: cut into sections when the analysis has them.
                sections = recut(self.analysis, text, e) or []
                if not sections:
                    raise
                log.warning(f"too long for the model's context: cut into {len(sections)} sections")
        if whole and len(sections) == 1:
            verdict = self._evaluate(reply, text)
        else:
            reply, from_checkpoint, verdict, parts = await self._sectioned(doc, task, sections, log)
        spent = self.store.spend.for_documents([document_id]).get(document_id)
        events.append(
            StageDone(
                document_id,
                "llm_analysis",
                {
                    "task_id": task,
                    "analysis": self.analysis.name,
                    "model": reply.model,
                    "prompt_version": self.analysis.tag(),
                    # A re-analysis (new version or model): the analysis it replaces.
                    "replaces_task": doc.task_id
                    if doc.state == State.COMPLETED and doc.task_id not in (None, task)
                    else None,
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "latency_ms": reply.latency_ms,
                    "from_checkpoint": from_checkpoint,
                    # How the reply's shape was asked for: Structured Outputs or JSON mode.
                    "response_format": self.analysis.model.response_format,
                    # The JSON was taken out of a code fence or prose around it (None: it was not).
                    "reply_unwrapped": verdict.unwrapped,
                    "source": doc.source,
                    # Every attempt's cost so far, failed and repeated ones included.
                    "cost_usd": round(spent.cost_usd, 6) if spent else 0.0,
                    "llm_attempts": spent.attempts if spent else 0,
                },
                checks=tuple(verdict.outcomes),
            )
        )
        failed_check = verdict.failure
        override = self.store.reviews.override(task) if failed_check is not None else None
        if failed_check is not None and override is not None and verdict.output is not None:
            # A reviewer accepted this stored output although a check failed.
            log.warning(
                f"check {failed_check.name} failed but the output was accepted by "
                f"{override.decided_by}: {override.note or ''}"
            )
            failed_check = None
        if failed_check is not None or verdict.output is None:
            assert failed_check is not None and failed_check.category is not None
            if failed_check.category == Category.MODEL_HALLUCINATION:
                # Kept for the audit, never used as a result.
                self.store.reviews.quarantine(
                    document_id, task, reply.content, failed_check.message
                )
            raise _StageError("validated_analysis", failed_check.category, failed_check.message)
        output = verdict.output.model_dump(mode="json")
        events.append(
            StageDone(document_id, "validated_analysis", {"task_id": task, **_shown(output)})
        )
        self.results.upsert(
            [
                ResultRow(
                    document_id=document_id,
                    output=output,
                    task_id=task,
                    model=reply.model,
                    prompt_version=self.analysis.tag(),
                    sources=sources,
                    prompt_tokens=reply.prompt_tokens,
                    completion_tokens=reply.completion_tokens,
                    sections=parts,
                )
            ]
        )
        events.append(
            StageDone(
                document_id,
                "analysis_results",
                {"task_id": task, "source": doc.source, "sources": len(sources)},
            )
        )
        if self.notifier is not None:
            await self._notify(document_id, output, task, sources, events)
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

    async def _call(
        self,
        doc: StoredDocument,
        task: str,
        step: str,
        messages: Messages,
        log: TaskLog,
        *,
        reduce: bool = False,
    ) -> tuple[LLMReply, bool]:
        """One LLM call behind its checkpoint: the stored answer when there is one (and whether
        it was), else the call, made durable before anything else is done with it."""
        payload = self.store.checkpoints.get(task)
        if payload is not None:
            log.info(f"LLM checkpoint of {task} found; no call")
            return LLMReply.from_payload(payload), True
        submitted = doc.source.startswith(SUBMITTED)
        if submitted and self.store.documents.cancel_requested(doc.document_id):
            raise _Cancelled()
        log.info(
            f"calling {self.llm.model} ({self.analysis.name} {self.analysis.version}) for {task}"
        )
        try:
            response_format = self.analysis.response_format(reduce=reduce)
            settings = self.analysis.model
            reply = await self.llm.analyse(
                task, messages, response_format=response_format, settings=settings, log=log
            )
            reserved = self.llm.meter.max_completion_tokens if self.llm.meter else None
            larger = larger_limit(self.llm.model, settings, reserved)
            if reply.finish_reason == "length" and larger is not None:
                log.warning(
                    f"the reply was cut off at {output_limit(self.llm.model, settings, reserved)}"
                    f" tokens; asking once more with {larger.max_output_tokens}"
                )
                reply = await self.llm.analyse(
                    task, messages, response_format=response_format, settings=larger, log=log
                )
        except ClassifiedError as e:
            raise _StageError("llm_analysis", e.category, e.message, task) from e
        # A crash after this line never pays for the same call again.
        self.store.checkpoints.put(task, doc.document_id, step, reply.to_payload())
        if self.llm.stopping:
            # The run stopped while this call was in flight: its answer is kept, the rest is
            # left to the next run.
            raise RunStopped(f"stopped after the checkpoint of {task}")
        if submitted and self.store.documents.cancel_requested(doc.document_id):
            raise _Cancelled()
        return reply, False

    def _evaluate(self, reply: LLMReply, text: str, *, reduce: bool = False) -> Evaluation:
        return self.analysis.evaluate(
            reply.content,
            text,
            finish_reason=reply.finish_reason,
            min_confidence=self.min_confidence,
            reduce=reduce,
            refusal=reply.refusal,
        )

    async def _sectioned(
        self, doc: StoredDocument, task: str, sections: list[Section], log: TaskLog
    ) -> tuple[LLMReply, bool, Evaluation, list[dict[str, Any]]]:
        """A long document's sections analysed concurrently (within the run's LLM limit), each
        behind its own checkpoint; a section whose reply fails a check fails the document under
        that section's task id (a reviewer's retry then calls that section alone again). The
        sections' outputs are then reduced as the analysis declares: merged by its function and
        checked against the whole text, or read by one more call (its own task and checkpoint)
        whose reply is checked as the document's."""
        total = len(sections)
        self.store.documents.set_sections(doc.document_id, total)
        tag = self.analysis.tag(reduce=False)

        async def one(section: Section) -> tuple[str, LLMReply, bool, Evaluation]:
            step = section_step(section.index)
            section_task = task_id(doc.document_id, step, tag, self.llm.model)
            messages = self.analysis.messages(section.text)
            reply, cached = await self._call(doc, section_task, step, messages, log)
            return section_task, reply, cached, self._evaluate(reply, section.text)

        # Every section runs to its end (and its checkpoint) before a failure is raised.
        outcomes = await asyncio.gather(*(one(s) for s in sections), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        done = [o for o in outcomes if not isinstance(o, BaseException)]
        parts: list[tuple[Section, BaseModel]] = []
        for section, (section_task, reply, _, verdict) in zip(sections, done, strict=True):
            failed = verdict.failure
            # A reviewer may have accepted this section's stored output although a check failed.
            accepted = (
                failed is not None
                and verdict.output is not None
                and self.store.reviews.override(section_task) is not None
            )
            if failed is not None and not accepted:
                assert failed.category is not None
                if failed.category == Category.MODEL_HALLUCINATION:
                    self.store.reviews.quarantine(
                        doc.document_id, section_task, reply.content, failed.message
                    )
                label = self.analysis.sections.label if self.analysis.sections else "section"
                where = f"{label} {section.index}/{total} ({section.title})"
                # The document's analysis does not exist: it fails at llm_analysis.
                raise _StageError(
                    "llm_analysis", failed.category, f"{where}: {failed.message}", section_task
                )
            assert verdict.output is not None
            parts.append((section, verdict.output))
        replies = [r for _, r, _, _ in done]
        cached = all(c for _, _, c, _ in done)
        stored = [
            {"index": s.index, "title": s.title, "output": o.model_dump(mode="json")}
            for s, o in parts
        ]
        reduce = self.analysis.reduce
        assert reduce is not None
        if reduce.merge is not None:
            reply = _sum_of(replies, content=reduce.merge(parts).model_dump_json())
            log.info(f"{total} sections analysed and merged")
            return reply, cached, self._evaluate(reply, doc.text or ""), stored
        reduce_task = task_id(doc.document_id, REDUCE_STEP, self.analysis.tag(), self.llm.model)
        text = json.dumps(stored, ensure_ascii=False, indent=1)
        messages = self.analysis.messages(text, instructions=reduce.instructions)
        reduced, reduce_cached = await self._call(
            doc, reduce_task, REDUCE_STEP, messages, log, reduce=True
        )
        log.info(f"{total} sections analysed and reduced")
        reply = _sum_of([*replies, reduced], content=reduced.content)
        verdict = self._evaluate(reduced, doc.text or "", reduce=True)
        return reply, cached and reduce_cached, verdict, stored

    async def _notify(
        self,
        document_id: str,
        output: dict[str, Any],
        analysis_task: str,
        sources: list[str],
        events: list[Event],
    ) -> None:
        assert self.notifier is not None
        notice_task = task_id(document_id, NOTIFY_STEP, self.analysis.tag(), self.llm.model)
        log = TaskLog(self.log, notice_task)
        payload = self.store.checkpoints.get(notice_task)
        if payload is None:
            notice = {
                "document_id": document_id,
                "task_id": notice_task,
                "analysis_task_id": analysis_task,
                "sources": sources,
                "analysis": self.analysis.name,
                "output": output,
            }
            try:
                delivery = await self.notifier.send(notice_task, notice, log)
            except ClassifiedError as e:
                raise _StageError("completion_notice", e.category, e.message) from e
            payload = self.store.checkpoints.put(
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


def _sum_of(replies: list[LLMReply], *, content: str) -> LLMReply:
    """One reply standing for several calls: their tokens and time added up."""
    return LLMReply(
        content=content,
        finish_reason="stop",
        model=replies[0].model,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in replies),
        completion_tokens=sum(r.completion_tokens or 0 for r in replies),
        latency_ms=sum(r.latency_ms or 0 for r in replies),
    )


def _shown(output: dict[str, Any]) -> dict[str, Any]:
    """An output's top-level values as a person reads them in the UI: numbers and short text as
    they are, lists of text joined, anything else as JSON."""
    shown: dict[str, Any] = {}
    for name, value in output.items():
        if isinstance(value, bool | int | float) or value is None:
            shown[name] = value
        elif isinstance(value, str):
            shown[name] = value[:500]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            shown[name] = ", ".join(value)[:500]
        else:
            shown[name] = json.dumps(value, ensure_ascii=False)[:500]
    return shown


def requeue(store: Store, document_id: str, *, by: str) -> bool:
    """Take a document out of the dead letter (attempts reset) so that the next backfill picks it
    up; False when it is not in the dead letter. Raises KeyError for an unknown document."""
    doc = store.documents.get(document_id)
    if doc is None:
        raise KeyError(document_id)
    if doc.state != State.DEAD_LETTER:
        return False
    store.documents.transition(document_id, State.QUEUED, reset_attempts=True)
    store.events.add_history(document_id, "REQUEUED", f"by {by}")
    return True
