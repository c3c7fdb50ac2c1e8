"""Analysis through OpenAI's Batch API: half the price for work that can wait up to a day.

A *job* is one request file and the remote batch made of it. Its lines are tasks — the same task
ids, request bodies and checkpoints as the synchronous path — so mixing the two never pays twice:

==============  ===========================================================  =================
phase           what happens (each step recorded in ``store.openai_batches``)  after a crash
==============  ===========================================================  =================
plan            the tasks without a checkpoint and in no open job, their     nothing went out:
                request lines (``chat_request``, as a call sends them), cut   the intent is
                into files within 50,000 lines and 200 MB; the intent (tasks, planned again or
                file hash) recorded before anything is uploaded              resumed
upload          the file is uploaded, named by its hash — or the upload a    found by its name
                crash left unrecorded is found by it (``files.list``)        and size: reused
create          the remote batch, with our intent id in its metadata — or    found by its
                the one a crash left unrecorded (``batches.list``)           metadata: reused
poll            the remote status and request counts                         polled again
ingest          each answered line becomes its task's checkpoint, its usage  a line is settled
                recorded at the batch price; each error line is classified   once (compare-
                by the taxonomy (its status and error body), expired lines    and-set), its
                marked; lines never answered (cancelled) are released        checkpoint kept
==============  ===========================================================  =================

``BatchJobs.advance`` takes one job one phase further; ``BatchJobs.tick`` advances every
unfinished job within a bound of work (what a sensor calls each tick). A hook (``on_phase``)
is told after each outside effect and before it is recorded: the tests crash there.

This is not ``ai_pipeline.batch`` (the documents of one run, processed concurrently) nor
``ai_pipeline.store.batches`` (named sets of submitted documents). Nothing here knows Dagster;
what a finished line means for its document (a run that finds the checkpoint, validates and
stores it) is the launcher's business.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ai_pipeline.declaration import DEFAULT_SECTION_CHARS
from ai_pipeline.failures import Category, ClassifiedError, category_for_reply
from ai_pipeline.llm import LLMReply, chat_request, reply_of
from ai_pipeline.llm_access import billed_details
from ai_pipeline.llm_errors import classify, describe
from ai_pipeline.redaction import redact, register_secret
from ai_pipeline.settings import Settings
from ai_pipeline.spend import (
    DEFAULT_COMPLETION_RESERVE,
    Budget,
    Prices,
    estimate_prompt_tokens,
)
from ai_pipeline.states import State
from ai_pipeline.store import Store, open_store
from ai_pipeline.store.openai_batches import (
    BatchJob,
    JobStatus,
    LineState,
    PlannedTask,
    TasksTaken,
)
from ai_pipeline.store.spend import ANSWER, ESTIMATED_ANSWER, BudgetRefused, Usage
from ai_pipeline.tasks import ANALYSE_STEP, document_of, task_id
from ai_pipeline.truncation import larger_limit

logger = logging.getLogger("ai_pipeline.openai_batch")

ENDPOINT = "/v1/chat/completions"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
COMPLETION_WINDOW = "24h"
MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
# How many of a task's lines may fail retryably or expire before it is no longer batched.
DEFAULT_MAX_ATTEMPTS = 3
# The remote batch's metadata key holding our intent id: how a batch a crash left unrecorded is
# found again.
INTENT_KEY = "ai_pipeline_intent"
# How far back before an intent's creation ``batches.list`` is searched for its batch (clocks of
# this machine and the endpoint's differ a little).
CLOCK_SLACK_SECONDS = 300
_REMOTE = {s.value: s for s in JobStatus}
NO_SUCH_DOCUMENT = "no such document"


@dataclass(frozen=True)
class BatchRequest:
    """One line of a request file: a task and the body the synchronous call would send."""

    task: PlannedTask
    body: dict[str, Any]

    def line(self) -> bytes:
        """The JSONL line (``custom_id`` = the task id), the same bytes every time. Keys keep
        the body's order: a response format's schema properties are the order of the answer."""
        request = {
            "custom_id": self.task.task_id,
            "method": "POST",
            "url": ENDPOINT,
            "body": self.body,
        }
        return (json.dumps(request, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass
class Plan:
    """What ``plan`` made of a set of documents: the jobs recorded, and what it left out."""

    jobs: list[BatchJob] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # tasks with a checkpoint already
    in_open_jobs: list[str] = field(default_factory=list)  # tasks another job carries
    not_batchable: dict[str, str] = field(default_factory=dict)  # document → why not
    # Tasks no longer sent by batch: a line failed for good (a category that is not
    # retryable), or ``max_attempts`` lines failed or expired; task → why.
    gave_up: dict[str, str] = field(default_factory=dict)
    # Tasks not planned because their job would have taken a budget past its limit.
    over_budget: list[str] = field(default_factory=list)
    budget_message: str | None = None


def requests_for(
    store: Store,
    document_ids: Iterable[str],
    model: str,
    *,
    section_chars: int = DEFAULT_SECTION_CHARS,
    completion_cap: int | None = None,
) -> tuple[list[BatchRequest], dict[str, str]]:
    """The analysis request of each document, as its synchronous call would send it (under a
    budget its completion limit is at most ``completion_cap``, as a call's under a budget is),
    and the documents that cannot go in a batch (with why: rejected, no text, or long enough to
    be cut into sections — those go the synchronous way, which analyses the sections and
    reduces)."""
    analysis = store.analysis
    requests: list[BatchRequest] = []
    skipped: dict[str, str] = {}
    for document_id in dict.fromkeys(document_ids):
        doc = store.documents.load(document_id)
        if doc is None:
            skipped[document_id] = NO_SUCH_DOCUMENT
            continue
        if doc.rejected_reason or doc.text is None:
            skipped[document_id] = doc.rejected_reason or "no text"
            continue
        if len(analysis.cut(doc.text, section_chars)) != 1:
            skipped[document_id] = "cut into sections: analysed by the synchronous path"
            continue
        body = chat_request(
            model,
            analysis.messages(doc.text),
            analysis.response_format(),
            analysis.model,
            reserved_completion_tokens=completion_cap,
        )
        task = PlannedTask(
            task_id(document_id, ANALYSE_STEP, analysis.tag(), model), document_id, ANALYSE_STEP
        )
        requests.append(BatchRequest(task, body))
    return requests, skipped


def split(
    requests: Sequence[BatchRequest], *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES
) -> list[list[BatchRequest]]:
    """Consecutive runs of requests, each a file within ``max_lines`` and ``max_bytes``; raises
    ValueError for a single line larger than a file may be."""
    files: list[list[BatchRequest]] = []
    current: list[BatchRequest] = []
    size = 0
    for request in requests:
        length = len(request.line())
        if length > max_bytes:
            raise ValueError(f"{request.task.task_id}: one line of {length} bytes > {max_bytes}")
        if current and (len(current) >= max_lines or size + length > max_bytes):
            files.append(current)
            current, size = [], 0
        current.append(request)
        size += length
    if current:
        files.append(current)
    return files


def file_of(requests: Sequence[BatchRequest]) -> bytes:
    return b"".join(request.line() for request in requests)


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_name(digest: str) -> str:
    """The name a request file is uploaded under: its hash, by which it is found again."""
    return f"ai_pipeline-{digest}.jsonl"


def plan(
    store: Store,
    document_ids: Iterable[str],
    model: str,
    *,
    section_chars: int = DEFAULT_SECTION_CHARS,
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expired_to_sync: bool = False,
    budget_keys: Sequence[str] = (),
    prices: Prices | None = None,
    completion_reserve: int = DEFAULT_COMPLETION_RESERVE,
) -> Plan:
    """Record the jobs that would analyse these documents through the Batch API: their tasks
    without a checkpoint, in no open job, and not given up on (``gave_up``), one job per file.
    ``expired_to_sync``: a task whose line expired is given up on at once (left to the
    synchronous path) rather than batched again.

    Under budgets (``budget_keys``, priced by ``prices``) each job reserves, as it is recorded,
    what its lines may cost at the batch price: their prompts' estimate and the completion limit
    they carry (at most ``completion_reserve``, as a call under a budget); a job the budget
    cannot hold is not recorded, nor any after it (``over_budget``). Nothing is sent."""
    if budget_keys and prices is None:
        raise ValueError("a plan under a budget needs the prices to reserve at")
    cap = completion_reserve if budget_keys else None
    requests, skipped = requests_for(
        store, document_ids, model, section_chars=section_chars, completion_cap=cap
    )
    if budget_keys:
        assert prices is not None
        requests = [_with_reservation(r, model, prices) for r in requests]
    ids = [r.task.task_id for r in requests]
    done = set(store.checkpoints.get_many(ids))
    taken = store.openai_batches.open_jobs_of(ids)
    gave_up = _given_up(store, ids, max_attempts, expired_to_sync=expired_to_sync)
    wanted = [
        r
        for r in requests
        if r.task.task_id not in done
        and r.task.task_id not in taken
        and r.task.task_id not in gave_up
    ]
    result = Plan(
        done=sorted(done),
        in_open_jobs=sorted(set(taken) - done),
        not_batchable=skipped,
        gave_up={t: why for t, why in gave_up.items() if t not in done and t not in taken},
    )
    parts = split(wanted, max_lines=max_lines, max_bytes=max_bytes)
    for n, part in enumerate(parts):
        try:
            job = _record(store, model, part, result, budget_keys, cap)
        except BudgetRefused as refused:
            state = store.spend.budget(refused.key)
            result.over_budget.extend(r.task.task_id for p in parts[n:] for r in p)
            result.budget_message = state.describe() if state is not None else refused.key
            break
        if job is not None:
            result.jobs.append(job)
    return result


def _with_reservation(request: BatchRequest, model: str, prices: Prices) -> BatchRequest:
    """The request with what its line reserves: its prompt's estimate and the completion limit
    it carries, at the batch price."""
    body = request.body
    prompt = estimate_prompt_tokens(model, body["messages"], body.get("response_format"))
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    completion = limit if isinstance(limit, int) else DEFAULT_COMPLETION_RESERVE
    usd = prices.price(model).for_batch().cost(prompt, completion)
    task = replace(request.task, reserved_tokens=prompt + completion, reserved_usd=usd)
    return BatchRequest(task, body)


def _record(
    store: Store,
    model: str,
    part: list[BatchRequest],
    result: Plan,
    budget_keys: Sequence[str],
    completion_cap: int | None,
    tries: int = 3,
) -> BatchJob | None:
    """Record one job; when another planner took some of its tasks meanwhile, the job is
    recorded without them (None when none is left)."""
    for _ in range(tries):
        if not part:
            return None
        data = file_of(part)
        try:
            return store.openai_batches.plan(
                uuid.uuid4().hex,
                model=model,
                endpoint=ENDPOINT,
                tasks=[r.task for r in part],
                content_hash=content_hash(data),
                content_bytes=len(data),
                budget_keys=budget_keys,
                completion_cap=completion_cap,
            )
        except TasksTaken:
            taken = store.openai_batches.open_jobs_of(r.task.task_id for r in part)
            result.in_open_jobs.extend(sorted(taken))
            part = [r for r in part if r.task.task_id not in taken]
    raise TasksTaken(f"the tasks of a job kept being taken by other planners ({tries} tries)")


def _given_up(
    store: Store, task_ids: Sequence[str], max_attempts: int, *, expired_to_sync: bool = False
) -> dict[str, str]:
    """The tasks whose earlier lines say another batch would not help: one failed for good
    (or expired, with ``expired_to_sync``), or ``max_attempts`` failed retryably or expired (a
    cancelled batch's lines do not count; a batch that failed validation counts for each)."""
    why: dict[str, str] = {}
    tries: dict[str, int] = {}
    lines = store.openai_batches.lines_of(task_ids)
    unanswered = {line.intent_id for line in lines if line.state == LineState.UNANSWERED}
    remote = store.openai_batches.remote_statuses(unanswered) if unanswered else {}
    for line in lines:
        if line.state == LineState.UNANSWERED and remote.get(line.intent_id) == "failed":
            # Its batch failed validation: that was an attempt too.
            tries[line.task_id] = tries.get(line.task_id, 0) + 1
        if line.state == LineState.FAILED and line.category and not line.category.retryable:
            why[line.task_id] = f"{line.category.value}: {line.error or ''}".strip()
        if line.state == LineState.EXPIRED and expired_to_sync:
            why.setdefault(line.task_id, "its batch line expired: left to the synchronous path")
        if line.state in (LineState.FAILED, LineState.EXPIRED):
            tries[line.task_id] = tries.get(line.task_id, 0) + 1
    for task, count in tries.items():
        if count >= max_attempts and task not in why:
            why[task] = f"{count} batch lines failed or expired"
    return why


# --- following a job ---------------------------------------------------------------------------

# Told of a phase's outside effect before it is recorded: ("uploaded", job), ("created", job),
# ("polled", job), ("checkpointed", job) after each line's checkpoint, ("ingested", job).
PhaseHook = Callable[[str, BatchJob], None]


@dataclass
class Progress:
    """What one ``tick`` did."""

    advanced: list[str] = field(default_factory=list)  # intent ids
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


class BatchJobs:
    """Takes Batch API jobs through their phases against one endpoint (a sync ``openai.OpenAI``
    client with ``max_retries=0``: a failed call is simply taken again at the next step)."""

    def __init__(
        self,
        store: Store,
        client: Any,
        prices: Prices,
        *,
        on_phase: PhaseHook | None = None,
        section_chars: int = DEFAULT_SECTION_CHARS,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.client = client
        self.prices = prices
        self.on_phase = on_phase or (lambda phase, job: None)
        self.section_chars = section_chars
        self.clock = clock

    def cancel(self, intent_or_batch_id: str) -> BatchJob:
        """Cancel a job: its remote batch is cancelled (what it answered is kept and ingested
        by the next steps); a job not yet sent is abandoned. Raises KeyError for no such job."""
        batches = self.store.openai_batches
        job = batches.get(intent_or_batch_id) or batches.by_batch_id(intent_or_batch_id)
        if job is None:
            raise KeyError(intent_or_batch_id)
        if job.status.finished or job.status.remote_ended:
            return job
        if job.batch_id is None and job.file_id is not None:
            found = self._created_batch(job)  # created before a crash, not recorded
            if found is not None:
                batches.record_batch(job.intent_id, found.id, JobStatus.VALIDATING)
                job = batches.get(job.intent_id) or job
        if job.batch_id is None:
            batches.finish(job.intent_id, JobStatus.ABANDONED, "cancelled before it was sent")
        else:
            self.client.batches.cancel(job.batch_id)
            self._poll(job)
        return batches.get(job.intent_id) or job

    def tick(self, *, max_jobs: int = 20) -> Progress:
        """Advance each unfinished job (oldest first, at most ``max_jobs``) by as many phases
        as it can go now: bounded work for one sensor tick."""
        progress = Progress()
        for job in self.store.openai_batches.unfinished()[:max_jobs]:
            current: BatchJob | None = job
            try:
                while current is not None and not current.status.finished:
                    before = current.status
                    current = self.advance(current, progress)
                    if current is None or current.status == before:
                        break
            except Exception as e:  # one job's failure must not hold up the others
                current = self._failed_step(current or job, e, progress)
            progress.advanced.append(job.intent_id)
            if current is not None and current.status.finished:
                progress.finished.append(current)
        return progress

    def _failed_step(self, job: BatchJob, error: Exception, progress: Progress) -> BatchJob | None:
        """Record why a step failed. A job not yet sent that the endpoint refused for good (a
        400 or 404 to its upload or its creation: nothing was made) is abandoned, its tasks
        freed; any other is left for the next tick — also an unexpected error, after which a
        batch may exist that only the next look finds."""
        from openai import APIStatusError

        category = classify(error)
        message = f"{category.value}: {describe(error)}"
        progress.errors[job.intent_id] = message
        logger.warning("Batch API job %s: %s", job.intent_id, message)
        batches = self.store.openai_batches
        unsent = job.status in (JobStatus.PLANNED, JobStatus.UPLOADED) and job.batch_id is None
        refused = isinstance(error, APIStatusError) and not category.retryable
        if unsent and refused and category != Category.AUTH_FAILED:
            batches.finish(job.intent_id, JobStatus.ABANDONED, message)
        else:
            batches.record_error(job.intent_id, message)
        return batches.get(job.intent_id)

    def advance(self, job: BatchJob, progress: Progress | None = None) -> BatchJob | None:
        """Take a job one phase further; the job as it is now."""
        progress = progress if progress is not None else Progress()
        if job.status == JobStatus.PLANNED:
            self._upload(job)
        elif job.status == JobStatus.UPLOADED:
            self._create(job)
        elif job.status.remote_ended:
            self._ingest(job, progress)
        elif not job.status.finished:
            self._poll(job)
        return self.store.openai_batches.get(job.intent_id)

    # -- upload ------------------------------------------------------------------------------

    def _upload(self, job: BatchJob) -> None:
        lines = self.store.openai_batches.lines(job.intent_id)
        requests, skipped = requests_for(
            self.store,
            [line.document_id for line in lines],
            job.model,
            section_chars=self.section_chars,
            completion_cap=job.completion_cap,
        )
        data = file_of(requests)
        if [r.task.task_id for r in requests] != [line.task_id for line in lines] or (
            content_hash(data) != job.content_hash
        ):
            # The declaration or the documents changed since it was planned: what it would send
            # is no longer what was recorded. It never went out; its tasks are planned anew.
            self.store.openai_batches.finish(
                job.intent_id,
                JobStatus.ABANDONED,
                "its request file could not be rebuilt as planned"
                + (f" ({len(skipped)} documents not batchable)" if skipped else ""),
            )
            return
        uploaded = self._uploaded_file(job)
        if uploaded is None:
            uploaded = self.client.files.create(
                file=(file_name(job.content_hash), io.BytesIO(data)), purpose="batch"
            ).id
        self.on_phase("uploaded", job)
        self.store.openai_batches.record_file(job.intent_id, uploaded)

    def _uploaded_file(self, job: BatchJob) -> str | None:
        """The id of this job's file if it was uploaded before (a crash before it was
        recorded), found by its name (the hash) and size."""
        name = file_name(job.content_hash)
        oldest = job.created_at.timestamp() - CLOCK_SLACK_SECONDS
        # Newest first (the endpoint's default order): the search stops at the first file
        # uploaded before the intent was recorded.
        for found in self.client.files.list(purpose="batch"):
            if found.filename == name and found.bytes == job.content_bytes:
                return str(found.id)
            if found.created_at < oldest:
                return None
        return None

    # -- create ------------------------------------------------------------------------------

    def _create(self, job: BatchJob) -> None:
        assert job.file_id is not None
        batch = self._created_batch(job)
        if batch is None:
            batch = self.client.batches.create(
                input_file_id=job.file_id,
                endpoint=ENDPOINT,
                completion_window=COMPLETION_WINDOW,
                metadata={INTENT_KEY: job.intent_id, "ai_pipeline_tasks": str(job.task_count)},
            )
        self.on_phase("created", job)
        status = _status_of(batch)
        # Its result files are recorded by the next poll: until then it counts as open, even
        # when the batch found again has ended meanwhile.
        if status.remote_ended:
            status = JobStatus.VALIDATING
        self.store.openai_batches.record_batch(job.intent_id, batch.id, status)

    def _created_batch(self, job: BatchJob) -> Any | None:
        """The remote batch of this intent if one was created before (a crash before it was
        recorded), found by its metadata; batches are listed newest first, so the search stops
        at the first one older than the intent."""
        oldest = job.created_at.timestamp() - CLOCK_SLACK_SECONDS
        for batch in self.client.batches.list(limit=100):
            if (batch.metadata or {}).get(INTENT_KEY) == job.intent_id:
                return batch
            if batch.created_at < oldest:
                return None
        return None

    # -- poll --------------------------------------------------------------------------------

    def _poll(self, job: BatchJob) -> None:
        assert job.batch_id is not None
        batch = self.client.batches.retrieve(job.batch_id)
        self.on_phase("polled", job)
        counts = batch.request_counts
        errors = getattr(batch.errors, "data", None) or []
        self.store.openai_batches.record_remote(
            job.intent_id,
            _status_of(batch),
            total=counts.total if counts else None,
            completed=counts.completed if counts else None,
            failed=counts.failed if counts else None,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            error="; ".join(redact(f"line {e.line}: {e.code}: {e.message}") for e in errors[:5])
            or None,
        )

    # -- ingest ------------------------------------------------------------------------------

    def _ingest(self, job: BatchJob, progress: Progress) -> None:
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
        self.on_phase("ingested", job)
        # What no file mentions (a cancelled or failed batch) is released, unanswered; only a
        # failed batch's lines may go again (a cancel was somebody's decision).
        if job.status == JobStatus.FAILED:
            progress.unanswered_documents.update(line.document_id for line in pending.values())
        self.store.openai_batches.finish(job.intent_id, JobStatus.INGESTED)

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
                batches.fail_line(
                    job.intent_id,
                    task,
                    LineState.FAILED,
                    category=e.category,
                    status_code=status,
                    error=e.message,
                )
                progress.failed += 1
                return
            if reply.finish_reason == "length" and self._asks_again(job.model):
                # The synchronous path would not keep this reply: it asks once more with a
                # larger limit. The line is paid for; its task is left to that path.
                batches.fail_line(
                    job.intent_id,
                    task,
                    LineState.FAILED,
                    category=Category.SCHEMA_VIOLATION,
                    status_code=status,
                    error="cut off at the output limit: left to the synchronous path, which asks "
                    "again with a larger one",
                    usage=usage,
                )
                progress.failed += 1
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
            batches.fail_line(
                job.intent_id,
                task,
                LineState.FAILED,
                category=category_for_reply(
                    status, code=_text(error.get("code")), param=_text(error.get("param"))
                ),
                status_code=status,
                error=redact(f"HTTP {status}: {error.get('message', '')}")[:500],
            )
            progress.failed += 1
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
            batches.fail_line(
                job.intent_id,
                task,
                LineState.FAILED,
                category=Category.NETWORK_TIMEOUT,
                status_code=None,
                error=message,
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


def _status_of(batch: Any) -> JobStatus:
    status = _REMOTE.get(str(batch.status))
    if status is None or status in (JobStatus.PLANNED, JobStatus.UPLOADED, JobStatus.INGESTED):
        raise ClassifiedError(Category.INTERNAL_ERROR, f"unknown batch status {batch.status!r}")
    return status


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# --- for commands and sensors ------------------------------------------------------------------


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
    sent = [_send(jobs, job) for job in planned.jobs]
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


def _send(jobs: BatchJobs, job: BatchJob) -> BatchJob:
    """Upload and create a planned job now (a failure leaves it for the next ``follow``)."""
    current: BatchJob | None = job
    while current is not None and current.status in (JobStatus.PLANNED, JobStatus.UPLOADED):
        current = jobs.advance(current)
    return current or job


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
