"""What a worker host of dagster-celery's ``CeleryRunLauncher`` adds to each run it executes.

Imported by the Celery worker only (``deploy/scale-out/worker.sh`` passes ``-i
ai_pipeline.defs.celery_worker``), never by the code location: when a run's task starts in one of
the worker's pool processes, the run gets the tag ``ai_pipeline/worker_host`` (the host's name, as
the UI's run list shows and filters it) and an engine event in its event log saying which host and
Celery worker ran it. Nothing else about the run changes: the task itself is dagster-celery's.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import dagster as dg
from celery.signals import task_prerun

WORKER_HOST_TAG = "ai_pipeline/worker_host"
# dagster-celery's task that executes a whole run (dagster_celery.config.TASK_EXECUTE_JOB_NAME).
EXECUTE_JOB_TASK = "execute_job"


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
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        if run is None:
            return
        instance.add_run_tags(run_id, {WORKER_HOST_TAG: host})
        instance.report_engine_event(
            f"Run executing on worker host {host} (Celery worker {worker})", run
        )
