"""The one ``Definitions`` of the code location (what ``workspace.yaml`` loads)."""

import dagster as dg

from ai_pipeline.defs.assets import analyse_documents, failure_report, with_backfill_run_size
from ai_pipeline.defs.io_managers import ResultsIOManager
from ai_pipeline.defs.jobs import analysis_job, report_job
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.defs.schedules import build_nightly_retry_schedule
from ai_pipeline.defs.sensors import (
    approvals_sensor,
    build_inbox_sensor,
    nightly_report_sensor,
    reconcile_sensor,
    submissions_sensor,
)
from ai_pipeline.settings import Settings

# The settings that shape definitions (a sensor's interval, a cron) are read when the location loads.
at_load = Settings.load()
results_store = ResultsStore()

defs = dg.Definitions(
    assets=[with_backfill_run_size(analyse_documents, at_load.backfill_run_size), failure_report],
    jobs=[analysis_job, report_job],
    sensors=[
        build_inbox_sensor(at_load.sensor_interval_seconds),
        submissions_sensor,
        approvals_sensor,
        reconcile_sensor,
        nightly_report_sensor,
    ],
    schedules=[build_nightly_retry_schedule(at_load.nightly_cron, at_load.timezone)],
    resources={
        "results_store": results_store,
        "results_io_manager": ResultsIOManager(results_store=results_store),
        "settings": PipelineSettings(),
        "llm": LLMResource(api_key=dg.EnvVar("OPENAI_API_KEY")),
    },
    # Every run is one step that analyses many documents concurrently: a subprocess per step would
    # only add seconds per run (backfills launched from the UI use this executor too).
    executor=dg.in_process_executor,
)
