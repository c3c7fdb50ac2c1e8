"""dagster-celery's ``CeleryRunLauncher``, with a health check that notices a lost worker host.

``CeleryRunLauncher.check_run_worker_health`` (dagster-celery 0.29.27) reads only the state of the
run's Celery task in the result backend. A worker that dies — its host lost, its processes killed
— never writes that state again: the task stays ``STARTED`` and Dagster's run monitoring would
call the run healthy forever, its documents held. Here a ``STARTED`` task also has its worker (the
node name the worker stored with that state) pinged over the broker; no answer within
``PING_SECONDS``, and no heartbeat of the run's own process within
``celery_worker.HEARTBEAT_STALE_SECONDS`` (a worker being drained answers no ping while its runs
finish), means the run's worker is gone, and the run is reported ``FAILED`` to the monitoring
daemon, which then fails the run (resuming stays off, see deploy/scale-out/dagster.yaml):
the reconcile sensor frees its documents and the daemon's run retries re-execute it on a live host.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_celery.launcher import CeleryRunLauncher
from dagster_celery.tags import DAGSTER_CELERY_TASK_ID_TAG

from ai_pipeline.defs.celery_worker import beating

# How long a worker has to answer a ping: its main process answers while its pool runs runs.
PING_SECONDS = 5.0


class LivenessCheckingCeleryRunLauncher(CeleryRunLauncher):
    """``CeleryRunLauncher`` whose health check pings the worker that started the run."""

    def check_run_worker_health(self, run: dg.DagsterRun) -> Any:
        result = super().check_run_worker_health(run)
        if result.status.name != "RUNNING":
            return result
        task = self.celery.AsyncResult(run.tags[DAGSTER_CELERY_TASK_ID_TAG])
        # With track_started, the worker stores {"pid": …, "hostname": <node name>} with STARTED.
        info = task.info if isinstance(task.info, dict) else {}
        worker = info.get("hostname")
        if not worker:
            return result
        replies = self.celery.control.ping(destination=[worker], timeout=PING_SECONDS)
        if replies or beating(self.celery.backend, run.run_id):
            # No reply, but the run beats: its worker is draining (a warm shutdown answers no
            # ping), and the run goes on.
            return result
        # The result and status types of the base class's answer (Dagster 1.13 exports neither).
        return type(result)(
            type(result.status).FAILED,
            f"Celery worker {worker} does not answer (no reply in {PING_SECONDS:g} s): its host "
            "is taken for lost",
        )
