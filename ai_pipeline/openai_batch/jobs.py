"""Following Batch API jobs: ``BatchJobs`` takes each job through its phases against one
endpoint (upload its file, create its remote batch, poll it, ingest its results), each step
resumable after a crash, and cancels jobs. What goes in a job is ``planning``'s; what a result
line becomes is ``results``'."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any

from ai_pipeline.claims import owner_id
from ai_pipeline.declaration import DEFAULT_SECTION_CHARS
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm_errors import classify, describe
from ai_pipeline.openai_batch.request_files import (
    ENDPOINT,
    content_hash,
    file_name,
    file_of,
    requests_for,
)
from ai_pipeline.openai_batch.results import Ingestion, PhaseHook, Progress
from ai_pipeline.processes import current, gone
from ai_pipeline.redaction import redact
from ai_pipeline.spend import Prices
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import BatchJob, JobStatus

logger = logging.getLogger("ai_pipeline.openai_batch")

COMPLETION_WINDOW = "24h"
# The remote batch's metadata key holding our intent id: how a batch a crash left unrecorded is
# found again.
INTENT_KEY = "ai_pipeline_intent"
# How far back before an intent's creation ``batches.list`` is searched for its batch (clocks of
# this machine and the endpoint's differ a little).
CLOCK_SLACK_SECONDS = 300
_REMOTE = {s.value: s for s in JobStatus}
# How long a job's lease lasts: longer than the longest step (an upload of 200 MB).
LEASE_SECONDS = 900.0


def _lease_key(job: BatchJob) -> str:
    return f"openai-batch-job:{job.intent_id}"


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
        self.owner = owner_id(None)
        self.process = current()
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
        as it can go now: bounded work for one sensor tick. A job another process is advancing
        (the sensor's tick while ``submit --via batch`` sends it) is left to it."""
        progress = Progress()
        for job in self.store.openai_batches.unfinished()[:max_jobs]:
            if not self._hold(job):
                progress.held_elsewhere.append(job.intent_id)
                continue
            # As it is now: the process that held it before may have taken it further.
            current: BatchJob | None = self.store.openai_batches.get(job.intent_id)
            try:
                while current is not None and not current.status.finished:
                    before = current.status
                    current = self.advance(current, progress)
                    if current is None or current.status == before:
                        break
            except Exception as e:  # one job's failure must not hold up the others
                current = self._failed_step(current or job, e, progress)
            finally:
                self.store.leases.release(_lease_key(job), self.owner)
            progress.advanced.append(job.intent_id)
            if current is not None and current.status.finished:
                progress.finished.append(current)
        return progress

    def send(self, job: BatchJob) -> BatchJob:
        """Upload and create a planned job now, under its lease (a job another process holds is
        left to it; a failure leaves it for the next tick)."""
        if not self._hold(job):
            return job
        current: BatchJob | None = self.store.openai_batches.get(job.intent_id)
        try:
            while current is not None and current.status in (
                JobStatus.PLANNED,
                JobStatus.UPLOADED,
            ):
                current = self.advance(current)
        finally:
            self.store.leases.release(_lease_key(job), self.owner)
        return current or job

    def _hold(self, job: BatchJob) -> bool:
        """Take the job's lease: one process advances a job at a time, so that two never both
        upload its file or both create its batch (each would search for the other's first, but
        both can search before either has made it). A lease whose process is known dead is
        taken over at once; one held elsewhere expires after ``LEASE_SECONDS``."""
        leases, key = self.store.leases, _lease_key(job)
        if leases.claim(key, job.intent_id, self.owner, LEASE_SECONDS, self.process):
            return True
        holder = leases.holder(key)
        return (
            holder is not None
            and gone(holder.process)
            and leases.take_over(key, self.owner, holder.owner, LEASE_SECONDS, self.process)
        )

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
            Ingestion(self.store, self.client, self.prices, self.on_phase).ingest(job, progress)
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


def _status_of(batch: Any) -> JobStatus:
    status = _REMOTE.get(str(batch.status))
    if status is None or status in (JobStatus.PLANNED, JobStatus.UPLOADED, JobStatus.INGESTED):
        raise ClassifiedError(Category.INTERNAL_ERROR, f"unknown batch status {batch.status!r}")
    return status
