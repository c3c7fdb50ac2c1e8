"""The sensor that follows OpenAI Batch API jobs and launches the runs their answers make cheap.

Each tick does bounded work (``BatchJobs.tick``: at most ``max_jobs`` jobs, oldest first): it
uploads and creates what was planned, polls what is open, and ingests what ended — each answered
line becomes its task's checkpoint (``ai_pipeline.openai_batch``). Then:

- the documents a job answered get one backfill of the analysis assets, its runs planned over
  them at the run size (a run per document would make a 1,000-line job a thousand runs); each
  run finds the checkpoints, makes no call, and validates, stores and notifies as always, so
  Dagster's per-document truth is what it is for the synchronous path. The backfill is created
  while the job is ingested, before the job is recorded as ingested, and its id comes from the
  job's: a tick killed anywhere launches it exactly once;
- documents whose line failed retryably or expired go into a new job (``plan``, bounded by its
  attempts); those ``plan`` gave up on get an ordinary run too, which classifies them as a call
  would (a document cannot wait for a batch forever).

Built by ``build_openai_batch_sensor(site)`` for one analysis (``ai_pipeline.defs.site``: its
job, partitions and resources under the site's names), so that its interval and bound are chosen
where the code location is assembled (``ai_pipeline.defs.factory``). Nothing here is registered by
itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from ai_pipeline.defs.backfills import BACKFILL_TAG, backfill_id_for, launch_backfill, run_size_for
from ai_pipeline.defs.jobs import range_run_request
from ai_pipeline.defs.partitions import missing_partitions
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.defs.site import DEFAULT_SITE, Site
from ai_pipeline.intake import batches
from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.openai_batch.operations import batch_client
from ai_pipeline.openai_batch.planning import plan
from ai_pipeline.settings import Settings
from ai_pipeline.spend import Prices
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import BatchJob, LineState
from ai_pipeline.tasks import document_of

# A run (or a backfill launched from the UI) tagged ``ai_pipeline/via: batch`` sends its
# documents' requests as Batch API jobs rather than calling (``ai_pipeline.defs.assets``).
VIA_TAG = "ai_pipeline/via"
DEFAULT_INTERVAL_SECONDS = 120
DEFAULT_MAX_JOBS = 20
RUN_KEY_PREFIX = "openai-batch"
# On the backfill of what a job answered: the job's intent id.
JOB_TAG = "ai_pipeline/openai_batch_job"


def build_openai_batch_sensor(
    site: Site = DEFAULT_SITE,
    *,
    interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    max_jobs: int = DEFAULT_MAX_JOBS,
    expired_to_sync: bool = False,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """A sensor following the Batch API jobs of ``site``'s results database every
    ``interval_seconds``, at most ``max_jobs`` jobs a tick; documents whose line expired go
    into a new job, or with ``expired_to_sync`` to an ordinary run (the synchronous path)."""
    names = {n: site.name(n) for n in ("settings", "results_store", "llm")}

    @dg.sensor(
        name=site.name("openai_batch_sensor"),
        job_name=site.job_name,
        minimum_interval_seconds=interval_seconds,
        default_status=default_status,
        description="Follows OpenAI Batch API jobs (upload, create, poll, ingest) and launches "
        "the runs of the documents they answered, which then make no call.",
        required_resource_keys=set(names.values()),
    )
    def openai_batch_sensor(
        context: dg.SensorEvaluationContext, **_resources: Any
    ) -> dg.SensorResult | dg.SkipReason:
        resources = {n: getattr(context.resources, key) for n, key in names.items()}
        return openai_batch_tick(
            context,
            resources["settings"],
            resources["results_store"],
            resources["llm"],
            site=site,
            max_jobs=max_jobs,
            expired_to_sync=expired_to_sync,
        )

    return openai_batch_sensor


def openai_batch_tick(
    context: dg.SensorEvaluationContext,
    settings: PipelineSettings,
    results_store: ResultsStore,
    llm: LLMResource,
    *,
    site: Site = DEFAULT_SITE,
    max_jobs: int = DEFAULT_MAX_JOBS,
    expired_to_sync: bool = False,
) -> dg.SensorResult | dg.SkipReason:
    """One tick: follow the open jobs, then runs for what they answered (``SkipReason`` when no
    job is open)."""
    store = results_store.get()
    if not store.openai_batches.unfinished():
        return dg.SkipReason("no open Batch API job")
    pipeline = settings.resolve()
    jobs, config = batch_jobs(store, llm)
    backfills: dict[str, str] = {}

    def at_phase(phase: str, job: BatchJob) -> None:
        if phase == "ingested":
            backfill = _backfill_answered(context, site, store, job)
            if backfill is not None:
                backfills[job.intent_id] = backfill

    jobs.on_phase = at_phase
    progress = jobs.tick(max_jobs=max_jobs)
    for job in progress.finished:
        context.log.info(
            f"Batch API job {job.intent_id} (batch {job.batch_id}) ended {job.status.value}: "
            f"{job.request_completed} of {job.request_total} lines answered"
        )
    for intent, backfill in backfills.items():
        context.log.info(f"backfill {backfill} runs what Batch API job {intent} answered")
    # Documents given up on: a run each, which the daemon does not launch twice.
    launch: dict[str, str] = {}
    retry = sorted(progress.unanswered_documents - set(progress.answered_documents))
    if retry:
        again = plan(
            store,
            retry,
            config.analysis_model,
            section_chars=config.section_chars,
            expired_to_sync=expired_to_sync,
        )
        if again.jobs:
            context.log.info(
                f"{sum(j.task_count for j in again.jobs)} tasks whose lines failed or expired "
                f"go into {len(again.jobs)} new Batch API jobs"
            )
        for task, why in again.gave_up.items():
            context.log.warning(f"[TASK:{task}] no longer sent by batch: {why}")
        for task in again.gave_up:
            launch.setdefault(document_of(task), f"{RUN_KEY_PREFIX}-gave-up:{task}")
    if not launch:
        return dg.SkipReason(
            f"{len(progress.advanced)} Batch API jobs followed; "
            + (f"{len(backfills)} backfills launched" if backfills else "no document to run yet")
        )
    return _runs_for(context, site, store, launch, pipeline)


def batch_jobs(store: Store, llm: LLMResource) -> tuple[BatchJobs, Settings]:
    """The Batch API jobs of ``store`` against the endpoint of ``llm``, and its settings."""
    config = Settings.load(
        base_url=llm.base_url,
        analysis=llm.analysis,
        llm_timeout_seconds=llm.timeout_seconds,
        api_key_file=llm.api_key_file,
        api_key_command=llm.api_key_command,
    )
    jobs = BatchJobs(
        store,
        batch_client(config, llm.api_key),
        Prices.of(config),
        section_chars=config.section_chars,
    )
    return jobs, config


def _backfill_answered(
    context: dg.SensorEvaluationContext, site: Site, store: Store, job: BatchJob
) -> str | None:
    """One backfill of the documents ``job`` answered that are not completed yet (None when there
    are none), its id the job's: made again for the same job, it is the same backfill."""
    answered = [line.document_id for line in store.openai_batches.lines(job.intent_id)
                if line.state == LineState.ANSWERED]  # fmt: skip
    document_ids = [
        row.document_id for row in store.documents.rows(answered) if row.state != State.COMPLETED
    ]
    if not document_ids:
        return None
    repository = context.repository_def
    if repository is None:  # the daemon always gives one; a test's context must too
        raise RuntimeError("the Batch API sensor needs its code location (repository_def)")
    new_ids = missing_partitions(context.instance, document_ids, site.partitions)
    if new_ids:
        context.instance.add_dynamic_partitions(site.partitions, new_ids)
    backfill_id = launch_backfill(
        context.instance,
        repository.asset_graph,
        document_ids,
        title=f"Batch API job {job.intent_id}",
        tags={BACKFILL_TAG: "openai-batch", JOB_TAG: job.intent_id},
        backfill_id=backfill_id_for(site.name(f"{RUN_KEY_PREFIX}-{job.intent_id}")),
        site=site,
    )
    store.documents.queue(document_ids)
    return backfill_id


def _runs_for(
    context: dg.SensorEvaluationContext,
    site: Site,
    store: Store,
    run_keys: Mapping[str, str],
    settings: Settings,
) -> dg.SensorResult:
    """Runs of the analysis job for these documents (document → run key): ranges over the ones
    that are new partitions (added now, so contiguous), one run each for the others."""
    document_ids = sorted(run_keys)
    new_ids = missing_partitions(context.instance, document_ids, site.partitions)
    known = [d for d in document_ids if d not in set(new_ids)]
    store.documents.queue(document_ids)
    context.log.info(
        f"{len(document_ids)} documents back from the Batch API: runs launched "
        f"({len(new_ids)} new partitions)"
    )
    return dg.SensorResult(
        run_requests=[
            *(
                range_run_request(batch, prefix=RUN_KEY_PREFIX, job_name=site.job_name)
                for batch in batches(
                    new_ids,
                    run_size_for(
                        context.instance, len(new_ids), settings, settings.documents_per_run
                    ),
                )
            ),
            *(
                dg.RunRequest(run_key=run_keys[d], job_name=site.job_name, partition_key=d)
                for d in known
            ),
        ],
        dynamic_partitions_requests=[site.partitions_def.build_add_request(new_ids)]
        if new_ids
        else [],
    )
