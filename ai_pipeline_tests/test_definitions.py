"""The code location loads, and everything is reachable from its one ``Definitions`` object."""

from __future__ import annotations

import contextvars
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.defs.assets import ANALYSIS_KEYS


def resolved(defs: dg.Definitions) -> Any:
    """``defs``'s repository, resolved in an empty context: Dagster finds the definitions-state
    storage of the instance in use through a context variable, which an earlier test in the same
    worker can leave pointing at an instance since gone ("Attempted to resolve undefined
    DagsterInstance weakref", seen in CI, depending on the order the tests ran in)."""
    return contextvars.Context().run(defs.get_repository_def)


def test_definitions_load() -> None:
    """Every asset, check, job, sensor, schedule and resource is reachable from ``defs``."""
    from ai_pipeline.definitions import defs

    repo = resolved(defs)
    assert set(repo.asset_graph.get_all_asset_keys()) == {
        *ANALYSIS_KEYS,
        dg.AssetKey("failure_report"),
    }
    assert {k.name for k in repo.asset_graph.asset_check_keys} == {
        "refusal",
        "schema",
        "confidence",
        "grounding",
    }
    assert {s.name for s in repo.sensor_defs} == {
        "inbox_sensor",
        "submissions_sensor",
        "openai_batch_sensor",
        "approvals_sensor",
        "reconcile_sensor",
        "nightly_report_sensor",
        "backfill_planner",
    }
    assert {s.name for s in repo.schedule_defs} == {"nightly_retry_schedule"}
    assert {j for j in repo.job_names if not j.startswith("__")} == {
        "analyse_documents_job",
        "failure_report_job",
        "canary_job",
    }
    assert set(defs.resources or {}) == {
        "results_store",
        "results_io_manager",
        "settings",
        "llm",
        "analysis",
    }
    # One executor, set once on the Definitions: every job runs its one step in process.
    for name in ("analyse_documents_job", "failure_report_job", "canary_job"):
        assert repo.get_job(name).executor_def.name == "in_process"


def test_load_time_settings_shape_the_definitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensor interval and the nightly cron and timezone are read when the location loads."""
    import importlib

    import ai_pipeline.definitions as definitions

    monkeypatch.setenv("AI_PIPELINE_SENSOR_INTERVAL", "7")
    monkeypatch.setenv("AI_PIPELINE_NIGHTLY_CRON", "30 3 * * *")
    monkeypatch.setenv("AI_PIPELINE_TIMEZONE", "Asia/Shanghai")
    try:
        repo = resolved(importlib.reload(definitions).defs)
        assert repo.get_sensor_def("inbox_sensor").minimum_interval_seconds == 7
        schedule = repo.get_schedule_def("nightly_retry_schedule")
        assert (schedule.cron_schedule, schedule.execution_timezone) == (
            "30 3 * * *",
            "Asia/Shanghai",
        )
    finally:
        monkeypatch.undo()
        importlib.reload(definitions)


def test_a_bad_load_time_setting_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sensor interval that is not a number fails the load with the variable's name."""
    import importlib

    import ai_pipeline.definitions as definitions
    from ai_pipeline.settings import SettingsError

    monkeypatch.setenv("AI_PIPELINE_SENSOR_INTERVAL", "soon")
    try:
        with pytest.raises(SettingsError, match="AI_PIPELINE_SENSOR_INTERVAL"):
            importlib.reload(definitions)
    finally:
        monkeypatch.undo()
        importlib.reload(definitions)
