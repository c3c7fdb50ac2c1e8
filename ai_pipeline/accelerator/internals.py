"""Every private Dagster name the accelerator uses, checked against dagster 1.13.27
(``CHECKED_RELEASES``); when Dagster changes, this is the module to check, with the methods the
accelerator overrides (each one's docstring names them).

- ``sqlite``: ``SqliteEventLogStorage`` (its ``_connect``, ``watch``, ``wipe``) and its watchdog,
  ``SqliteRunStorage`` and ``SqliteScheduleStorage`` (``from_local``, ``connect``, the
  ``has_*`` schema checks), ``DynamicPartitionsTable``, ``SQLITE_BUSY_TIMEOUT_SECONDS``,
  ``create_db_conn_string``, ``ConfigurableClassData``;
- ``postgres``: ``pg_config``, ``AssetKeyTable``, ``ASSET_KEY_INDEX_COLS`` (dagster-postgres's
  ``_store_asset_event``, mirrored), and each storage's ``_engine``;
- ``event_log``: ``AssetCheckExecutionsTable``, ``AssetCheckExecutionRecordStatus``,
  ``SqlEventLogStorageTable``, ``AssetEventSummaryRecord``, ``DefaultPartitionsSubset``,
  ``copy_record``, ``db_select``, ``serialize_value`` (``_store_asset_check_evaluation_planned``,
  ``_update_asset_check_evaluation``, ``get_asset_event_summary_records``, mirrored);
- ``acceleration``: ``DagsterEvent.build_asset_materialization_planned_event`` and
  ``AssetMaterializationPlannedData``, a document's own planned event;
- ``backfills``, ``backfill_writes``: ``BulkActionsTable``, ``deserialize_value``,
  ``make_new_run_id`` and the backfill's own methods (``with_submitting_run_requests`` …);
- ``start_runs``, ``missed_retries``: ``submit_asset_run``, ``WorkspaceProcessContext``,
  ``InProcessWorkspaceLoadTarget``, ``InProcessCodeLocationOrigin``, ``InstigatorType``,
  ``DagsterRunAlreadyExists``, ``BACKFILL_ID_TAG``, ``WILL_RETRY_TAG``,
  and the daemon's ``retry_run`` and ``should_retry``.
"""

from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.errors import DagsterRunAlreadyExists
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent
from dagster._core.execution.submit_asset_runs import submit_asset_run
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.scheduler.instigation import InstigatorType
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.config import pg_config
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
from dagster._core.storage.tags import BACKFILL_ID_TAG, WILL_RETRY_TAG
from dagster._core.utils import make_new_run_id
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value
from dagster_shared.record import copy as copy_record

__all__ = [
    "ASSET_KEY_INDEX_COLS",
    "BACKFILL_ID_TAG",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "WILL_RETRY_TAG",
    "AssetCheckExecutionRecordStatus",
    "AssetCheckExecutionsTable",
    "AssetEventSummaryRecord",
    "AssetKeyTable",
    "AssetMaterializationPlannedData",
    "BulkActionsTable",
    "ConfigurableClassData",
    "DagsterEvent",
    "DagsterRunAlreadyExists",
    "DefaultPartitionsSubset",
    "DynamicPartitionsTable",
    "InProcessCodeLocationOrigin",
    "InProcessWorkspaceLoadTarget",
    "InstigatorType",
    "SqlEventLogStorageTable",
    "SqliteEventLogStorage",
    "SqliteEventLogStorageWatchdog",
    "SqliteRunStorage",
    "SqliteScheduleStorage",
    "WorkspaceProcessContext",
    "copy_record",
    "create_db_conn_string",
    "db_select",
    "deserialize_value",
    "make_new_run_id",
    "pg_config",
    "serialize_value",
    "submit_asset_run",
]
