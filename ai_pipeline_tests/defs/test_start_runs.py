"""A launched backfill's planned runs submitted by the command that launched it
(``ai_pipeline.accelerator.start_runs``), from the code location the daemon's sensor states name; and
from the same location, a failed run whose automatic retry the daemon missed retried
(``ai_pipeline.accelerator.missed_retries``).

No daemon here: the sensor states a daemon writes are written by the test, and the runs submitted
stay QUEUED. ``test_backfills.py`` has the same under a real daemon whose backfill loop would come
round only after ten minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteInstigatorOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorType,
    SensorInstigatorData,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from ai_pipeline.accelerator.missed_retries import retry_missed
from ai_pipeline.accelerator.start_runs import LIVE_SECONDS, daemon_location, start_planned_runs
from ai_pipeline.defs.backfills import launch_backfill
from ai_pipeline.defs.dagster_private import BulkActionStatus
from ai_pipeline.defs.replan import MISSED_RETRY_SECONDS
from ai_pipeline_tests.support import launcher, make_inbox, sample_text

# What these tests prove is the accelerator's.
pytestmark = pytest.mark.accelerated

NOW = 1_800_000_000.0


def sensor_state(
    location: str, began: float, *, sensor: str = "reconcile_sensor", module: str = ""
) -> InstigatorState:
    """The state a daemon keeps of a sensor of a code location it runs, its last tick begun at
    ``began``."""
    target = LoadableTargetOrigin(module_name=module or "ai_pipeline.definitions", attribute="defs")
    code_location = ManagedGrpcPythonEnvCodeLocationOrigin(target, location_name=location)
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(code_location, "__repository__"), sensor)
    return InstigatorState(
        origin,
        InstigatorType.SENSOR,
        InstigatorStatus.DECLARED_IN_CODE,
        SensorInstigatorData(last_tick_start_timestamp=began),
    )


def test_the_location_is_the_one_whose_reconcile_sensor_or_planner_began_a_tick_last_and_lately(
    instance: dg.DagsterInstance,
) -> None:
    assert daemon_location(instance, now=NOW) is None
    instance.add_instigator_state(sensor_state("gone", NOW - LIVE_SECONDS - 1))
    instance.add_instigator_state(sensor_state("other", NOW - 1, sensor="inbox_sensor"))
    assert daemon_location(instance, now=NOW) is None, "stale, or not one of LIVE_SENSORS"

    instance.add_instigator_state(sensor_state("dev", NOW - 50))
    instance.add_instigator_state(sensor_state("ai_pipeline", NOW - 20))

    found = daemon_location(instance, now=NOW)
    assert found is not None and found.location_name == "ai_pipeline"

    # A daemon in its first seconds: the planner's state is marked before its tick, the reconcile
    # sensor has not ticked yet.
    instance.add_instigator_state(sensor_state("new", NOW - 1, sensor="backfill_planner"))
    found = daemon_location(instance, now=NOW)
    assert found is not None and found.location_name == "new"


@pytest.fixture
def planned(instance: dg.DagsterInstance, simulator: Any, tmp_path: Path) -> tuple[str, Any]:
    """A backfill of seven documents in runs of three, launched with its runs planned; and the
    launcher. (The LLM settings point at the simulator: a run's resources need them set.)"""
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(980 + i) for i in range(7)})
    app = launcher(instance)
    ids = app.register_inbox(inbox).document_ids
    return launch_backfill(instance, app.asset_graph, ids, title="t", run_size=3), app


@pytest.mark.parametrize(
    "state",
    [
        # The daemon's last tick is too long ago: no daemon runs the code now.
        lambda: sensor_state("ai_pipeline", time.time() - LIVE_SECONDS - 5),
        # A live daemon, whose code location's target does not import in this process.
        lambda: sensor_state("elsewhere", time.time(), module="no_such_module"),
    ],
    ids=["no-live-daemon", "location-not-loadable-here"],
)
def test_the_runs_are_left_to_the_daemons_next_loop(
    instance: dg.DagsterInstance, planned: tuple[str, Any], state: Callable[[], InstigatorState]
) -> None:
    backfill_id, _ = planned
    instance.add_instigator_state(state())

    assert start_planned_runs(instance, [backfill_id]) == 0
    assert instance.get_runs() == []


def test_the_planned_runs_are_queued_once_under_their_reserved_ids(
    instance: dg.DagsterInstance, planned: tuple[str, Any]
) -> None:
    backfill_id, _ = planned
    instance.add_instigator_state(sensor_state("ai_pipeline", time.time()))
    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None and len(backfill.reserved_run_ids) == 3

    assert start_planned_runs(instance, [backfill_id]) == 3
    assert start_planned_runs(instance, [backfill_id]) == 0, "they exist: nothing twice"

    runs = instance.get_runs()
    assert sorted(r.run_id for r in runs) == sorted(backfill.reserved_run_ids)
    assert {r.status for r in runs} == {dg.DagsterRunStatus.QUEUED}
    for run in runs:
        assert run.tags["dagster/backfill"] == backfill_id
        assert run.remote_job_origin is not None
        assert run.remote_job_origin.location_name == "ai_pipeline"
    # The tags the daemon would give them: the backfill's own, and each planned run's range.
    requested = {r.tags["dagster/asset_partition_range_start"] for r in runs}
    assert requested == {
        r.tags["dagster/asset_partition_range_start"] for r in backfill.submitting_run_requests
    }


def test_an_instance_gone_since_does_not_keep_the_runs_from_starting(
    instance: dg.DagsterInstance, planned: tuple[str, Any], tmp_path: Path
) -> None:
    """Dagster finds the defs state storage a location loads with in a context variable, which
    entering an instance sets and leaving it may not reset. Left naming an instance that is gone,
    it failed the location's load here ("Attempted to resolve undefined DagsterInstance weakref"),
    and the runs were left to the daemon's next loop (seen under the suite's load: a ``submit
    --wait`` whose daemon loops every ten minutes timed out)."""
    import gc

    from dagster._core.storage.defs_state.base import DefsStateStorage, set_defs_state_storage

    backfill_id, _ = planned
    instance.add_instigator_state(sensor_state("ai_pipeline", time.time()))
    (tmp_path / "gone").mkdir()
    gone = dg.DagsterInstance.local_temp(str(tmp_path / "gone"))
    stale = gone.defs_state_storage
    assert stale is not None
    del gone
    # The instance goes now, and so does whatever else this worker left for the collector: a
    # suspended generator's ``set_defs_state_storage`` resets the variable when it is collected,
    # which inside the block below put another storage back (seen once under CI's load). No
    # collection runs inside it.
    gc.collect()
    gc.disable()
    try:
        with set_defs_state_storage(stale):
            assert DefsStateStorage.get() is stale
            with pytest.raises(dg.DagsterInvariantViolationError, match="weakref"):
                stale.get_latest_defs_state_info()

            assert start_planned_runs(instance, [backfill_id]) == 3
    finally:
        gc.enable()


def test_a_dead_instances_storage_put_back_during_the_load_does_not_keep_the_runs_from_starting(
    instance: dg.DagsterInstance,
    planned: tuple[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An instance entered and never left resets the context variable, when the collector
    finalizes it, to the storage that was current before it: at any moment, in the middle of a
    load too (under the suite's load a run was left to the daemon's next loop this way). Here the
    reset comes at the worst moment, as the code location begins to load, and puts back the
    storage of an instance that is gone."""
    import gc

    from dagster._core.remote_representation.code_location import InProcessCodeLocation
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    backfill_id, _ = planned
    instance.add_instigator_state(sensor_state("ai_pipeline", time.time()))
    (tmp_path / "gone").mkdir()
    gone = dg.DagsterInstance.local_temp(str(tmp_path / "gone"))
    stale = gone.defs_state_storage
    del gone
    gc.collect()
    outer = set_defs_state_storage(stale)
    outer.__enter__()
    # Entered while the dead instance's storage was current, never left.
    dropped = set_defs_state_storage(instance.defs_state_storage)
    dropped.__enter__()
    load = InProcessCodeLocation.__init__
    finalized: list[bool] = []

    def finalized_first(self: Any, *args: Any, **kwargs: Any) -> None:
        if not finalized:
            finalized.append(True)
            dropped.__exit__(None, None, None)  # what the collector does
        load(self, *args, **kwargs)

    monkeypatch.setattr(InProcessCodeLocation, "__init__", finalized_first)
    try:
        assert start_planned_runs(instance, [backfill_id]) == 3
        assert finalized == [True]
    finally:
        outer.__exit__(None, None, None)


def test_only_the_first_wave_is_submitted_the_rest_left_to_the_daemon(
    dagster_home: Path, planned: tuple[str, Any]
) -> None:
    """With two run slots the command submits two of the three runs; the third would only wait in
    the queue, so the daemon's next loop submits it (here: a second call, as the daemon would)."""
    backfill_id, _ = planned
    config = dagster_home / "dagster.yaml"
    assert "max_concurrent_runs: 4" in config.read_text()
    config.write_text(
        config.read_text().replace("max_concurrent_runs: 4", "max_concurrent_runs: 2")
    )
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_instigator_state(sensor_state("ai_pipeline", time.time()))

        assert start_planned_runs(instance, [backfill_id]) == 2
        assert start_planned_runs(instance, [backfill_id]) == 1
        assert start_planned_runs(instance, [backfill_id]) == 0
        assert len(instance.get_runs()) == 3


@pytest.mark.parametrize("backfill_over", [False, True])
def test_a_failed_run_whose_retry_was_missed_is_retried_once_after_the_grace(
    instance: dg.DagsterInstance, planned: tuple[str, Any], backfill_over: bool
) -> None:
    """A run failed and marked to be retried (the checkout's ``run_retries``) with no retry: left
    to the daemon for ``MISSED_RETRY_SECONDS``, then retried once as the daemon retries, inside its
    backfill; not if the backfill is over (the daemon's rule), nor with no daemon running."""
    backfill_id, _ = planned
    assert retry_missed(instance) == []
    instance.add_instigator_state(sensor_state("ai_pipeline", time.time()))
    assert start_planned_runs(instance, [backfill_id]) == 3
    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None
    run = instance.get_run_by_id(backfill.reserved_run_ids[0])
    assert run is not None
    instance.report_run_failed(run, "its launch was cut off")
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.tags["dagster/will_retry"] == "true"
    if backfill_over:
        instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELED))

    later = time.time() + MISSED_RETRY_SECONDS + 1
    assert retry_missed(instance) == [], "within the grace the retry is the daemon's"
    retried = retry_missed(instance, now=later)
    retries = instance.get_runs(dg.RunsFilter(tags={"dagster/parent_run_id": run.run_id}))
    if backfill_over:
        assert (retried, retries) == ([], [])
        marked = instance.get_run_by_id(run.run_id)
        assert marked is not None and marked.tags["dagster/will_retry"] == "false"
        events = len(instance.all_logs(run.run_id))
        assert retry_missed(instance, now=later) == []
        assert len(instance.all_logs(run.run_id)) == events, "asked again"
        return
    assert retried == [run.run_id]
    (retry,) = retries
    assert retry.status == dg.DagsterRunStatus.QUEUED
    assert retry.tags["dagster/backfill"] == backfill_id
    assert retry.tags["dagster/retry_number"] == "1"
    assert retry_missed(instance, now=later) == [], "once"
