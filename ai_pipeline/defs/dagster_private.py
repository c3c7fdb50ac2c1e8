"""Every private Dagster API the project uses, in one place (checked against dagster 1.13.27).

Each has no public equivalent in that release; when Dagster changes, this is the module to check.

- ``AssetCheckEvaluationTargetMaterializationData``: a check evaluation yielded for one partition
  of a range must name the materialization it checks, or the UI drops it; the public
  ``AssetCheckResult`` cannot target one partition of a range.
- ``PartitionBackfill``, ``make_new_backfill_id``: creating an asset backfill outside the UI or a
  sensor (the CLI, the nightly schedule) — the same constructor the UI's GraphQL mutation uses.
- ``BULK_ACTION_TERMINAL_STATUSES``: the statuses in which a backfill is over.
"""

from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, PartitionBackfill
from dagster._core.utils import make_new_backfill_id

__all__ = [
    "BULK_ACTION_TERMINAL_STATUSES",
    "AssetCheckEvaluationTargetMaterializationData",
    "PartitionBackfill",
    "make_new_backfill_id",
]
