"""The private Dagster names the product itself still uses (checked against dagster 1.13.27).

Everything private that only makes the product faster is in ``ai_pipeline.accelerator``; what is
left here has no public name in Dagster 1.13: what the command line needs to create and follow a
backfill as the UI does, and the answer of a run launcher's health check:

- ``PartitionBackfill``: an asset backfill of some documents, built as the UI's GraphQL mutation
  builds one (``from_asset_partitions``) and stored with ``DagsterInstance.add_backfill``;
- ``BulkActionStatus``, ``BulkActionsFilter``, ``BULK_ACTION_TERMINAL_STATUSES``: a backfill's
  status, and the filter that lists the backfills still open;
- ``CheckRunHealthResult``, ``WorkerStatus``: what a run launcher's ``check_run_worker_health``
  returns to Dagster's run monitoring (``run_health``; the extension point is public, its types
  are not exported);
- ``set_defs_state_storage`` (``loaded_against``): definitions loaded in this process against a
  given instance's defs state storage, not the one a context variable last named.
"""

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

from dagster import DagsterInstance
from dagster._core.execution.backfill import (
    BULK_ACTION_TERMINAL_STATUSES,
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
)
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.defs_state.base import set_defs_state_storage

T = TypeVar("T")

__all__ = [
    "BULK_ACTION_TERMINAL_STATUSES",
    "BulkActionStatus",
    "BulkActionsFilter",
    "CheckRunHealthResult",
    "PartitionBackfill",
    "WorkerStatus",
    "loaded_against",
    "repository_of",
]


def repository_of(definitions: Any, instance: DagsterInstance) -> Any:
    """``definitions.get_repository_def()``, built (once; Dagster caches it) against ``instance``'s
    defs state storage rather than whatever instance a context variable still names."""
    return loaded_against(instance, definitions.get_repository_def)


def loaded_against(instance: DagsterInstance, load: Callable[[], T]) -> T:
    """``load()`` — which loads definitions — against ``instance``'s defs state storage.

    Dagster reads that storage from a context variable that entering an instance sets and leaving
    it resets; a storage whose instance is gone fails every load ("Attempted to resolve undefined
    DagsterInstance weakref"). Setting the variable for the load is not enough on its own: an
    instance entered and never left (a generator dropped halfway) resets the variable when the
    garbage collector finalizes it, whenever that is, to the storage that was current before it —
    perhaps a dead instance's, in the middle of the load. So the load runs in a copy of this
    thread's context: such a reset there belongs to another context, and Dagster then leaves the
    variable empty (a load without defs state, as with no storage) instead of naming a dead
    storage."""

    def set_and_load() -> T:
        with set_defs_state_storage(instance.defs_state_storage):
            return load()

    return contextvars.copy_context().run(set_and_load)
