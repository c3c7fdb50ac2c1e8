"""Every private Dagster API the project uses, in one place (checked against dagster 1.13.27).

Each has no public equivalent in that release; when Dagster changes, this is the module to check.

- ``AssetCheckEvaluationTargetMaterializationData``: a check evaluation yielded for one partition
  of a range must name the materialization it checks, or the UI drops it; the public
  ``AssetCheckResult`` cannot target one partition of a range.
- ``PartitionBackfill``, ``make_new_backfill_id``: creating an asset backfill outside the UI or a
  sensor (the CLI, the nightly schedule) — the same constructor the UI's GraphQL mutation uses.
  ``make_new_run_id`` and the backfill's ``with_submitting_run_requests`` and asset backfill data
  (``replace_requested_subset``, ``with_requested_runs_for_target_roots``,
  ``with_latest_storage_id``): a backfill handed to the daemon with its runs already planned, in
  the state the daemon writes before submitting runs it planned itself
  (``dagster._core.execution.asset_backfill.execute_asset_backfill_iteration``, which resumes it).
- ``DagsterEvent.build_asset_materialization_planned_event``, ``AssetMaterializationPlannedData``:
  with ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS`` set, a range run's planned events name
  the range, not each partition, and OSS storage then cannot tell which partitions of a failed run
  failed (Dagster PRs #28113, #29288). The analysis step writes the per-partition planned event
  itself, for the failed documents' stages only, so per-document FAILED status stays exact at the
  cost of the failures, not of every document. ``planned_events_per_partition`` says whether
  Dagster already wrote them (the switch unset).
- ``SqliteEventLogStorage``, ``SQLITE_BUSY_TIMEOUT_SECONDS``, ``ConfigurableClassData``: the
  embedded default's event log, subclassed to keep its engines (``ai_pipeline.defs.sqlite_storage``;
  it overrides ``_connect``, so check that method's body when Dagster changes), and
  ``DynamicPartitionsTable``, whose rows it reads to keep the keys of dynamic partitions;
  ``SqliteEventLogStorageWatchdog``, which it extends to the WAL file (it overrides ``watch``,
  which uses the storage's ``_obs`` and ``_watchers``, and ``wipe``).
- ``AssetCheckExecutionsTable``, ``AssetCheckExecutionRecordStatus``, ``serialize_value``,
  ``DefaultPartitionsSubset``, ``copy_record``: the rows a planned check evaluation writes, which ``ai_pipeline.defs.event_log`` writes itself (it
  overrides ``SqlEventLogStorage._store_asset_check_evaluation_planned``, whose body it mirrors).
  ``AssetKeyTable``, ``ASSET_KEY_INDEX_COLS``: an asset's row, which the production event log upserts with a statement
  built once (``ai_pipeline.defs.pg_storage``; it mirrors dagster-postgres's ``_store_asset_event``).
- ``AssetEventSummaryRecord`` (with ``SqlEventLogStorageTable`` and ``db_select``): the records
  of ``get_asset_event_summary_records``, which both event logs build themselves with each row's
  asset key parsed once (``ai_pipeline.defs.event_log.SummaryKeysParsedOnce``; it mirrors
  ``SqlEventLogStorage.get_asset_event_summary_records`` and uses its ``_get_assets_details`` and
  ``index_connection``, so check that body when Dagster changes).
- ``pg_config``: the configuration schema of dagster-postgres's storage, which the production
  instance's pooled storage (``ai_pipeline.defs.pg_storage``) extends; that module also replaces
  each dagster-postgres storage's ``_engine`` (check ``_connect`` there when dagster-postgres
  changes).
- ``BULK_ACTION_TERMINAL_STATUSES``, ``BulkActionStatus``, ``BulkActionsFilter``: the statuses in
  which a backfill is over, and the filter to list those that are not (a batch re-submitted while
  its backfill is still queued or running must not launch a second one).
- ``submit_asset_run``, ``BACKFILL_ID_TAG``, ``DagsterRunAlreadyExists``, ``WorkspaceProcessContext``,
  ``InProcessWorkspaceLoadTarget``, ``InProcessCodeLocationOrigin``, ``InstigatorType``: a launched
  backfill's planned runs submitted at once, as the backfill daemon submits them on its next loop
  (``ai_pipeline.defs.start_runs``), from the code location the daemon's sensor states name.
- ``set_defs_state_storage`` (``loaded_against``): definitions loaded in this process against a
  given instance's defs state storage, not the one a context variable last named.
- ``BulkActionsTable``, ``db_select``, ``deserialize_value`` and the run storage's ``connect``
  (through ``replace_backfill``, and ``backfill_writes``, whose ``update_backfill`` mirrors
  ``SqlRunStorage.update_backfill``): a backfill the UI created, re-planned by the code location's
  backfill planner only if nobody wrote it since it was read (``update_backfill`` writes whatever
  was there), so that it is either Dagster's plan or ours, never both
  (``ai_pipeline.defs.backfill_planner``).
- ``SqliteRunStorage``, ``SqliteScheduleStorage``, ``create_db_conn_string``: the embedded
  default's run and schedule storage, subclassed to keep an engine and to check a database's
  schema once a process (``ai_pipeline.defs.sqlite_storage``; they override ``from_local``,
  ``connect``, ``has_instigators_table``, ``has_secondary_index_table`` and ``has_built_index``,
  so check those bodies when Dagster changes).
- ``retry_run``, ``should_retry`` (through ``retry_failed_run``, imported when called),
  ``AUTO_RETRY_RUN_ID_TAG``, ``WILL_RETRY_TAG``: the daemon's own automatic retry of a failed run,
  made up for when its event-log consumer missed the failure (``ai_pipeline.defs.missed_retries``).
"""

import contextvars
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from dagster import AssetKey, DagsterInstance, DagsterRun
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.errors import DagsterRunAlreadyExists
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent
from dagster._core.execution.backfill import (
    BULK_ACTION_TERMINAL_STATUSES,
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
)
from dagster._core.execution.submit_asset_runs import submit_asset_run
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.scheduler.instigation import InstigatorType
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.config import pg_config
from dagster._core.storage.defs_state.base import set_defs_state_storage
from dagster._core.storage.event_log.base import AssetEventSummaryRecord
from dagster._core.storage.event_log.migration import ASSET_KEY_INDEX_COLS
from dagster._core.storage.event_log.schema import (
    AssetCheckExecutionsTable,
    AssetKeyTable,
    DynamicPartitionsTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SqliteEventLogStorage,
    SqliteEventLogStorageWatchdog,
)
from dagster._core.storage.runs.schema import BulkActionsTable
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlalchemy_compat import db_select
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS, create_db_conn_string
from dagster._core.storage.tags import AUTO_RETRY_RUN_ID_TAG, BACKFILL_ID_TAG, WILL_RETRY_TAG
from dagster._core.utils import make_new_backfill_id, make_new_run_id
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value
from dagster_shared.record import copy as copy_record

PLANNED_EVENTS_SWITCH = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
# Without it, Dagster 1.13's backfill daemon fails a backfill — and terminates its running runs —
# the first time its code location does not load (a code server restarting on a loaded machine
# met a locked SQLite file, benchmarks/README.md); with it, the backfill waits for the location.
BACKFILL_WAITS_FOR_CODE_SWITCH = "DAGSTER_BACKFILL_RETRY_DEFINITION_CHANGED_ERROR"
DAGSTER_SWITCHES = {PLANNED_EVENTS_SWITCH: "1", BACKFILL_WAITS_FOR_CODE_SWITCH: "1"}


def set_dagster_switches() -> None:
    """Set, unless the environment says otherwise, the Dagster switches that every Dagster process
    of the project should run with (``DAGSTER_SWITCHES``; the README asks the same of the daemon
    and the webserver): the runs this process creates write one planned event per asset, not one
    per document — the per-document FAILED status is then kept exact by the analysis step
    (``report_planned_materialization``) — and a backfill outlives a code location that fails to
    load for a moment."""
    for name, value in DAGSTER_SWITCHES.items():
        os.environ.setdefault(name, value)


def planned_events_per_partition(instance: DagsterInstance) -> bool:
    """Whether run creation writes one planned event per partition (the OSS default), so that a
    failed run's partitions are FAILED without help."""
    storage = instance.event_log_storage
    return not storage.supports_partition_subset_in_asset_materialization_planned_events


def report_planned_materialization(
    instance: DagsterInstance, run: DagsterRun, step_key: str, asset_key: AssetKey, partition: str
) -> None:
    """Write, in ``run``, the planned event of one partition of an asset."""
    event = DagsterEvent.build_asset_materialization_planned_event(
        run.job_name,
        step_key,
        AssetMaterializationPlannedData(asset_key, partition=partition, partitions_subset=None),
    )
    instance.report_dagster_event(event, run.run_id, logging.DEBUG)


T = TypeVar("T")

__all__ = [
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "ConfigurableClassData",
    "SqlEventLogStorageTable",
    "SqliteEventLogStorage",
    "SqliteEventLogStorageWatchdog",
    "SqliteRunStorage",
    "SqliteScheduleStorage",
    "create_db_conn_string",
    "DynamicPartitionsTable",
    "AssetCheckExecutionsTable",
    "AssetKeyTable",
    "ASSET_KEY_INDEX_COLS",
    "AssetEventSummaryRecord",
    "AssetCheckExecutionRecordStatus",
    "serialize_value",
    "DefaultPartitionsSubset",
    "copy_record",
    "pg_config",
    "AssetMaterializationPlannedData",
    "DagsterEvent",
    "PLANNED_EVENTS_SWITCH",
    "BACKFILL_WAITS_FOR_CODE_SWITCH",
    "DAGSTER_SWITCHES",
    "set_dagster_switches",
    "planned_events_per_partition",
    "report_planned_materialization",
    "BULK_ACTION_TERMINAL_STATUSES",
    "AssetCheckEvaluationTargetMaterializationData",
    "BulkActionStatus",
    "BulkActionsFilter",
    "PartitionBackfill",
    "make_new_backfill_id",
    "make_new_run_id",
    "BACKFILL_ID_TAG",
    "DagsterRunAlreadyExists",
    "InProcessCodeLocationOrigin",
    "InProcessWorkspaceLoadTarget",
    "InstigatorType",
    "WorkspaceProcessContext",
    "loaded_against",
    "submit_asset_run",
    "AUTO_RETRY_RUN_ID_TAG",
    "WILL_RETRY_TAG",
    "BulkActionsTable",
    "db_select",
    "deserialize_value",
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
    perhaps a dead instance's, in the middle of the load (seen under the test suite's load). So the
    load runs in a copy of this thread's context: such a reset there belongs to another context,
    and Dagster then leaves the variable empty (a load without defs state, as with no storage)
    instead of naming a dead storage."""

    def set_and_load() -> T:
        with set_defs_state_storage(instance.defs_state_storage):
            return load()

    return contextvars.copy_context().run(set_and_load)


def replace_backfill(
    instance: DagsterInstance,
    backfill_id: str,
    change: Callable[[PartitionBackfill], PartitionBackfill | None],
) -> PartitionBackfill | None:
    """The backfill ``change(backfill)`` made of the stored one, stored in its place only if its
    record is still the one read (compare and set on the stored body); None when ``change``
    made nothing or the record changed in between."""
    storage = instance.run_storage
    with storage.connect() as conn:  # type: ignore[attr-defined]
        body = conn.execute(
            db_select([BulkActionsTable.c.body]).where(BulkActionsTable.c.key == backfill_id)
        ).scalar()
    if body is None:
        return None
    new = change(deserialize_value(body, PartitionBackfill))
    if new is None:
        return None
    with storage.connect() as conn:  # type: ignore[attr-defined]
        replaced = conn.execute(
            BulkActionsTable.update()
            .where(BulkActionsTable.c.key == backfill_id, BulkActionsTable.c.body == body)
            .values(status=new.status.value, body=serialize_value(new))
        ).rowcount
    return new if replaced == 1 else None


def retry_failed_run(run: DagsterRun, context: Any) -> bool:
    """Retry the failed ``run`` as the daemon's automatic retry does (from failure, tagged as its
    retry, once whatever calls it), if the daemon's rules say it should be (``dagster/will_retry``
    true, its backfill not over); whether they did. ``context``: a ``WorkspaceProcessContext``."""
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import retry_run, should_retry

    if not should_retry(run, context.instance):
        return False
    retry_run(run, context)
    return True


def run_health(status: str, message: str | None = None) -> Any:
    """A run launcher's health check result: ``status`` is a ``WorkerStatus`` name."""
    from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

    return CheckRunHealthResult(WorkerStatus[status], message)
