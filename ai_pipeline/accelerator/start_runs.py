"""A launched backfill's runs started at once, instead of on the backfill daemon's next loop.

Dagster's backfill daemon looks at its backfills every 30 s, a constant of dagster 1.13 and no
setting. A backfill this package launches has its runs planned already (``backfills``), in the
state the daemon writes before it submits runs it planned itself; on its next loop the daemon
resumes that state and submits them. Until then a batch waits, 15 s on average, which is a
quarter of the LLM time of a 1,000-document batch and most of a small rerun's.

``start_planned_runs`` submits the first wave of those runs now (as many as the run queue starts at
once), the way the daemon would, through Dagster's own ``submit_asset_run``, under the run ids the
backfill reserved for them. On its next loop the daemon meets runs that already exist under those
ids and skips them ("already submitted on a previously interrupted tick"), and submits the rest, so
each planned run exists once whoever submits it first; a run the daemon created in the meantime is
left as it is.

A run names the code location it comes from, and the run queue launches it through the daemon's
location of that name: a wrong name fails the run. So the location is the one the daemon itself is
running now, read from the state of this analysis's reconcile sensor or backfill planner (sensors
that tick every 20 s and every 2 s wherever the daemon runs the code): its name and the target it
loads (module, working directory, Python), loaded here in this process. The planner's own state is
marked before each of its ticks, so the planner finds its location even in the daemon's first
seconds, before the reconcile sensor has ticked. Without such a sensor state that ticked within
``LIVE_SECONDS`` (no daemon running, or its sensors stopped), or if the target does not load here,
nothing is started and the daemon submits the runs on its next loop, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import dagster as dg

from ai_pipeline.accelerator.internals import (
    BACKFILL_ID_TAG,
    DagsterRunAlreadyExists,
    InProcessCodeLocationOrigin,
    InProcessWorkspaceLoadTarget,
    InstigatorType,
    WorkspaceProcessContext,
    submit_asset_run,
)
from ai_pipeline.defs.dagster_private import loaded_against
from ai_pipeline.defs.site import DEFAULT_SITE, Site

log = logging.getLogger(__name__)

# A sensor state whose last tick began longer ago than this is not taken for the running daemon's
# (the reconcile sensor ticks every 20 s; a loaded daemon may run late).
LIVE_SECONDS = 120.0

# The site's sensors whose states say where the daemon runs its code: both run wherever it does.
LIVE_SENSORS = ("reconcile_sensor", "backfill_planner")


def daemon_location(
    instance: dg.DagsterInstance, site: Site = DEFAULT_SITE, *, now: float | None = None
) -> Any | None:
    """The code location origin the running daemon evaluates ``site``'s sensors from: the one
    where one of ``LIVE_SENSORS`` began a tick most recently, within ``LIVE_SECONDS``; None when
    none did."""
    now = time.time() if now is None else now
    names = {site.name(sensor) for sensor in LIVE_SENSORS}
    latest, found = now - LIVE_SECONDS, None
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name not in names:
            continue
        began = getattr(state.instigator_data, "last_tick_start_timestamp", None) or 0.0
        if began >= latest:
            latest, found = began, state.origin.repository_origin.code_location_origin
    return found


def start_planned_runs(
    instance: dg.DagsterInstance, backfill_ids: Sequence[str], site: Site = DEFAULT_SITE
) -> int:
    """Submit the first wave of these backfills' planned runs now (see the module's docstring):
    as many as the run queue starts at once (``max_concurrent_runs``; all of them with no limit),
    in order; the daemon submits the rest on its next loop, while those work (creating a run
    costs seconds for thousands of documents, and the command should not spend minutes on runs
    that would only wait in the queue). Returns how many runs this call submitted (0: all left to
    the daemon's next loop)."""
    backfills = [instance.get_backfill(b) for b in backfill_ids]
    planned = [b for b in backfills if b is not None and b.submitting_run_requests]
    if not planned:
        return 0
    queue = instance.get_concurrency_config().run_queue_config
    wave = queue.max_concurrent_runs if queue is not None else None
    try:
        with daemon_workspace(instance, site) as context:
            if context is None:
                return 0
            return asyncio.run(_submit(instance, context, planned, wave))
    except Exception as e:  # whatever this leaves undone, the daemon does on its next loop
        log.info("runs left to the daemon's next loop: %s", e)
        return 0


@contextmanager
def daemon_workspace(instance: dg.DagsterInstance, site: Site = DEFAULT_SITE) -> Iterator[Any]:
    """A ``WorkspaceProcessContext`` holding the code location the running daemon evaluates
    ``site``'s sensors from (``daemon_location``), loaded in this process under the daemon's
    name for it; None when no daemon ran lately or the location does not load here."""
    origin = daemon_location(instance, site)
    if origin is None:
        yield None
        return
    target = InProcessWorkspaceLoadTarget(
        InProcessCodeLocationOrigin(
            loadable_target_origin=origin.loadable_target_origin,
            location_name=origin.location_name,
        )
    )
    # Loaded against this instance's defs state storage, not one a context variable may still
    # name from an instance gone since (its load then fails: "undefined DagsterInstance weakref").
    with loaded_against(instance, lambda: WorkspaceProcessContext(instance, target)) as context:
        if context.create_request_context().has_code_location_error(origin.location_name):
            log.info("code location %s does not load here", origin.location_name)
            yield None
        else:
            yield context


async def _submit(
    instance: dg.DagsterInstance, context: Any, backfills: Sequence[Any], most: int | None
) -> int:
    submitted, cache = 0, {}  # type: ignore[var-annotated]
    for backfill in backfills:
        pairs = zip(backfill.submitting_run_requests, backfill.reserved_run_ids, strict=True)
        for index, (request, run_id) in enumerate(pairs):
            if most is not None and submitted >= most:
                return submitted
            if instance.get_run_by_id(run_id) is not None:
                continue  # submitted already (by the daemon, or a submit before this one)
            # The tags the daemon gives a backfill's runs.
            tags = {**request.tags, **backfill.tags, BACKFILL_ID_TAG: backfill.backfill_id}
            try:
                await submit_asset_run(
                    run_id,
                    request._replace(tags=tags),
                    index,
                    instance,
                    context,
                    context.create_request_context(),
                    cache,
                    {},
                    log,
                )
            except DagsterRunAlreadyExists:
                continue  # the daemon created it in the same instant
            submitted += 1
    return submitted
