"""The LLM calls of one document's analysis, each behind its checkpoint.

A text is analysed whole, in one call, or — when the analysis cuts it into sections, or the model's
context turns out too small for it — section by section, the sections' outputs then reduced into
the document's as the analysis declares (a merge function, or one more call). Every call is made
only when its task id has no checkpoint, and its reply is stored before anything else is done with
it. What the calls' replies mean for the document's stages (events, results, notices) is the
engine's (``ai_pipeline.engine``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

from ai_pipeline.declaration import Evaluation, Section
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient, LLMReply, Messages, RunStopped
from ai_pipeline.stages import Cancelled, Stage, StageError
from ai_pipeline.store import Store
from ai_pipeline.store.rows import StoredDocument
from ai_pipeline.tasks import ANALYSE_STEP, REDUCE_STEP, SUBMITTED, TaskLog, section_step, task_id
from ai_pipeline.truncation import larger_limit, output_limit, recut


class AnalysisCalls:
    """The checkpointed LLM calls of the documents of one batch, for the store's analysis."""

    def __init__(self, store: Store, llm: LLMClient, min_confidence: float, section_chars: int):
        self.store = store
        self.analysis = store.analysis
        self.llm = llm
        self.min_confidence = min_confidence
        self.section_chars = section_chars

    async def analyse(
        self, doc: StoredDocument, task: str, text: str, log: TaskLog
    ) -> tuple[LLMReply, bool, Evaluation, list[dict[str, Any]] | None]:
        """The document's analysis: the reply (for a sectioned one, its calls' sum), whether it
        came from checkpoints alone, its checks' verdict, and the sections' stored outputs (None
        for a text analysed whole)."""
        sections = self.analysis.cut(text, self.section_chars)
        # A reduce call makes the document's output (another model than a section's): a text of
        # one section goes through it too.
        whole = len(sections) == 1 and not (self.analysis.reduce and self.analysis.reduce.is_call)
        if whole:
            try:
                reply, from_checkpoint = await self.call(
                    doc, task, ANALYSE_STEP, self.analysis.messages(text), log
                )
            except StageError as e:
                # Too long for the model's context: cut into sections when the analysis has them.
                sections = recut(self.analysis, text, e) or []
                if not sections:
                    raise
                log.warning(f"too long for the model's context: cut into {len(sections)} sections")
            else:
                return reply, from_checkpoint, self.evaluate(reply, text), None
        return await self._sectioned(doc, task, sections, log)

    async def call(
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
            raise Cancelled()
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
            raise StageError(Stage.LLM_ANALYSIS, e.category, e.message, task) from e
        # A crash after this line never pays for the same call again.
        self.store.checkpoints.put(task, doc.document_id, step, reply.to_payload())
        if self.llm.stopping:
            # The run stopped while this call was in flight: its answer is kept, the rest is
            # left to the next run.
            raise RunStopped(f"stopped after the checkpoint of {task}")
        if submitted and self.store.documents.cancel_requested(doc.document_id):
            raise Cancelled()
        return reply, False

    def evaluate(self, reply: LLMReply, text: str, *, reduce: bool = False) -> Evaluation:
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
            reply, cached = await self.call(doc, section_task, step, messages, log)
            return section_task, reply, cached, self.evaluate(reply, section.text)

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
                raise StageError(
                    Stage.LLM_ANALYSIS, failed.category, f"{where}: {failed.message}", section_task
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
            return reply, cached, self.evaluate(reply, doc.text or ""), stored
        reduce_task = task_id(doc.document_id, REDUCE_STEP, self.analysis.tag(), self.llm.model)
        text = json.dumps(stored, ensure_ascii=False, indent=1)
        messages = self.analysis.messages(text, instructions=reduce.instructions)
        reduced, reduce_cached = await self.call(
            doc, reduce_task, REDUCE_STEP, messages, log, reduce=True
        )
        log.info(f"{total} sections analysed and reduced")
        reply = _sum_of([*replies, reduced], content=reduced.content)
        verdict = self.evaluate(reduced, doc.text or "", reduce=True)
        return reply, cached and reduce_cached, verdict, stored


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
