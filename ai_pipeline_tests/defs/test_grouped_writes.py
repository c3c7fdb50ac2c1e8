"""The project's event logs write a group of events in one transaction (the accelerator's
``GroupedWrites``), on SQLite and PostgreSQL: nothing of the group is seen before it ends, all of
it after, nothing of a group that failed, and the rows are the ones event-by-event writes leave."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from ai_pipeline_tests.step_events import step_event

pytestmark = pytest.mark.accelerated

RUN_ID = "0f0e0d0c-0b0a-4000-8000-000000000001"
ASSETS = ("document_text", "llm_analysis")


def _materialization(asset: str, document: str) -> EventLogEntry:
    """What a run's step writes when it reports one stage of one document."""
    return step_event(
        DagsterEventType.ASSET_MATERIALIZATION,
        StepMaterializationData(
            dg.AssetMaterialization(asset, partition=document, metadata={"document": document})
        ),
        run_id=RUN_ID,
        job_name="analyse_documents_job",
    )


def _stored(instance: dg.DagsterInstance, asset: str) -> list[tuple[int, str]]:
    """(storage id, document) of every materialization of ``asset``, oldest first."""
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=100, ascending=True)
    return [(r.storage_id, r.partition_key or "") for r in records.records]


def test_a_group_of_events_is_one_transaction_with_the_rows_of_event_by_event_writes(
    instance: dg.DagsterInstance, dagster_home: Path
) -> None:
    storage = instance.event_log_storage
    with dg.DagsterInstance.from_config(str(dagster_home)) as other:  # another process's view
        with storage.grouped_writes():  # type: ignore[attr-defined]
            for document in ("d1", "d2", "d3"):
                for asset in ASSETS:
                    instance.handle_new_event(_materialization(asset, document))
            assert all(_stored(other, asset) == [] for asset in ASSETS), "seen before the end"
            # The group's own reads see its writes (a check evaluation reads its target so).
            assert [document for _, document in _stored(instance, ASSETS[0])] == ["d1", "d2", "d3"]

        for asset in ASSETS:
            stored = _stored(other, asset)
            assert [document for _, document in stored] == ["d1", "d2", "d3"]
            # The asset's row names its latest materialization, as after three separate writes.
            record = other.get_asset_records([dg.AssetKey(asset)])[0]
            latest = record.asset_entry.last_materialization_record
            assert latest is not None and latest.storage_id == stored[-1][0]
            assert (
                other.get_latest_materialization_event(dg.AssetKey(asset)).dagster_event.partition
                == "d3"
            )  # type: ignore[union-attr]
        assert len(other.get_records_for_run(RUN_ID).records) == 6

        with pytest.raises(RuntimeError), storage.grouped_writes():  # type: ignore[attr-defined]
            instance.handle_new_event(_materialization(ASSETS[0], "d4"))
            raise RuntimeError("the step failed halfway through its group")
        assert [document for _, document in _stored(other, ASSETS[0])] == ["d1", "d2", "d3"]
        latest = other.get_asset_records([dg.AssetKey(ASSETS[0])])[0].asset_entry
        assert latest.last_materialization_record.partition_key == "d3"  # type: ignore[union-attr]
        assert len(other.get_records_for_run(RUN_ID).records) == 6

        # Outside a group, every event is its own transaction again.
        instance.handle_new_event(_materialization(ASSETS[0], "d5"))
        assert _stored(other, ASSETS[0])[-1][1] == "d5"
