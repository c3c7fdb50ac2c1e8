"""What the project's event-log storages change in Dagster's, on SQLite and PostgreSQL alike.

Creating a run writes, for each asset check it plans, one ``asset_check_executions`` row per
partition of the run. Dagster 1.13.27 (``SqlEventLogStorage._store_asset_check_evaluation_planned``)
serializes the whole planned event again for every one of those rows, and the event holds the
run's partition subset — every document key of the range — so the work grew with the square of
the documents per run: creating a run of 2,500 documents took the backfill daemon about 30 s,
97 % of it in that one method (a py-spy profile, ``benchmarks/README.md``), and the fourth run of
a batch started two minutes after the first.

:class:`PlannedChecksSerializedOnce` writes the same rows — the same columns and values, the
event serialized once and shared — in one executemany, so planning a run's checks costs time in
proportion to its documents. The embedded default's event log
(``ai_pipeline.defs.sqlite_storage``) and the production one (``ai_pipeline.defs.pg_storage``)
both take it.

It also remembers that the asset-check table exists: Dagster asks the database (a table
inspection on a connection of its own) before it stores each check evaluation, four times per
document, and a table that exists stays; a missing one is asked about again.
"""

from __future__ import annotations

from typing import Any

from ai_pipeline.defs.dagster_private import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    serialize_value,
)


class PlannedChecksSerializedOnce:
    """Mixin for a ``SqlEventLogStorage``: the rows of a planned check evaluation, its event
    serialized once (checked against dagster 1.13.27: the method it overrides has this body, with
    ``serialize_value(event)`` inside the per-partition loop), and the check table's existence
    remembered once seen."""

    _has_check_table = False

    @property
    def supports_asset_checks(self) -> bool:
        if not self._has_check_table:
            self._has_check_table = bool(super().supports_asset_checks)  # type: ignore[misc]
        return self._has_check_table

    def _store_asset_check_evaluation_planned(self, event: Any, event_id: int | None) -> None:
        assert event.dagster_event is not None
        planned = event.dagster_event.event_specific_data
        keys = (
            planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        )
        row = {
            "asset_key": planned.asset_key.to_string(),
            "check_name": planned.check_name,
            "run_id": event.run_id,
            "execution_status": AssetCheckExecutionRecordStatus.PLANNED.value,
            "evaluation_event": serialize_value(event),
            "evaluation_event_timestamp": self._event_insert_timestamp(event),  # type: ignore[attr-defined]
            "evaluation_event_storage_id": event_id,
        }
        if not keys:
            return
        with self.index_connection() as conn:  # type: ignore[attr-defined]
            conn.execute(
                AssetCheckExecutionsTable.insert(), [{**row, "partition": key} for key in keys]
            )
