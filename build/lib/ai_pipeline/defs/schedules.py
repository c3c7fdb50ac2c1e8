"""The nightly retry schedule: backfill the retryable failures, then build the failure report.

The schedule launches a real backfill of the retryable failures (the daemon runs it); the
``nightly_report_sensor`` then materializes the report once that backfill has ended, whatever its
outcome, so the report always describes the state after the night's retries. With nothing to retry
the schedule requests the report directly. Documents a budget stopped (BUDGET_REACHED) are not
retried here: a rerun with no budget would spend what the budget refused (``plan_failed_backfill``).
Its cron and timezone are read when the code location
loads (``AI_PIPELINE_NIGHTLY_CRON``, ``AI_PIPELINE_TIMEZONE``), so it is built by
``build_nightly_retry_schedule`` in ``ai_pipeline.definitions``.
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
from ai_pipeline.defs.resources import ResultsStore
from ai_pipeline.defs.site import DEFAULT_SITE, Site

NIGHTLY_TAG = "ai_pipeline/nightly"


def build_nightly_retry_schedule(
    cron: str, tz: str, site: Site = DEFAULT_SITE
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=site.name("nightly_retry_schedule"),
        cron_schedule=cron,
        execution_timezone=tz,
        job_name=site.report_job_name,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Nightly: backfill the retryable failures, then build the failure report.",
        required_resource_keys={site.name("results_store")},
    )
    def nightly_retry_schedule(
        context: dg.ScheduleEvaluationContext, **_resources: Any
    ) -> dg.RunRequest | dg.SkipReason:
        return _nightly_tick(context, site, getattr(context.resources, site.name("results_store")))

    return nightly_retry_schedule


def _nightly_tick(
    context: dg.ScheduleEvaluationContext, site: Site, results_store: ResultsStore
) -> dg.RunRequest | dg.SkipReason:
    when = context.scheduled_execution_time or datetime.now(timezone.utc)
    night = when.strftime("%Y-%m-%d")
    plan = plan_failed_backfill(context.instance, results_store.get(), site=site)
    if not plan.selected:
        return dg.RunRequest(run_key=f"report-{night}", tags={NIGHTLY_TAG: night})
    backfill_id = launch_backfill(
        context.instance,
        context.repository_def.asset_graph,
        plan.document_ids,
        title=f"nightly retry {night}",
        tags={NIGHTLY_TAG: night, BACKFILL_TAG: "nightly"},
        # One backfill per night, even when the tick is evaluated again.
        backfill_id=backfill_id_for(site.name(f"nightly-{night}")),
        site=site,
    )
    return dg.SkipReason(
        f"launched backfill {backfill_id} for {len(plan.selected)} documents "
        f"({len(plan.skipped)} left out); the report follows when it ends"
    )
