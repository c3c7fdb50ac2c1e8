"""The definitions of a list of analyses: for each, its assets, checks, jobs, sensors, schedule and
resources, under the names its site gives them (``ai_pipeline.defs.site``).

The product's own code location (``ai_pipeline.definitions``) and the Dagster component
(``ai_pipeline.component``) both build their definitions here, so an analysis gets the same
guarantees wherever it is deployed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from ai_pipeline.defs.assets import build_analysis_assets, build_failure_report
from ai_pipeline.defs.canary_job import build_canary_job
from ai_pipeline.defs.io_managers import ResultsIOManager
from ai_pipeline.defs.jobs import DOCUMENTS_PER_BACKFILL_RUN, build_jobs
from ai_pipeline.defs.openai_batches import build_openai_batch_sensor
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.defs.schedules import build_nightly_retry_schedule
from ai_pipeline.defs.sensors import build_sensors
from ai_pipeline.defs.site import Site, SiteResource
from ai_pipeline.settings import Settings


@dataclass(frozen=True)
class AtLoad:
    """The settings that shape definitions, read when the code location loads."""

    sensor_interval_seconds: int
    batch_api_interval_seconds: int
    # Documents per run of a backfill Dagster plans (one launched from the UI); None: its default.
    backfill_run_size: int | None
    nightly_cron: str
    timezone: str
    # How the nightly schedule retries: "sync" (a backfill) or "batch" (the Batch API).
    nightly_via: str = "sync"

    @classmethod
    def from_settings(cls, settings: Settings) -> AtLoad:
        return cls(
            sensor_interval_seconds=settings.sensor_interval_seconds,
            batch_api_interval_seconds=settings.batch_api_interval_seconds,
            backfill_run_size=settings.backfill_run_size,
            nightly_cron=settings.nightly_cron,
            timezone=settings.timezone,
            nightly_via=settings.nightly_via,
        )


def site_definitions(site: Site, at_load: AtLoad) -> dg.Definitions:
    """Everything one analysis brings to a code location."""
    store = ResultsStore(database_url=site.database_url, analysis=site.analysis)
    return dg.Definitions(
        assets=[
            build_analysis_assets(site, at_load.backfill_run_size or DOCUMENTS_PER_BACKFILL_RUN),
            build_failure_report(site),
        ],
        jobs=[*build_jobs(site), build_canary_job(site)],
        sensors=[
            *build_sensors(site, at_load.sensor_interval_seconds),
            build_openai_batch_sensor(site, interval_seconds=at_load.batch_api_interval_seconds),
        ],
        schedules=[
            build_nightly_retry_schedule(
                at_load.nightly_cron, at_load.timezone, site, via=at_load.nightly_via
            )
        ],
        resources={
            site.name("results_store"): store,
            site.name("results_io_manager"): ResultsIOManager(results_store=store),
            site.name("settings"): PipelineSettings(analysis=site.analysis, inbox=site.inbox),
            site.name("llm"): LLMResource(
                api_key=dg.EnvVar("OPENAI_API_KEY"), analysis=site.analysis
            ),
            site.name("analysis"): SiteResource(site),
        },
    )


def build_definitions(sites: Sequence[Site], at_load: AtLoad | None = None) -> dg.Definitions:
    """The definitions of these analyses, each under its own names; they must not clash."""
    names = [s.prefix for s in sites]
    if len(set(names)) != len(names):
        raise ValueError(
            "two analyses under the same key prefix: give each its own "
            f"({', '.join(str(n) for n in names)})"
        )
    at_load = at_load or AtLoad.from_settings(Settings.load())
    return dg.Definitions.merge(
        *(site_definitions(site, at_load) for site in sites),
        # Every run is one step that analyses many documents concurrently: a subprocess per step
        # would only add seconds per run (backfills launched from the UI use this executor too).
        dg.Definitions(executor=dg.in_process_executor),
    )
