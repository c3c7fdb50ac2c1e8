"""The one ``Definitions`` of the code location (what ``workspace.yaml`` loads)."""

import dagster as dg

from ai_pipeline.defs.assets import analyse_documents
from ai_pipeline.defs.jobs import analysis_job
from ai_pipeline.defs.report import (
    failure_report,
    nightly_report_sensor,
    nightly_retry_schedule,
    report_job,
)
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsIOManager, ResultsStore
from ai_pipeline.defs.sensors import inbox_sensor

defs = dg.Definitions(
    assets=[analyse_documents, failure_report],
    jobs=[analysis_job, report_job],
    sensors=[inbox_sensor, nightly_report_sensor],
    schedules=[nightly_retry_schedule],
    resources={
        "results_store": ResultsStore(),
        "results_io_manager": ResultsIOManager(),
        "settings": PipelineSettings(),
        "llm": LLMResource(api_key=dg.EnvVar("OPENAI_API_KEY")),
    },
    # Every run is one step that analyses many documents concurrently: a subprocess per step would
    # only add seconds per run (backfills launched from the UI use this executor too).
    executor=dg.in_process_executor,
)
