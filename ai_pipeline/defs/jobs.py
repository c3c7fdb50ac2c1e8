"""The analysis job, and the run requests that cover a range of documents."""

from collections.abc import Sequence

import dagster as dg

from ai_pipeline.defs.assets import analyse_documents
from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.intake import batch_key

ANALYSIS_JOB_NAME = "analyse_documents_job"

analysis_job = dg.define_asset_job(
    ANALYSIS_JOB_NAME,
    selection=dg.AssetSelection.assets(analyse_documents),
    partitions_def=documents_partitions,
    # One step per run: a subprocess per step would add seconds to every run for nothing.
    executor_def=dg.in_process_executor,
    description="Analyse a range of documents: text → LLM → checks → upserted results.",
)


def range_tags(document_ids: Sequence[str]) -> dict[str, str]:
    """Run tags for a range of documents; ``document_ids`` must be contiguous partitions."""
    return {
        "dagster/asset_partition_range_start": document_ids[0],
        "dagster/asset_partition_range_end": document_ids[-1],
        "ai_pipeline/documents": str(len(document_ids)),
    }


def range_run_request(document_ids: Sequence[str], *, prefix: str) -> dg.RunRequest:
    """A run for a batch of newly added (so contiguous) documents, keyed by the batch's content."""
    return dg.RunRequest(
        run_key=f"{prefix}:{batch_key(document_ids)}",
        job_name=ANALYSIS_JOB_NAME,
        tags=range_tags(document_ids),
    )
