"""The asset checks on every LLM reply, per document: refusal, schema, confidence, grounding.

They are evaluated by the analysis step itself (``Declaration.evaluate``, inside the range run)
and reported here as one ``AssetCheckEvaluation`` per document and check, each targeting that
document's ``llm_analysis`` materialization: a range step cannot return one output per document,
so the evaluations carry the partition themselves.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg

from ai_pipeline.declaration import CheckOutcome
from ai_pipeline.defs.site import DEFAULT_SITE, Site


def _target_type() -> Any:
    """The type of ``AssetCheckEvaluation``'s documented ``target_materialization_data``
    argument, which dagster 1.13 does not export: read from the public class's annotation."""
    hint = typing.get_type_hints(dg.AssetCheckEvaluation)["target_materialization_data"]
    return next(t for t in typing.get_args(hint) if t is not type(None))


# Which materialization a check evaluation is about (storage id, run id, timestamp).
TargetMaterialization = _target_type()

CHECK_NAMES = ("refusal", "schema", "confidence", "grounding")

_DESCRIPTIONS = {
    "refusal": "The reply is not a refusal (phrase library in Chinese and English).",
    "schema": "The reply is exactly the JSON of the analysis's output model, not truncated.",
    "confidence": "The model's confidence is at or above the threshold (AI_PIPELINE_MIN_CONFIDENCE, "
    "0.75 by default).",
    "grounding": "Every value of the fields declared grounded occurs in the document.",
}


def _description(name: str, site: Site) -> str:
    """A check's description, with the confidence threshold the analysis declares."""
    threshold = getattr(site.declaration, "min_confidence", None)
    if name == "confidence" and threshold is not None:
        return f"The model's confidence is at or above {threshold:g} (min_confidence)."
    return _DESCRIPTIONS[name]


def check_specs(site: Site) -> list[dg.AssetCheckSpec]:
    """One check per document of ``site``'s LLM replies for each check its analysis declares."""
    with warnings.catch_warnings():
        # Partitioned asset checks are a preview feature in dagster 1.13; they are what gives
        # every document its own check results, so the warning is expected, not news.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(
                name,
                asset=site.checked_key,
                description=_description(name, site),
                partitions_def=site.partitions_def,
            )
            for name in site.declaration.all_check_names
        ]


CHECK_SPECS = check_specs(DEFAULT_SITE)
CHECKED_ASSET = DEFAULT_SITE.checked_key


def _target(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str) -> Any:
    """The materialization a check evaluation of one partition is about (the UI needs it): the
    one this process just stored when the storage remembers it (the accelerator), else the
    latest in the event log."""
    remembered = getattr(instance.event_log_storage, "latest_materialization", None)
    latest = remembered(asset_key, partition) if remembered is not None else None
    if latest is not None:
        storage_id, run_id, timestamp = latest
        return TargetMaterialization(storage_id=storage_id, run_id=run_id, timestamp=timestamp)
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=1
    ).records
    if not records:
        return None
    return TargetMaterialization(
        storage_id=records[0].storage_id,
        run_id=records[0].event_log_entry.run_id,
        timestamp=records[0].timestamp,
    )


def check_evaluations(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    document_id: str,
    outcomes: tuple[CheckOutcome, ...],
    selected: set[dg.AssetCheckKey],
) -> Iterator[dg.AssetCheckEvaluation]:
    """One evaluation per selected check of a document, after its materialization was written."""
    wanted = [o for o in outcomes if dg.AssetCheckKey(asset_key, o.name) in selected]
    if not wanted:
        return
    target = _target(instance, asset_key, document_id)
    for outcome in wanted:
        metadata: dict[str, Any] = {"message": outcome.message}
        if outcome.category is not None:
            metadata["category"] = outcome.category.value
        yield dg.AssetCheckEvaluation(
            asset_key=asset_key,
            check_name=outcome.name,
            passed=outcome.passed,
            partition=document_id,
            metadata=metadata,
            severity=dg.AssetCheckSeverity.ERROR,
            target_materialization_data=target,
            description=outcome.message,
        )
