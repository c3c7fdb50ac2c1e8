"""The canary as a job a person launches from the Dagster UI: the sample's size and seed are its
run config, and its report (a table, a chart of each field's agreement) is the run's metadata.
What it does is ``ai_pipeline.canary``'s, as ``ai-pipeline canary`` does it.

No ``from __future__ import annotations`` here: Dagster reads the op's config class from its
annotation.
"""

import asyncio
import base64
from typing import Any

import dagster as dg
from pydantic import Field

from ai_pipeline.canary import agreement_png, run_canary, to_markdown
from ai_pipeline.defs.site import ANALYSIS_TAG, Site
from ai_pipeline.spend import Meter, Prices


class CanaryConfig(dg.Config):
    sample: int = Field(default=20, ge=1, description="Stale documents to try.")
    seed: int = Field(default=0, description="Which sample: the same seed, the same documents.")
    tolerance: float = Field(
        default=0.05, ge=0, description="How far two numbers may differ and still agree."
    )


def build_canary_job(site: Site) -> dg.JobDefinition:
    """``site``'s canary job: one op, the analysis's own resources."""
    store_key, llm_key, settings_key = (site.name(n) for n in ("results_store", "llm", "settings"))

    @dg.op(
        name=site.name("canary"),
        required_resource_keys={store_key, llm_key, settings_key},
        description="Try the current analysis version on a sample of stale documents; compare "
        "and price the stale backfill. Results are not replaced.",
    )
    def canary(context: dg.OpExecutionContext, config: CanaryConfig) -> dg.Output[dict[str, Any]]:
        settings = getattr(context.resources, settings_key).resolve()
        store = getattr(context.resources, store_key).get()
        meter = Meter(
            store,
            Prices.of(settings),
            run_id=context.run_id,
            completion_reserve=settings.completion_reserve_tokens,
        )
        llm = getattr(context.resources, llm_key).client(meter=meter)

        async def run() -> dict[str, Any]:
            try:
                return await run_canary(
                    store,
                    llm,
                    settings,
                    size=config.sample,
                    seed=config.seed,
                    tolerance=config.tolerance,
                )
            finally:
                await llm.aclose()

        report = asyncio.run(run())
        png = base64.b64encode(agreement_png(report)).decode()
        return dg.Output(
            {"projected": report["projected"], "sample": report["sample"]},
            metadata={
                "report": dg.MetadataValue.md(to_markdown(report)),
                "chart": dg.MetadataValue.md(
                    f"![agreement per field](data:image/png;base64,{png})"
                ),
                "sample": report["sample"],
                "sample_calls": report["sample_calls"],
                "projected_cost_usd": report["projected"]["cost_usd"],
                "projected_documents": report["projected"]["documents"],
            },
        )

    @dg.job(
        name=site.name("canary_job"),
        description=canary.description,
        tags={ANALYSIS_TAG: site.declaration.name},
        executor_def=dg.in_process_executor,
    )
    def canary_job() -> None:
        canary()

    return canary_job
