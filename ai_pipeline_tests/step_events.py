"""What a run's step writes to the event log for two documents, and the rows a storage keeps of it:
for comparing the project's event-log storages with Dagster's own, row for row."""

from __future__ import annotations

import time
from typing import Any

import dagster as dg
import sqlalchemy as sa
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluation,
    AssetCheckEvaluationPlanned,
)
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from ai_pipeline.accelerator.internals import (
    AssetCheckExecutionsTable,
    AssetKeyTable,
    SqlEventLogStorageTable,
)

RUN_ID = "r1"
ASSET = dg.AssetKey("llm_analysis")


def step_event(
    kind: DagsterEventType, data: object, *, run_id: str = RUN_ID, job_name: str = "j"
) -> EventLogEntry:
    """An event of kind ``kind`` as the step ``analyse_documents`` of a run logs it."""
    return EventLogEntry(
        error_info=None,
        level="DEBUG",
        user_message="",
        run_id=run_id,
        timestamp=time.time(),
        step_key="analyse_documents",
        job_name=job_name,
        dagster_event=DagsterEvent(
            event_type_value=kind.value,
            job_name=job_name,
            event_specific_data=data,
            step_key="analyse_documents",
        ),
    )


def step_events() -> list[EventLogEntry]:
    """A planned check over d1 and d2; for each, a materialization and the check's evaluation
    (d1 passes, d2 fails); then an evaluation of a check the run did not plan (its row is
    inserted, not updated)."""
    subset = dg.DynamicPartitionsDefinition(name="documents").empty_subset()
    events = [
        step_event(
            DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
            AssetCheckEvaluationPlanned(
                asset_key=ASSET,
                check_name="schema",
                partitions_subset=subset.with_partition_keys(["d1", "d2"]),
            ),
        )
    ]
    for document in ("d1", "d2"):
        events.append(
            step_event(
                DagsterEventType.ASSET_MATERIALIZATION,
                StepMaterializationData(
                    dg.AssetMaterialization(ASSET, partition=document, metadata={"n": 1})
                ),
            )
        )
        events.append(
            step_event(
                DagsterEventType.ASSET_CHECK_EVALUATION,
                AssetCheckEvaluation(
                    asset_key=ASSET,
                    check_name="schema",
                    passed=document == "d1",
                    partition=document,
                    metadata={},
                ),
            )
        )
    events.append(
        step_event(
            DagsterEventType.ASSET_CHECK_EVALUATION,
            AssetCheckEvaluation(
                asset_key=ASSET, check_name="grounding", passed=True, partition="d2", metadata={}
            ),
        )
    )
    return events


def rows_kept(storage: Any) -> dict[str, list[dict[str, Any]]]:
    """The rows ``storage`` holds of ``step_events``: the run's events, the index's events, the
    check table, the asset's latest materialization; without the database clock's timestamps."""
    rows: dict[str, list[dict[str, Any]]] = {}
    with storage.run_connection(RUN_ID) as conn:
        rows["run events"] = [
            dict(r._mapping) for r in conn.execute(sa.select(SqlEventLogStorageTable))
        ]
    with storage.index_connection() as conn:
        for name, table in (
            ("events", SqlEventLogStorageTable),
            ("checks", AssetCheckExecutionsTable),
        ):
            rows[name] = [
                dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))
            ]
        # The asset's row: its latest materialization, the record holding the event, byte for byte.
        rows["asset"] = [
            dict(r._mapping)
            for r in conn.execute(
                sa.select(
                    AssetKeyTable.c.asset_key,
                    AssetKeyTable.c.last_materialization,
                    AssetKeyTable.c.last_run_id,
                    AssetKeyTable.c.last_materialization_timestamp,
                )
            )
        ]
    latest = storage.get_asset_records([ASSET])[0].asset_entry.last_materialization_record
    rows["latest"] = [{"storage_id": latest.storage_id if latest else None}]
    for table in rows.values():
        for row in table:
            row.pop("create_timestamp", None)
            row.pop("updated_timestamp", None)
    return rows


def assert_same_rows(ours: dict[str, list[dict]], dagsters: dict[str, list[dict]]) -> None:
    assert ours.keys() == dagsters.keys()
    for table in dagsters:
        assert len(ours[table]) == len(dagsters[table]), table
        for a, b in zip(ours[table], dagsters[table], strict=True):
            assert a == b, (table, {k: (a[k], b[k]) for k in a if a[k] != b[k]})
    checks = sorted(
        (r["check_name"], r["partition"], r["execution_status"]) for r in ours["checks"]
    )
    assert checks == [
        ("grounding", "d2", "SUCCEEDED"),
        ("schema", "d1", "SUCCEEDED"),
        ("schema", "d2", "FAILED"),
    ]
