"""The failure report asset, its job, and the nightly schedule that retries and then reports.

The nightly schedule backfills the retryable failures (a real backfill the daemon runs); a sensor
materializes the report once that backfill has ended, whatever its outcome, so the report always
describes the state after the night's retries. With nothing to retry the schedule requests the
report directly.
"""

import base64
import os
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pandas as pd

from ai_pipeline.defs.assets import ANALYSIS_RESULTS, GROUP
from ai_pipeline.defs.backfills import (
    BACKFILL_TAG,
    backfill_id_for,
    launch_backfill,
    plan_failed_backfill,
)
from ai_pipeline.defs.resources import ResultsStore
from ai_pipeline.reporting import build_report, chart_png, to_markdown

NIGHTLY_CRON = os.environ.get("AI_PIPELINE_NIGHTLY_CRON", "0 2 * * *")
NIGHTLY_TIMEZONE = os.environ.get("AI_PIPELINE_TIMEZONE", "UTC")
NIGHTLY_TAG = "ai_pipeline/nightly"


@dg.asset(
    ins={
        "analysis_results": dg.AssetIn(ANALYSIS_RESULTS, partition_mapping=dg.AllPartitionMapping())
    },
    group_name=GROUP,
    kinds={"pandas"},
    description="Counts by state and category, failures by day, success rate, tokens and cost.",
)
def failure_report(
    context: dg.AssetExecutionContext, analysis_results: pd.DataFrame, results_store: ResultsStore
) -> dg.MaterializeResult:
    report = build_report(results_store.get(), analysis_results)
    png = chart_png(report)
    home = Path(context.instance.root_directory)
    chart_path = home / "reports" / "failure_report.png"
    chart_path.parent.mkdir(parents=True, exist_ok=True)
    chart_path.write_bytes(png)
    chart = f"![documents by state and failures by category](data:image/png;base64,{base64.b64encode(png).decode()})"
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.md(to_markdown(report)),
            "chart": dg.MetadataValue.md(chart),
            "chart_file": dg.MetadataValue.path(str(chart_path)),
            "documents": report["documents"],
            "success_rate": report["success_rate"],
            "failed": sum(v for k, v in report["by_state"].items() if k != "COMPLETED"),
            "estimated_cost_usd": report["estimated_cost_usd"],
            "tokens": report["tokens"]["prompt"] + report["tokens"]["completion"],
        }
    )


report_job = dg.define_asset_job(
    "failure_report_job",
    selection=dg.AssetSelection.assets(failure_report),
    executor_def=dg.in_process_executor,
    description="Build the failure report from the results and the failure events.",
)


@dg.schedule(
    cron_schedule=NIGHTLY_CRON,
    execution_timezone=NIGHTLY_TIMEZONE,
    job=report_job,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly: backfill the retryable failures, then build the failure report.",
)
def nightly_retry_schedule(
    context: dg.ScheduleEvaluationContext, results_store: ResultsStore
) -> dg.RunRequest | dg.SkipReason:
    when = context.scheduled_execution_time or datetime.now(timezone.utc)
    night = when.strftime("%Y-%m-%d")
    plan = plan_failed_backfill(context.instance, results_store.get())
    if not plan.selected:
        return dg.RunRequest(run_key=f"report-{night}", tags={NIGHTLY_TAG: night})
    backfill_id = launch_backfill(
        context.instance,
        plan.document_ids,
        title=f"nightly retry {night}",
        tags={NIGHTLY_TAG: night, BACKFILL_TAG: "nightly"},
        # One backfill per night, even when the tick is evaluated again.
        backfill_id=backfill_id_for(f"nightly-{night}"),
    )
    return dg.SkipReason(
        f"launched backfill {backfill_id} for {len(plan.selected)} documents "
        f"({len(plan.skipped)} left out); the report follows when it ends"
    )


@dg.sensor(
    job=report_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Builds the failure report once a nightly retry backfill has ended.",
)
def nightly_report_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES

    requests = [
        dg.RunRequest(
            run_key=f"report-after-{b.backfill_id}", tags={NIGHTLY_TAG: b.tags[NIGHTLY_TAG]}
        )
        for b in context.instance.get_backfills(limit=50)
        if NIGHTLY_TAG in b.tags and b.status in BULK_ACTION_TERMINAL_STATUSES
    ]
    if not requests:
        return dg.SkipReason("no nightly backfill has ended")
    return dg.SensorResult(run_requests=requests)
