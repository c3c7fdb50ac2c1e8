"""What a worker host of dagster-celery's ``CeleryRunLauncher`` adds to each run it executes.

Imported by the Celery worker only (``deploy/scale-out/worker.sh`` passes ``-i
ai_pipeline.defs.celery_worker``), never by the code location: when a run's task starts in one of
the worker's pool processes, the run gets the tag ``ai_pipeline/worker_host`` (the host's name, as
the UI's run list shows and filters it) and an engine event in its event log saying which host and
Celery worker ran it. While the run executes, its pool process stores a heartbeat in the result
backend every ``HEARTBEAT_SECONDS`` (``heartbeat_key``): a worker being drained (Celery's warm
shutdown) closes its broker connection at once and answers no ping until its runs have ended, so
the launcher's health check (``ai_pipeline.defs.celery_launcher``) tells a draining host, whose
runs still beat, from a lost one, whose runs do not. Nothing else about the run changes: the task
itself is dagster-celery's.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any

import dagster as dg
from celery.signals import task_postrun, task_prerun

WORKER_HOST_TAG = "ai_pipeline/worker_host"
# dagster-celery's task that executes a whole run (dagster_celery.config.TASK_EXECUTE_JOB_NAME).
EXECUTE_JOB_TASK = "execute_job"
# How often a run's pool process says it is alive, and how old its last word may be for the run to
# count as alive (three beats: one or two lost writes under load are not a lost host).
HEARTBEAT_SECONDS = 2.0
HEARTBEAT_STALE_SECONDS = 3 * HEARTBEAT_SECONDS

log = logging.getLogger(__name__)
# The heartbeat of each run this process executes: task id → its stop.
_beating: dict[str, threading.Event] = {}


def heartbeat_key(run_id: str) -> str:
    return f"ai-pipeline-run-heartbeat-{run_id}"


def last_heartbeat(backend: Any, run_id: str) -> dict[str, Any] | None:
    """The run's last heartbeat in the result backend: ``{"worker": node name, "at": epoch
    seconds}``, or None."""
    raw = backend.get(heartbeat_key(run_id))
    if not raw:
        return None
    beat = json.loads(raw)
    return beat if isinstance(beat, dict) else None


def beating(backend: Any, run_id: str, *, now: float | None = None) -> bool:
    """Whether the run's pool process said it was alive within ``HEARTBEAT_STALE_SECONDS`` (the
    hosts' clocks in step, as the document leases need already)."""
    beat = last_heartbeat(backend, run_id)
    if beat is None:
        return False
    now = time.time() if now is None else now
    return now - float(beat.get("at", 0)) < HEARTBEAT_STALE_SECONDS


def _beat(backend: Any, run_id: str, worker: str, stop: threading.Event) -> None:
    while True:
        try:
            backend.set(heartbeat_key(run_id), json.dumps({"worker": worker, "at": time.time()}))
        except Exception as e:  # the next beat tries again; the run goes on regardless
            log.warning("heartbeat of run %s not stored: %s", run_id, e)
        if stop.wait(HEARTBEAT_SECONDS):
            return


def run_id_of(task_kwargs: dict[str, Any] | None) -> str | None:
    """The run id in the keyword arguments of dagster-celery's ``execute_job`` task: a packed
    ``ExecuteRunArgs`` (checked against dagster-celery 0.29.27), read through Dagster's public
    serdes — its stored field names are not its attribute names (``pipeline_run_id``)."""
    packed = (task_kwargs or {}).get("execute_job_args_packed")
    if not isinstance(packed, dict):
        return None
    run_id = getattr(dg.deserialize_value(json.dumps(packed)), "run_id", None)
    return run_id if isinstance(run_id, str) else None


@task_prerun.connect
def record_worker_host(
    sender: Any = None, task: Any = None, kwargs: dict[str, Any] | None = None, **_: Any
) -> None:
    if getattr(sender, "name", None) != EXECUTE_JOB_TASK:
        return
    run_id = run_id_of(kwargs)
    if run_id is None:
        return
    host = socket.gethostname()
    worker = getattr(getattr(task, "request", None), "hostname", None) or host
    stop = threading.Event()
    _beating[str(getattr(getattr(task, "request", None), "id", run_id))] = stop
    threading.Thread(
        target=_beat,
        args=(task.backend, run_id, worker, stop),
        name=f"heartbeat-{run_id}",
        daemon=True,
    ).start()
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        if run is None:
            return
        instance.add_run_tags(run_id, {WORKER_HOST_TAG: host})
        instance.report_engine_event(
            f"Run executing on worker host {host} (Celery worker {worker})", run
        )


@task_postrun.connect
def stop_heartbeat(task_id: str | None = None, **_: Any) -> None:
    stop = _beating.pop(str(task_id), None)
    if stop is not None:
        stop.set()
