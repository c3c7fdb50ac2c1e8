"""A run's sign of life, and the run launcher whose health check reads it.

Dagster's ``DefaultRunLauncher`` has no health check: the code server that started a run fails
it when it sees its worker die, but when that server dies too (the daemon SIGKILLed with the code
servers it runs, a lost machine) the run stays STARTED for ever — in the UI as running, its
backfill open, no retry. Here every run beats while it works on documents: a thread of its step stores the time
and its process in the results database every ``BEAT_SECONDS`` (``store.run_beats``), and takes
them back when the step ends.
``HeartbeatCheckingRunLauncher`` is Dagster's default launcher with a health check for Dagster's
run monitoring (``run_monitoring`` in ``dagster.yaml``): a run whose process is known to have
ended (on the daemon's machine), or whose beats stopped ``STALE_SECONDS`` ago, is reported FAILED,
and the monitoring daemon fails it; ``run_retries`` then re-executes it, the reconcile sensor
frees its documents, its backfill goes on. A run that is not beating (another job of the
instance, a run still loading its code or past the analysis) is never judged here, nor is any run
while the results database is away. Nothing writes Dagster's run rows but Dagster.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import dagster as dg

from ai_pipeline.defs.dagster_private import CheckRunHealthResult, WorkerStatus
from ai_pipeline.errors import InputError
from ai_pipeline.periodic import every
from ai_pipeline.processes import current, gone
from ai_pipeline.settings import Settings
from ai_pipeline.store import Store
from ai_pipeline.store.beats import Beat, RunBeats
from ai_pipeline.store.database import Database, StoreUnavailable
from ai_pipeline.store.documents import utcnow

# A run beats this often; one whose last beat is older than STALE_SECONDS is taken for dead. A
# database away for less than that (a restart, a failover) kills no run; run monitoring looks
# every poll_interval_seconds, so a dead run of another machine is failed within about
# STALE_SECONDS + that, one of the daemon's machine at the first look.
BEAT_SECONDS = 5.0
STALE_SECONDS = 60.0
# How long the health check tries to read a run's beats before leaving the run unjudged.
READ_RETRY_SECONDS = 2.0

log = logging.getLogger(__name__)


@contextlib.contextmanager
def beating(store: Store, run_id: str) -> Iterator[None]:
    """Beat for ``run_id`` from now until the block ends (the first beat before it starts), then
    take the beats back: a run is judged only while it works on documents."""
    process = current()

    def beat() -> None:
        try:
            store.run_beats.beat(run_id, process)
        except Exception as e:  # a sign of life never ends the run; the next beat tries again
            log.warning("run %s: its sign of life not stored: %s", run_id, e)

    beat()
    try:
        with every(BEAT_SECONDS, beat, name="run-beat"):
            yield
    finally:
        # Whatever the run does next (another asset, a team's) it does unjudged, as any job.
        try:
            store.run_beats.forget(run_id, process)
        except Exception as e:  # the run's own outcome stands; this row only goes stale
            log.warning("run %s: its sign of life not taken back: %s", run_id, e)


def verdict(beat: Beat | None, now: datetime) -> str | None:
    """Why the run of ``beat`` is dead, or None while it may be alive (or never beat)."""
    if beat is None:
        return None
    if beat.process is not None and gone(beat.process):
        return f"its run worker (pid {beat.process.pid}) has ended"
    silent = (now - beat.at).total_seconds()
    if silent > STALE_SECONDS:
        return f"its run worker has given no sign of life for {silent:.0f} s"
    return None


class HeartbeatCheckingRunLauncher(dg.DefaultRunLauncher):
    """Dagster's ``DefaultRunLauncher``, whose health check fails a run whose beats stopped.

    ``database_url`` (optional, an env var allowed): the results database the runs beat in;
    without it, the product's setting (``AI_PIPELINE_DATABASE_URL``, else the default)."""

    def __init__(self, inst_data: Any = None, database_url: str | None = None):
        super().__init__(inst_data=inst_data)
        self._database_url = database_url
        self._beats: RunBeats | None = None

    @classmethod
    def config_type(cls) -> Any:
        return {"database_url": dg.Field(dg.StringSource, is_required=False)}

    @classmethod
    def from_config_value(
        cls, inst_data: Any, config_value: Mapping[str, Any]
    ) -> HeartbeatCheckingRunLauncher:
        return cls(inst_data=inst_data, database_url=config_value.get("database_url"))

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> Any:
        try:
            beat = self._run_beats().last(run.run_id)
        except (StoreUnavailable, InputError) as e:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"not judged: {e}")
        dead = verdict(beat, utcnow())
        if dead is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, dead)

    def _run_beats(self) -> RunBeats:
        # Its own connection to the results database, not the process's Store: that would claim
        # an empty database for the default analysis, and retry for as long as a run does, where
        # the monitoring daemon judges its runs one after another.
        if self._beats is None:
            url = Settings.load(database_url=self._database_url).database_url
            self._beats = RunBeats(Database(url, retry_seconds=READ_RETRY_SECONDS))
        return self._beats
