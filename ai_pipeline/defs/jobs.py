"""The jobs, and the run requests that cover a range of documents.

Both jobs run in process (the executor is set once, on the ``Definitions``): every run is one step
that analyses many documents concurrently, and a subprocess per step would only add seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from ai_pipeline.defs.assets import analyse_documents, failure_report
from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.intake import batch_key

ANALYSIS_JOB_NAME = "analyse_documents_job"
REPORT_JOB_NAME = "failure_report_job"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
DOCUMENTS_TAG = "ai_pipeline/documents"

analysis_job = dg.define_asset_job(
    ANALYSIS_JOB_NAME,
    selection=dg.AssetSelection.assets(analyse_documents),
    partitions_def=documents_partitions,
    description="Analyse a range of documents: text → LLM → checks → upserted results.",
)

report_job = dg.define_asset_job(
    REPORT_JOB_NAME,
    selection=dg.AssetSelection.assets(failure_report),
    description="Build the failure report from the results and the failure events.",
)


def range_tags(document_ids: Sequence[str]) -> dict[str, str]:
    """Run tags for a range of documents; ``document_ids`` must be contiguous partitions."""
    return {
        RANGE_START_TAG: document_ids[0],
        RANGE_END_TAG: document_ids[-1],
        DOCUMENTS_TAG: str(len(document_ids)),
    }


def range_run_request(document_ids: Sequence[str], *, prefix: str) -> dg.RunRequest:
    """A run for a batch of newly added (so contiguous) documents, keyed by the batch's content."""
    return dg.RunRequest(
        run_key=f"{prefix}:{batch_key(document_ids)}",
        job_name=ANALYSIS_JOB_NAME,
        tags=range_tags(document_ids),
    )
