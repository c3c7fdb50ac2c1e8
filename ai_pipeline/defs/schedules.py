"""The nightly retry schedule: backfill the retryable failures, then build the failure report.

The schedule launches a real backfill of the retryable failures (the daemon runs it); the
``nightly_report_sensor`` then materializes the report once that backfill has ended, whatever its
outcome, so the report always describes the state after the night's retries. With nothing to retry
the schedule requests the report directly. Documents a budget stopped (BUDGET_REACHED) are not
retried here: a rerun with no budget would spend what the budget refused (``plan_failed_backfill``).
Its cron and timezone are read when the code location
loads (``AI_PIPELINE_NIGHTLY_CRON``, ``AI_PIPELINE_TIMEZONE``), so it is built by
``build_nightly_retry_schedule`` in ``ai_pipeline.definitions``.

With ``via="batch"`` (``AI_PIPELINE_NIGHTLY_VIA=batch``) the night's documents go in OpenAI
Batch API jobs instead, at half the price; the analysis's ``openai_batch_sensor`` runs them when
they are answered. Only what cannot go in a job is backfilled; with no backfill the report is
requested at once (it shows the documents waiting in the Batch API).
"""

from datetime import datetime, timezone
from typing import Any

import dagster as dg

from ai_pipeline.defs.backfills import (
    BACKFILL_TAG,
    backfill_id_for,
    launch_backfill,
    plan_failed_backfill,
)
from ai_pipeline.defs.openai_batches import batch_jobs
from ai_pipeline.defs.resources import LLMResource, ResultsStore
from ai_pipeline.defs.site import DEFAULT_SITE, Site
from ai_pipeline.openai_batch.operations import submit

NIGHTLY_TAG = "ai_pipeline/nightly"


def build_nightly_retry_schedule(
    cron: str, tz: str, site: Site = DEFAULT_SITE, *, via: str = "sync"
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=site.name("nightly_retry_schedule"),
        cron_schedule=cron,
        execution_timezone=tz,
        job_name=site.report_job_name,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Nightly: backfill the retryable failures, then build the failure report.",
        required_resource_keys={site.name("results_store")}
        | ({site.name("llm")} if via == "batch" else set()),
    )
    def nightly_retry_schedule(
        context: dg.ScheduleEvaluationContext, **_resources: Any
    ) -> dg.RunRequest | dg.SkipReason:
        results_store = getattr(context.resources, site.name("results_store"))
        llm = getattr(context.resources, site.name("llm")) if via == "batch" else None
        return _nightly_tick(context, site, results_store, llm=llm)

    return nightly_retry_schedule


def _nightly_tick(
    context: dg.ScheduleEvaluationContext,
    site: Site,
    results_store: ResultsStore,
    *,
    llm: LLMResource | None = None,
) -> dg.RunRequest | dg.SkipReason:
    """The night's retries: a backfill, or (with ``llm``) Batch API jobs of that endpoint."""
    when = context.scheduled_execution_time or datetime.now(timezone.utc)
    night = when.strftime("%Y-%m-%d")
    store = results_store.get()
    plan = plan_failed_backfill(context.instance, store, site=site)
    if not plan.selected:
        return dg.RunRequest(run_key=f"report-{night}", tags={NIGHTLY_TAG: night})
    document_ids = plan.document_ids
    by_batch = ""
    if llm is not None:
        jobs, config = batch_jobs(store, llm)
        sent = submit(jobs, config.analysis_model, document_ids)
        by_batch = (
            f"{sent['tasks']} documents sent in {len(sent['jobs'])} Batch API jobs "
            f"({sent['in_open_jobs']} in open jobs already); "
        )
        context.log.info(by_batch)
        document_ids = [d for d in document_ids if d in set(sent["left_to_sync"])]
        if not document_ids:
            # Nothing for a backfill to do: the report now, with the documents waiting.
            return dg.RunRequest(run_key=f"report-{night}", tags={NIGHTLY_TAG: night})
    backfill_id = launch_backfill(
        context.instance,
        context.repository_def.asset_graph,
        document_ids,
        title=f"nightly retry {night}",
        tags={NIGHTLY_TAG: night, BACKFILL_TAG: "nightly"},
        # One backfill per night, even when the tick is evaluated again.
        backfill_id=backfill_id_for(site.name(f"nightly-{night}")),
        site=site,
    )
    return dg.SkipReason(
        f"{by_batch}launched backfill {backfill_id} for {len(document_ids)} documents "
        f"({len(plan.skipped)} left out); the report follows when it ends"
    )
