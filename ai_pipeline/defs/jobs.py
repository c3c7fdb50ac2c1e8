"""The jobs, and the run requests that cover a range of documents.

Both jobs run in process: every run is one step that analyses many documents concurrently, and a
subprocess per step would only add seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from ai_pipeline.defs.site import ANALYSIS_TAG, DEFAULT_SITE, Site
from ai_pipeline.intake import batch_key

# A backfill's documents per run when Dagster plans it (a UI backfill), unless
# AI_PIPELINE_BACKFILL_RUN_SIZE says otherwise when the code location loads
# (``with_backfill_run_size``).
DOCUMENTS_PER_BACKFILL_RUN = 100

ANALYSIS_JOB_NAME = DEFAULT_SITE.job_name
REPORT_JOB_NAME = DEFAULT_SITE.report_job_name
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
DOCUMENTS_TAG = "ai_pipeline/documents"


def build_jobs(site: Site) -> tuple[dg.UnresolvedAssetJobDefinition, ...]:
    """``site``'s analysis job and report job; every run of them is tagged with its analysis."""
    tags = {ANALYSIS_TAG: site.declaration.name}
    analysis = dg.define_asset_job(
        site.job_name,
        selection=dg.AssetSelection.assets(*site.keys),
        partitions_def=site.partitions_def,
        description="Analyse a range of documents: text → LLM → checks → upserted results.",
        tags=tags,
        executor_def=dg.in_process_executor,
    )
    report = dg.define_asset_job(
        site.report_job_name,
        selection=dg.AssetSelection.assets(site.key("failure_report")),
        description="Build the failure report from the results and the failure events.",
        tags=tags,
        executor_def=dg.in_process_executor,
    )
    return analysis, report


analysis_job, report_job = build_jobs(DEFAULT_SITE)


def range_tags(document_ids: Sequence[str]) -> dict[str, str]:
    """Run tags for a range of documents; ``document_ids`` must be contiguous partitions."""
    return {
        RANGE_START_TAG: document_ids[0],
        RANGE_END_TAG: document_ids[-1],
        DOCUMENTS_TAG: str(len(document_ids)),
    }


def range_run_request(
    document_ids: Sequence[str],
    *,
    prefix: str,
    job_name: str = ANALYSIS_JOB_NAME,
    run_config: Mapping[str, Any] | None = None,
) -> dg.RunRequest:
    """A run for a batch of newly added (so contiguous) documents, keyed by the batch's content
    (and ``run_config``, when it names the documents of the range to work on)."""
    return dg.RunRequest(
        run_key=f"{prefix}:{batch_key(document_ids)}",
        job_name=job_name,
        run_config=run_config or {},
        tags=range_tags(document_ids),
    )
