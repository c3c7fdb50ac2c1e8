"""The project's event logs answer ``get_asset_event_summary_records`` — what the backfill daemon
reads every new materialization through — with the records Dagster's own ``SqlEventLogStorage``
gives, on SQLite and PostgreSQL (``defs.event_log.SummaryKeysParsedOnce``)."""

from __future__ import annotations

import time

import dagster as dg
from dagster._core.events import DagsterEventType, StepMaterializationData
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

from ai_pipeline_tests.step_events import step_event

ASSETS = (dg.AssetKey("document_text"), dg.AssetKey(["team", "llm_analysis"]))
MATERIALIZATION = DagsterEventType.ASSET_MATERIALIZATION


def _materialize(instance: dg.DagsterInstance, run_id: str, documents: list[str]) -> None:
    for document in documents:
        for asset in ASSETS:
            data = StepMaterializationData(dg.AssetMaterialization(asset, partition=document))
            instance.handle_new_event(step_event(MATERIALIZATION, data, run_id=run_id))


def test_summary_records_are_dagsters_for_every_filter_and_after_a_wipe(
    instance: dg.DagsterInstance,
) -> None:
    _materialize(instance, "run-a", ["d1", "d2", "d3"])
    instance.wipe_assets([ASSETS[1]])
    time.sleep(0.01)  # the wipe's time is compared with the events' own
    _materialize(instance, "run-b", ["d4", "d5"])
    storage = instance.event_log_storage
    ids = [r.storage_id for r in storage.get_asset_event_summary_records(MATERIALIZATION)]
    # SQLite's wipe deletes the asset's rows; PostgreSQL's keeps them, older than the wipe.
    assert len(ids) >= 7

    queries: list[dict[str, object]] = [
        {},
        {"ascending": True},
        {"limit": 3},
        {"run_id": "run-a"},
        {"storage_ids": ids[2:6]},
        {"after_storage_id": ids[-3], "ascending": True, "limit": 2},
        {"before_storage_id": ids[1]},
    ]
    queries += [{**query, "asset_key": asset} for query in list(queries) for asset in ASSETS]
    for query in queries:
        ours = storage.get_asset_event_summary_records(MATERIALIZATION, **query)
        dagsters = SqlEventLogStorage.get_asset_event_summary_records(
            storage, MATERIALIZATION, **query
        )
        assert list(ours) == list(dagsters), query

    # The wiped asset's materializations before the wipe are not its records any more.
    wiped = storage.get_asset_event_summary_records(MATERIALIZATION, asset_key=ASSETS[1])
    assert sorted(r.partition for r in wiped) == ["d4", "d5"]
    assert all(r.asset_key == ASSETS[1] for r in wiped)
    kept = storage.get_asset_event_summary_records(MATERIALIZATION, asset_key=ASSETS[0])
    assert sorted(r.partition for r in kept) == ["d1", "d2", "d3", "d4", "d5"]
