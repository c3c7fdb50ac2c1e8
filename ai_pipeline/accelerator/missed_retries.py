"""Dagster's automatic retry of a failed run, made up for when its daemon missed the failure.

Dagster 1.13 stores a run's failure event before it updates the run's status and sets its
``dagster/will_retry`` tag (``handle_new_event``). The daemon's event-log consumer reads new
failure events every 5 s and retries the runs they name that are FAILURE and marked to retry; one
that reads the event inside that gap finds the run still STARTING or STARTED, passes over it, and
moves its cursor past the event for good. The run then says it will be retried and never is, and
its backfill waits for that retry for ever ("will be retried, but retries have not been
launched"). It happened here under load, a run failed by the run monitor as the daemon started.

``retry_missed`` retries such runs (``replan.missed_retries``, the query Dagster's own storage
path uses to release them) the daemon's way (``retry_failed_run``: from failure, tagged as its
retry, only if the daemon's rules still say so), from the code location the daemon runs
(``start_runs.daemon_workspace``), once the failure is ``MISSED_RETRY_SECONDS`` old: the consumer
would have retried it long before. The reconcile sensor calls it every tick; a run the
daemon did retry carries the retry's id in ``dagster/auto_retry_run_id`` and is not looked at,
and one the daemon's rules no longer retry (its backfill over) is marked ``will_retry`` false, as
the daemon marks a run it gives up on, so that no tick asks again (each asking writes an event).
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from ai_pipeline.accelerator.internals import WILL_RETRY_TAG
from ai_pipeline.accelerator.start_runs import daemon_workspace
from ai_pipeline.defs.replan import missed_retries
from ai_pipeline.defs.site import DEFAULT_SITE, Site


def retry_missed(
    instance: dg.DagsterInstance, site: Site = DEFAULT_SITE, *, now: float | None = None
) -> list[str]:
    """Retry ``missed_retries`` from the daemon's code location; the ids of the runs retried
    (none without a daemon that ran lately: the daemon's consumer then has not looked yet)."""
    runs = missed_retries(instance, now=now)
    if not runs:
        return []
    retried = []
    with daemon_workspace(instance, site) as context:
        if context is None:
            return []
        for run in runs:
            if retry_failed_run(run, context):
                retried.append(run.run_id)
            else:  # the daemon's rules say no (its backfill is over): not looked at again
                instance.add_run_tags(run.run_id, {WILL_RETRY_TAG: "false"})
    return retried


def retry_failed_run(run: dg.DagsterRun, context: Any) -> bool:
    """Retry the failed ``run`` as the daemon's automatic retry does (from failure, tagged as its
    retry, once whatever calls it), if the daemon's rules say it should be (``dagster/will_retry``
    true, its backfill not over); whether they did. ``context``: a ``WorkspaceProcessContext``."""
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import retry_run, should_retry

    if not should_retry(run, context.instance):
        return False
    retry_run(run, context)
    return True
