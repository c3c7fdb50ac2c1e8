"""A run's sign of life and the run launcher's health check (``ai_pipeline.defs.run_health``): a run
whose worker died is FAILED to Dagster's run monitoring, a live one, one that never beat and one
judged while the results database is away are not."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.defs import run_health
from ai_pipeline.defs.run_health import HeartbeatCheckingRunLauncher, beating, verdict
from ai_pipeline.processes import ProcessRef, current
from ai_pipeline.store import Store
from ai_pipeline.store.beats import Beat
from ai_pipeline.store.documents import utcnow


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.sqlite'}"


@pytest.fixture
def launcher(url: str) -> HeartbeatCheckingRunLauncher:
    return HeartbeatCheckingRunLauncher(database_url=url)


def _run(run_id: str) -> dg.DagsterRun:
    return dg.DagsterRun(job_name="analyse_documents_job", run_id=run_id)


def _status(launcher: HeartbeatCheckingRunLauncher, run_id: str) -> tuple[str, str | None]:
    result = launcher.check_run_worker_health(_run(run_id))
    return result.status.value, result.msg


def test_a_dead_process_or_a_silent_run_is_dead_a_live_one_or_one_never_seen_is_not() -> None:
    me = current()
    assert me is not None
    now = utcnow()
    ended = ProcessRef(me.space, me.pid, me.started + 1)  # this pid, another start: gone
    elsewhere = ProcessRef("another-machine", me.pid, me.started + 1)  # never judged by pid

    assert verdict(None, now) is None
    assert verdict(Beat("r", now, me), now) is None
    assert verdict(Beat("r", now, elsewhere), now) is None
    assert verdict(Beat("r", now, ended), now) == f"its run worker (pid {me.pid}) has ended"
    silent = now - timedelta(seconds=run_health.STALE_SECONDS + 5)
    assert verdict(Beat("r", silent, elsewhere), now) == (
        f"its run worker has given no sign of life for {run_health.STALE_SECONDS + 5:.0f} s"
    )
    assert verdict(Beat("r", silent + timedelta(seconds=10), None), now) is None


def test_a_run_beats_while_it_works_and_takes_its_beats_back_after(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_health, "BEAT_SECONDS", 0.05)
    store = Store(url)
    with beating(store, "run-1"):
        first = store.run_beats.last("run-1")
        assert first is not None and first.process == current()
        time.sleep(0.3)
        later = store.run_beats.last("run-1")
        assert later is not None and later.at > first.at
    assert store.run_beats.last("run-1") is None, "past its work, a run is not judged"
    time.sleep(0.3)
    assert store.run_beats.last("run-1") is None, "and beats no more"
    store.db.dispose()


def test_the_launcher_fails_a_run_whose_worker_died_only(
    url: str, launcher: HeartbeatCheckingRunLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert launcher.supports_check_run_worker_health
    store = Store(url)
    me = current()
    assert me is not None
    store.run_beats.beat("alive", me)
    store.run_beats.beat("killed", ProcessRef(me.space, me.pid, me.started + 1))
    store.run_beats.beat("silent", ProcessRef("another-machine", 1, 1))

    assert _status(launcher, "alive") == ("RUNNING", None)
    assert _status(launcher, "never-beat") == ("RUNNING", None)
    assert _status(launcher, "killed") == ("FAILED", f"its run worker (pid {me.pid}) has ended")
    assert _status(launcher, "silent") == ("RUNNING", None)
    later = utcnow() + timedelta(seconds=run_health.STALE_SECONDS + 1)
    monkeypatch.setattr(run_health, "utcnow", lambda: later)
    status, why = _status(launcher, "silent")
    assert status == "FAILED" and why is not None and "no sign of life" in why
    store.db.dispose()


def test_while_the_results_database_is_away_no_run_is_judged() -> None:
    """Nothing listens on port 1: the check gives up after READ_RETRY_SECONDS, the run unjudged."""
    launcher = HeartbeatCheckingRunLauncher(database_url="postgresql://nobody@127.0.0.1:1/none")
    started = time.monotonic()
    status, why = _status(launcher, "any")
    assert status == "RUNNING" and why is not None and why.startswith("not judged")
    assert time.monotonic() - started < run_health.READ_RETRY_SECONDS + 5
