"""The analysis of one document, stage by stage, with a checkpoint before every effect.

One document goes through five stages, each of which is an asset in Dagster:

``document_text`` → ``llm_analysis`` → ``validated_analysis`` → ``analysis_results`` →
``completion_notice`` (only sends when a webhook is configured)

:class:`Analyser` reports, per document and per stage, what happened as plain
``StageDone``/``StageFailed`` events (``ai_pipeline.stages``, where the stages are named); its LLM
calls, each behind its checkpoint, whole or section by section, are ``ai_pipeline.calls``.
``ai_pipeline.batch`` runs many documents concurrently, and the Dagster step in
``ai_pipeline.defs.assets`` turns the events into materializations and check evaluations. Nothing
here imports Dagster, so the same code serves the CLI, the benchmark and the tests.

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

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from ai_pipeline.calls import AnalysisCalls
from ai_pipeline.claims import DEFAULT_LEASE_SECONDS, DEFAULT_WAIT_SECONDS, Claims, owner_id
from ai_pipeline.declaration import DEFAULT_MIN_CONFIDENCE, DEFAULT_SECTION_CHARS
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient
from ai_pipeline.notify import Notifier
from ai_pipeline.outcomes import Outcomes, start
from ai_pipeline.redaction import redact
from ai_pipeline.retry import Log
from ai_pipeline.review import resolve_if_approved
from ai_pipeline.spend import count_tokens
from ai_pipeline.stages import (
    Cancelled,
    Event,
    Stage,
    StageDeferred,
    StageDone,
    StageError,
    StageFailed,
    shown,
    stage_in_progress,
)
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.rows import ResultRow, StoredDocument
from ai_pipeline.tasks import ANALYSE_STEP, NOTIFY_STEP, TaskLog, document_of, task_id
from ai_pipeline.tracing import document_span, mark_failed
from ai_pipeline.window import DocumentWindow

DEFAULT_RETRY_BUDGET = 3


class ResultsWriter(Protocol):
    """Where validated analyses go: the results IO manager in Dagster, the store's results here."""

    def upsert(self, rows: Sequence[ResultRow]) -> int: ...


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
        self.calls = AnalysisCalls(store, llm, min_confidence, section_chars)
        self.results = results
        self.log: Log = log or logging.getLogger("ai_pipeline")
        self.run_id = run_id
        self.notifier = notifier
        self.retry_budget = retry_budget
        self.outcomes = Outcomes(store, run_id=run_id, retry_budget=retry_budget)
        self.claims = Claims(
            store, owner_id(run_id), lease_seconds=lease_seconds, wait_seconds=claim_wait_seconds
        )
        llm.report_failures_to(self._record_attempt)

    @property
    def llm(self) -> LLMClient:
        """The one client of this analyser: its calls go through it, and stopping stops it."""
        return self.calls.llm

    def task_for(self, document_id: str) -> str:
        return task_id(document_id, ANALYSE_STEP, self.analysis.tag(), self.llm.model)

    async def process(self, document_id: str, window: DocumentWindow | None = None) -> list[Event]:
        """All stage events for one document; failures are events, never exceptions. The work
        is one trace (``ai_pipeline.tracing``), its root span this document's. In a batch it
        happens inside the batch's ``window`` (``ai_pipeline.window``)."""
        async with window if window is not None else contextlib.nullcontext():
            return await self._traced(document_id, window)

    # --- what a batch runner uses (``ai_pipeline.batch``) ---------------------------------------

    def log_to(self, log: Log) -> Log:
        """Write this analyser's log lines to ``log`` from now on (a batch's worker thread hands
        them to the caller's); returns where they went before."""
        before, self.log = self.log, log
        return before

    def window(self, size: int | None = None) -> DocumentWindow:
        """How many documents of a batch are worked on at once: ``size``, or by default two per
        call the LLM client can have in flight."""
        if size is not None:
            return DocumentWindow(size)
        return DocumentWindow.for_concurrency(self.llm.max_concurrency)

    async def keep_claims(self) -> None:
        """Renew this run's claims while its documents run (until cancelled)."""
        await self.claims.keep_renewing(self.log)

    def stop(self) -> set[str]:
        """Send no new call; the documents whose call is in flight, which come in within
        ``call_timeout_seconds`` (their answers are paid for: each is checkpointed as it comes)."""
        self.llm.stop()
        return {document_of(task) for task in self.llm.in_flight}

    @property
    def call_timeout_seconds(self) -> float:
        return self.llm.timeout_seconds

    async def aclose(self) -> None:
        """Close the connections of the LLM client and of the notifier."""
        await self.llm.aclose()
        if self.notifier is not None:
            await self.notifier.aclose()

    # --- one document -----------------------------------------------------------------------

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
            return [
                StageFailed(document_id, Stage.DOCUMENT_TEXT, Category.INTERNAL_ERROR, error, task)
            ]
        if doc.rejected_by_reviewer:
            # A reviewer rejected it: nothing about it runs again, nothing downstream happens.
            category = doc.category or Category.INTERNAL_ERROR
            log.info("rejected by a reviewer; not processed")
            error = f"rejected by a reviewer: {doc.status_message}"
            return [StageFailed(document_id, Stage.DOCUMENT_TEXT, category, error, task)]
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
            previous = start(self.store, doc, self.run_id)
            if previous == State.CANCELLED:
                log.info("cancelled; skipped")
                return events
            if doc.cancel_requested:
                raise Cancelled()
            # Stages append as they finish, so the ones done before a failure are still reported.
            await self._stages(doc, task, log, events)
        except Cancelled:
            # Back along the state machine; a paid answer stays checkpointed, nothing downstream.
            self.store.documents.transition(document_id, State.QUEUED)
            self.store.documents.transition(document_id, State.CANCELLED)
            log.info("cancelled by its submitter; stopped")
            return events
        except ClassifiedError as e:
            # Where it was raised, else the stage the document was in: a database outage during
            # the upsert is the results' failure, not the analysis's.
            stage = getattr(e, "stage", None) or stage_in_progress(events)
            failed_task = getattr(e, "task", None) or task
            events.append(
                StageFailed(document_id, stage, e.category, redact(e.message), failed_task)
            )
        except Exception as e:  # a bug must fail this document, not the batch
            message = redact(f"{type(e).__name__}: {e}")[:500]
            log.error(f"unexpected error: {message}")
            stage = stage_in_progress(events)
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
                events.append(
                    StageFailed(document_id, Stage.COMPLETION_NOTICE, e.category, e.message, task)
                )
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
            raise StageError(
                Stage.DOCUMENT_TEXT,
                Category.INPUT_QUALITY_ISSUE,
                f"{doc.source}: {doc.rejected_reason or 'no text'}",
            )
        text = doc.text
        events.append(
            StageDone(
                document_id,
                Stage.DOCUMENT_TEXT,
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

        reply, from_checkpoint, verdict, parts = await self.calls.analyse(doc, task, text, log)
        spent = self.store.spend.for_documents([document_id]).get(document_id)
        events.append(
            StageDone(
                document_id,
                Stage.LLM_ANALYSIS,
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
            raise StageError(Stage.VALIDATED_ANALYSIS, failed_check.category, failed_check.message)
        output = verdict.output.model_dump(mode="json")
        events.append(
            StageDone(document_id, Stage.VALIDATED_ANALYSIS, {"task_id": task, **shown(output)})
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
                Stage.ANALYSIS_RESULTS,
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
                    Stage.COMPLETION_NOTICE,
                    {"sent": False, "reason": "no webhook configured (AI_PIPELINE_WEBHOOK_URL)"},
                )
            )

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
                raise StageError(Stage.COMPLETION_NOTICE, e.category, e.message) from e
            payload = self.store.checkpoints.put(
                notice_task, document_id, NOTIFY_STEP, delivery.to_payload()
            )
            log.info(f"notice delivered (HTTP {payload['status']})")
        events.append(
            StageDone(
                document_id,
                Stage.COMPLETION_NOTICE,
                {
                    "task_id": notice_task,
                    "sent": True,
                    "status": payload["status"],
                    "duplicate": payload["duplicate"],
                    "url": self.notifier.url,
                },
            )
        )
