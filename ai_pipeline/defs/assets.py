"""The analysis assets: four stages of one multi-asset that runs a range of documents per run.

A run covers a range of ``documents`` partitions (sensor runs, CLI runs and backfills alike; a single
document is a range of one) and analyses its documents concurrently. Dagster would mark the whole
range materialized if the step returned outputs, so instead, per document and stage, the step
yields an ``AssetMaterialization`` once that stage's checkpoint is durable, and an
``AssetCheckEvaluation`` for each check of the LLM output. If any document failed, the step ends by
raising ``Failure`` listing each failed document and its category: Dagster then shows FAILED for
exactly those documents, from the stage that failed on (DESIGN.md, decision 3).
"""

import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsIOManager, ResultsStore
from ai_pipeline.notify import Notifier
from ai_pipeline.pipeline import STAGES, Analyser, StageDone, StageFailed, run_batch
from ai_pipeline.schema import CHECK_NAMES

DOCUMENT_TEXT, LLM_ANALYSIS, VALIDATED_ANALYSIS, ANALYSIS_RESULTS, COMPLETION_NOTICE = (
    dg.AssetKey(s) for s in STAGES
)
GROUP = "document_analysis"
DOCUMENTS_PER_BACKFILL_RUN = 25

_DESCRIPTIONS = {
    "document_text": "The document's normalised text, read from the file it arrived as.",
    "llm_analysis": "The LLM's reply for the document (checkpointed per task id: paid for once).",
    "validated_analysis": "The reply that passed every check: schema, confidence, refusal, grounding.",
    "analysis_results": "One upserted row per document in the results table.",
    "completion_notice": "The completion notice POSTed to the webhook, exactly once "
    "(Idempotency-Key: its task id); skipped when AI_PIPELINE_WEBHOOK_URL is unset.",
}

_CHECK_DESCRIPTIONS = {
    "refusal": "The reply is not a refusal (phrase library in Chinese and English).",
    "schema": "The reply is exactly the JSON the prompt asks for, not truncated.",
    "confidence": "The model's confidence is at or above the threshold (0.75 by default).",
    "grounding": "Every entity the model names occurs in the document.",
}


def _specs() -> list[dg.AssetSpec]:
    specs = []
    for i, stage in enumerate(STAGES):
        spec = dg.AssetSpec(
            stage,
            deps=[STAGES[i - 1]] if i else [],
            description=_DESCRIPTIONS[stage],
            group_name=GROUP,
            skippable=True,
            partitions_def=documents_partitions,
            kinds={"sql"} if stage == "analysis_results" else {"python"},
        )
        if stage == "analysis_results":
            spec = spec.with_io_manager_key("results_io_manager")
        specs.append(spec)
    return specs


with warnings.catch_warnings():
    # Partitioned asset checks are a preview feature in dagster 1.13; they are what gives every
    # document its own check results, so the warning is expected, not news for every load.
    warnings.simplefilter("ignore", dg.PreviewWarning)
    CHECK_SPECS = [
        dg.AssetCheckSpec(
            name,
            asset=LLM_ANALYSIS,
            description=_CHECK_DESCRIPTIONS[name],
            partitions_def=documents_partitions,
        )
        for name in CHECK_NAMES
    ]


def _target(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str
) -> AssetCheckEvaluationTargetMaterializationData | None:
    # Checked against dagster 1.13.27: the public AssetCheckResult cannot target one partition of a
    # range, and without target data the UI drops a check evaluation. This mirrors what
    # AssetCheckResult does for a single-partition step.
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=1
    ).records
    if not records:
        return None
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=records[0].storage_id,
        run_id=records[0].event_log_entry.run_id,
        timestamp=records[0].timestamp,
    )


@dg.multi_asset(
    name="analyse_documents",
    specs=_specs(),
    check_specs=CHECK_SPECS,
    can_subset=True,
    partitions_def=documents_partitions,
    backfill_policy=dg.BackfillPolicy.multi_run(DOCUMENTS_PER_BACKFILL_RUN),
)
def analyse_documents(
    context: dg.AssetExecutionContext,
    results_store: ResultsStore,
    llm: LLMResource,
    settings: PipelineSettings,
    results_io_manager: dg.ResourceParam[ResultsIOManager],
) -> Iterator[Any]:
    """Read, analyse, check and store every document of the run's partition range."""
    # Every stage runs for every document whatever the selection (each is checkpointed, so a
    # stage already done costs nothing), and every stage that completed is reported: a backfill
    # of analysis_results alone then also clears the upstream stages' FAILED status.
    selected_checks = set(context.selected_asset_check_keys)
    document_ids = sorted(context.partition_keys)
    config = settings.resolve()
    notifier = None
    if config.webhook_url:
        notifier = Notifier(config.webhook_url)
    else:
        context.log.info("no webhook configured (AI_PIPELINE_WEBHOOK_URL): no notices sent")
    analyser = Analyser(
        results_store.get(),
        llm.client(),
        results_io_manager.upsert,
        log=context.log,
        run_id=context.run.run_id,
        min_confidence=config.min_confidence,
        notifier=notifier,
        retry_budget=config.retry_budget,
    )
    context.log.info(
        f"analysing {len(document_ids)} documents with {analyser.llm.model} "
        f"(prompt {analyser.llm.prompt.version})"
    )
    failed: dict[str, StageFailed] = {}
    done = 0
    for document_id, events in run_batch(analyser, document_ids):
        for event in events:
            if isinstance(event, StageFailed):
                failed[document_id] = event
                continue
            yield from _report(context, event, selected_checks)
        done += 1
        if done % 25 == 0 or done == len(document_ids):
            context.log.info(
                f"{done}/{len(document_ids)} documents processed, {len(failed)} failed"
            )
    if failed:
        raise dg.Failure(
            description=f"{len(failed)} of {len(document_ids)} documents failed:\n"
            + "\n".join(
                f"[TASK:{f.task_id}] {f.category.value} at {f.stage}: {f.error}"
                for _, f in sorted(failed.items())
            ),
            metadata={
                d: dg.MetadataValue.text(f"{f.category.value} at {f.stage}: {f.error}"[:1000])
                for d, f in sorted(failed.items())
            },
            allow_retries=False,
        )


def _report(
    context: dg.AssetExecutionContext,
    event: StageDone,
    selected_checks: set[dg.AssetCheckKey],
) -> Iterator[Any]:
    asset_key = dg.AssetKey(event.stage)
    yield dg.AssetMaterialization(
        asset_key=asset_key,
        partition=event.document_id,
        metadata={k: v for k, v in event.metadata.items() if v is not None},
    )
    if not event.checks:
        return
    target = _target(context.instance, asset_key, event.document_id)
    for outcome in event.checks:
        if dg.AssetCheckKey(asset_key, outcome.name) not in selected_checks:
            continue
        metadata: dict[str, Any] = {"message": outcome.message}
        if outcome.category is not None:
            metadata["category"] = outcome.category.value
        yield dg.AssetCheckEvaluation(
            asset_key=asset_key,
            check_name=outcome.name,
            passed=outcome.passed,
            partition=event.document_id,
            metadata=metadata,
            severity=dg.AssetCheckSeverity.ERROR,
            target_materialization_data=target,
            description=outcome.message,
        )
