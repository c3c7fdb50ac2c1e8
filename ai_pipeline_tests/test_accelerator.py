"""The accelerator is a ``dagster.yaml`` choice the product finds on the instance, and it turns
itself off on a Dagster release it was not checked against (``ai_pipeline.accelerator``)."""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg
import pytest

import ai_pipeline.accelerator as accelerator
from ai_pipeline.defs.acceleration import backfill_acceleration, event_acceleration
from ai_pipeline_tests.support import instance_yaml


def _instance(home: Path, *, accelerated: bool) -> dg.DagsterInstance:
    (home / "dagster.yaml").write_text(instance_yaml(accelerated=accelerated))
    return dg.DagsterInstance.from_config(str(home))


def test_the_product_finds_the_accelerator_on_the_storages_dagster_yaml_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the checkout's ``dagster.yaml`` the instance's run storage and event log carry what the
    accelerator adds; with Dagster's own storage neither does."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "accelerated"))  # where its files go
    (tmp_path / "stock").mkdir()
    (tmp_path / "accelerated").mkdir()
    with _instance(tmp_path / "stock", accelerated=False) as stock:
        assert backfill_acceleration(stock) is None
        assert event_acceleration(stock) is None
        assert not stock.event_log_storage.supports_partition_subset_in_asset_materialization_planned_events
    with _instance(tmp_path / "accelerated", accelerated=True) as fast:
        assert backfill_acceleration(fast) is not None
        events = event_acceleration(fast)
        assert events is not None and events.narrows_named_runs
        assert (
            fast.event_log_storage.supports_partition_subset_in_asset_materialization_planned_events
        )


def test_on_a_release_it_was_not_checked_against_it_builds_dagsters_own_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a Dagster release outside ``CHECKED_RELEASES`` the checkout's ``dagster.yaml`` gives
    Dagster's own SQLite storages, with nothing of the accelerator's, and one warning says so."""
    monkeypatch.setattr(accelerator, "CHECKED_RELEASES", frozenset({"0.0.0"}))
    monkeypatch.setattr(accelerator, "_announced", [])
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with (
        caplog.at_level(logging.WARNING, logger=accelerator.__name__),
        _instance(tmp_path, accelerated=True) as instance,
    ):
        kinds = {
            type(instance.event_log_storage).__name__,
            type(instance.run_storage).__name__,
            type(instance.schedule_storage).__name__,
        }
        assert backfill_acceleration(instance) is None
        assert event_acceleration(instance) is None
        instance.get_runs(limit=1)
    assert kinds == {"SqliteEventLogStorage", "SqliteRunStorage", "SqliteScheduleStorage"}
    warnings = [r.getMessage() for r in caplog.records if r.name == accelerator.__name__]
    assert len(warnings) == 1 and "0.0.0" in warnings[0] and dg.__version__ in warnings[0]
