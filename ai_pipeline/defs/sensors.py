"""The sensors: new inbox files and tasks submitted over HTTP become documents and range runs;
documents whose run is over are moved out of RUNNING, and a failed run's unfinished documents
shown FAILED; a nightly backfill's end brings the failure report.

The inbox sensor lists the inbox and reads only the files that arrived after its cursor, so a
tick's cost grows with the new files, not with the documents already processed. A file whose
content is already a partition (a copy under another name) is recorded as an alias and launches
nothing. Its interval is read when the code location loads (``AI_PIPELINE_SENSOR_INTERVAL``), so
the sensor is built by ``build_inbox_sensor`` in ``ai_pipeline.definitions``.
"""

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from ai_pipeline.defs.acceleration import backfill_acceleration, names_documents
from ai_pipeline.defs.backfill_planner import PLANNER_INTERVAL_SECONDS, plan_new_backfills
from ai_pipeline.defs.backfills import backfill_ended, run_size_for
from ai_pipeline.defs.jobs import DOCUMENTS_PER_BACKFILL_RUN, range_run_request
from ai_pipeline.defs.partitions import missing_partitions, naming_config
from ai_pipeline.defs.replan import (
    release_missed_retries,
    replan_open_backfills,
    replan_requests,
)
from ai_pipeline.defs.resources import PipelineSettings, ResultsStore
from ai_pipeline.defs.run_ends import mark_ended_runs
from ai_pipeline.defs.schedules import NIGHTLY_TAG
from ai_pipeline.defs.site import ANALYSIS_TAG, DEFAULT_SITE, Site
from ai_pipeline.documents import display_path
from ai_pipeline.inbox import InboxCursor, scan_inbox
from ai_pipeline.intake import batches, contiguous_ranges, register_files, unique_in_order
from ai_pipeline.reconcile import reconcile
from ai_pipeline.reporting import current_task_suffix
from ai_pipeline.review import WEB_REVIEWER
from ai_pipeline.states import State
from ai_pipeline.store.rows import ReviewStatus
from ai_pipeline.tasks import ANALYSE_STEP, task_id

# A submitted task waits at most this long for its run to be requested.
SUBMISSIONS_INTERVAL_SECONDS = 5


def _in_partition_order(
    instance: dg.DagsterInstance, site: Site, document_ids: set[str]
) -> list[str]:
    """Documents that are partitions already, in partition order (a range run's range is)."""
    if not document_ids:
        return []
    return [k for k in instance.get_dynamic_partitions(site.partitions) if k in document_ids]


def _resources(site: Site, *names: str) -> dict[str, Any]:
    return {"required_resource_keys": {site.name(n) for n in names}}


def _resource(context: Any, site: Site, name: str) -> Any:
    return getattr(context.resources, site.name(name))


def build_sensors(site: Site, inbox_interval_seconds: int) -> list[dg.SensorDefinition]:
    """The sensors of ``site``'s analysis: its inbox, its submissions and approvals over HTTP, the
    reconciler of its runs, and the report after its nightly backfill."""
    return [
        build_inbox_sensor(inbox_interval_seconds, site),
        build_submissions_sensor(site),
        build_approvals_sensor(site),
        build_reconcile_sensor(site),
        build_nightly_report_sensor(site),
        build_backfill_planner_sensor(site),
    ]


def build_inbox_sensor(interval_seconds: int, site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    @dg.sensor(
        name=site.name("inbox_sensor"),
        job_name=site.job_name,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers new files of the inbox (AI_PIPELINE_INBOX) and launches range runs.",
        **_resources(site, "settings", "results_store"),
    )
    def inbox_sensor(
        context: dg.SensorEvaluationContext, **_resources: Any
    ) -> dg.SensorResult | dg.SkipReason:
        return _inbox_tick(
            context,
            site,
            _resource(context, site, "settings"),
            _resource(context, site, "results_store"),
        )

    return inbox_sensor


def _inbox_tick(
    context: dg.SensorEvaluationContext,
    site: Site,
    settings: PipelineSettings,
    results_store: ResultsStore,
) -> dg.SensorResult | dg.SkipReason:
    config = settings.resolve()
    if not config.inbox:
        return dg.SkipReason("no inbox configured: set AI_PIPELINE_INBOX or the inbox setting")
    if not os.path.isdir(config.inbox):
        return dg.SkipReason(f"inbox {config.inbox} does not exist")
    scan = scan_inbox(
        config.inbox,
        InboxCursor.parse(context.cursor),
        settle_seconds=config.settle_seconds,
        limit=config.sensor_max_files,
    )
    if scan.more:
        context.log.info(
            f"{scan.more} more new entries than AI_PIPELINE_SENSOR_MAX_FILES="
            f"{config.sensor_max_files}: left for the next ticks"
        )
    for entry in scan.skipped:
        context.log.warning(f"skipped {entry.path}: {entry.reason}")
    if not scan.paths:
        if scan.skipped:
            return dg.SensorResult(
                cursor=scan.cursor.serialize(),
                skip_reason=dg.SkipReason(
                    f"{len(scan.skipped)} new entries in {config.inbox}, none a document"
                ),
            )
        return dg.SkipReason(f"no new files in {config.inbox}")
    store = results_store.get()
    # Files that count as new only because a folder above them changed are read only if their path
    # was never registered: a folder that gains a file is not read again whole.
    known = store.documents.known_sources(display_path(p) for p in scan.revisited)
    paths = [p for p in scan.paths if not (p in scan.revisited and display_path(p) in known)]
    if not paths:
        return dg.SensorResult(
            cursor=scan.cursor.serialize(),
            skip_reason=dg.SkipReason(f"no new files in {config.inbox} (a folder changed)"),
        )
    registered = register_files(store, paths, max_bytes=config.max_document_bytes)
    missing = missing_partitions(
        context.instance, [r.document_id for r in registered], site.partitions
    )
    # New to this analysis: not yet a partition, or a partition another analysis of the location
    # added (they share it) whose content this analysis's store had never seen.
    first_seen = unique_in_order(r.document_id for r in registered if r.new)
    shared = set(first_seen) - set(missing)
    new_ids = [*_in_partition_order(context.instance, site, shared), *missing]
    aliases = len(registered) - len(new_ids)
    context.log.info(
        f"{len(paths)} new files: {len(new_ids)} new documents, {aliases} already known"
    )
    for r in registered:
        if r.rejected_reason:
            task = task_id(
                r.document_id, ANALYSE_STEP, config.declaration.tag(), config.analysis_model
            )
            context.log.warning(
                f"[TASK:{task}] {r.source}: {r.rejected_reason} (it will fail as "
                "INPUT_QUALITY_ISSUE)"
            )
    if not new_ids:
        return dg.SensorResult(
            cursor=scan.cursor.serialize(),
            skip_reason=dg.SkipReason(f"{aliases} files with content already known"),
        )
    store.documents.queue(new_ids)
    size = run_size_for(context.instance, len(new_ids), config, config.documents_per_run)
    if names_documents(context.instance):
        ranges = batches(new_ids, size)
    else:
        # A range covers every document of it: partitions another analysis added (shared ones)
        # go in ranges of their own that hold none of that analysis's documents.
        ordered = context.instance.get_dynamic_partitions(site.partitions)
        ranges = contiguous_ranges(shared, ordered, size) + batches(missing, size)
    return dg.SensorResult(
        run_requests=[
            range_run_request(
                batch,
                prefix="inbox",
                job_name=site.job_name,
                # Partitions another analysis added: the range may hold others of its documents.
                run_config=naming_config(batch, site.op) if shared & set(batch) else None,
            )
            for batch in ranges
        ],
        dynamic_partitions_requests=[site.partitions_def.build_add_request(missing)]
        if missing
        else [],
        cursor=scan.cursor.serialize(),
    )


def build_submissions_sensor(site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    return _serving_sensor(
        site,
        "submissions_sensor",
        "Launches the tasks submitted over HTTP (ai-pipeline serve): new partitions and range "
        "runs, in the order they came.",
        ("settings", "results_store"),
        _submissions_tick,
    )


def build_approvals_sensor(site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    return _serving_sensor(
        site,
        "approvals_sensor",
        "Re-submits, under their task ids, the items approved on the review page "
        "(ai-pipeline serve).",
        ("results_store",),
        _approvals_tick,
    )


def _serving_sensor(
    site: Site,
    name: str,
    description: str,
    resources: Sequence[str],
    tick: Callable[..., dg.SensorResult | dg.SkipReason],
) -> dg.SensorDefinition:
    """A sensor of ``site``'s job that picks up what ``ai-pipeline serve`` took in, every
    ``SUBMISSIONS_INTERVAL_SECONDS``: ``tick(context, site, *resources)``."""

    @dg.sensor(
        name=site.name(name),
        job_name=site.job_name,
        minimum_interval_seconds=SUBMISSIONS_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
        **_resources(site, *resources),
    )
    def serving_sensor(
        context: dg.SensorEvaluationContext, **_resources: Any
    ) -> dg.SensorResult | dg.SkipReason:
        return tick(context, site, *(_resource(context, site, r) for r in resources))

    return serving_sensor


def _approvals_tick(
    context: dg.SensorEvaluationContext, site: Site, results_store: ResultsStore
) -> dg.SensorResult | dg.SkipReason:
    store = results_store.get()
    approved = [
        i
        for i in store.reviews.items(ReviewStatus.APPROVED)
        if (i.decided_by or "").startswith(WEB_REVIEWER)
    ]
    docs = {d.document_id: d for d in store.documents.rows([i.document_id for i in approved])}
    # An approved document whose task was cancelled since is never run again: its item is
    # closed, once, rather than re-submitted (and logged) every tick.
    for i in approved:
        doc = docs.get(i.document_id)
        if doc is not None and doc.state == State.CANCELLED and store.reviews.cancel(i.document_id):
            context.log.info(f"[TASK:{i.task_id}] approved, then cancelled: not re-submitted")
    # One run per approval (its time is in the key); none while the document is being analysed.
    requests = [
        dg.RunRequest(
            run_key=f"approved:{i.document_id}:{i.updated_at.isoformat()}",
            job_name=site.job_name,
            partition_key=i.document_id,
        )
        for i in approved
        if i.document_id in docs
        and docs[i.document_id].state not in (State.RUNNING, State.COMPLETED, State.CANCELLED)
    ]
    if not requests:
        return dg.SkipReason("no approval from the review page waits for its run")
    launched = {r.partition_key for r in requests}
    for i in approved:
        if i.document_id in launched:
            context.log.info(f"[TASK:{i.task_id}] approved by {i.decided_by}: re-submitted")
    return dg.SensorResult(run_requests=requests)


def _submissions_tick(
    context: dg.SensorEvaluationContext,
    site: Site,
    settings: PipelineSettings,
    results_store: ResultsStore,
) -> dg.SensorResult | dg.SkipReason:
    config = settings.resolve()
    store = results_store.get()
    seen = int(context.cursor or 0)
    tasks = store.tasks.after(seen, config.sensor_max_files)
    if not tasks:
        return dg.SkipReason("no new submitted task")
    ids = [t.document_id for t in tasks]
    new_ids = missing_partitions(context.instance, ids, site.partitions)
    # Partitions already there whose task never ran (a tick that added them and then failed
    # before its cursor was saved): one run each, keyed so that a second request is dropped.
    known = set(ids) - set(new_ids)
    waiting = [
        d.document_id
        for d in (store.documents.rows(known) if known else [])
        if d.state in (State.PENDING, State.QUEUED)
    ]
    store.documents.queue(new_ids)
    context.log.info(f"{len(tasks)} submitted tasks: {len(new_ids)} new documents")
    return dg.SensorResult(
        run_requests=[
            *(
                range_run_request(batch, prefix="api", job_name=site.job_name)
                for batch in batches(
                    new_ids,
                    run_size_for(context.instance, len(new_ids), config, config.documents_per_run),
                )
            ),
            *(
                dg.RunRequest(run_key=f"api:{d}", job_name=site.job_name, partition_key=d)
                for d in waiting
            ),
        ],
        dynamic_partitions_requests=[site.partitions_def.build_add_request(new_ids)]
        if new_ids
        else [],
        cursor=str(tasks[-1].seq),
    )


def build_nightly_report_sensor(site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    @dg.sensor(
        name=site.name("nightly_report_sensor"),
        job_name=site.report_job_name,
        # One query a tick; the report follows the backfill's end by at most this much.
        minimum_interval_seconds=20,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Builds the failure report once a nightly retry backfill has ended.",
    )
    def nightly_report_sensor(
        context: dg.SensorEvaluationContext,
    ) -> dg.SensorResult | dg.SkipReason:
        # The nightly backfills of this analysis (its schedule tags them with its name).
        name = site.declaration.name
        requests = [
            dg.RunRequest(
                run_key=f"report-after-{b.backfill_id}", tags={NIGHTLY_TAG: b.tags[NIGHTLY_TAG]}
            )
            for b in context.instance.get_backfills(limit=50)
            if NIGHTLY_TAG in b.tags
            and b.tags.get(ANALYSIS_TAG, name) == name
            and backfill_ended(b)
        ]
        if not requests:
            return dg.SkipReason("no nightly backfill has ended")
        return dg.SensorResult(run_requests=requests)

    return nightly_report_sensor


def run_statuses(instance: dg.DagsterInstance) -> Callable[[Sequence[str]], Mapping[str, str]]:
    """What ``ai_pipeline.reconcile`` asks of Dagster: the status of each of these runs."""

    def lookup(run_ids: Sequence[str]) -> Mapping[str, str]:
        if not run_ids:
            return {}
        runs = instance.get_runs(filters=dg.RunsFilter(run_ids=list(run_ids)))
        return {r.run_id: r.status.value for r in runs}

    return lookup


def build_reconcile_sensor(site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    @dg.sensor(
        name=site.name("reconcile_sensor"),
        minimum_interval_seconds=20,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Moves documents out of RUNNING whose run is over (a killed worker, a run "
        "terminated from the UI): FAILED with RUN_INTERRUPTED, retryable; shows FAILED in "
        "Dagster the documents a failed run never finished; and retries a failed run whose "
        "automatic retry the daemon missed.",
        **_resources(site, "results_store"),
    )
    def reconcile_sensor(context: dg.SensorEvaluationContext, **_resources: Any) -> dg.SkipReason:
        return _reconcile_tick(context, site, _resource(context, site, "results_store"))

    return reconcile_sensor


def _reconcile_tick(
    context: dg.SensorEvaluationContext, site: Site, results_store: ResultsStore
) -> dg.SkipReason:
    store = results_store.get()
    interrupted = reconcile(store, run_statuses(context.instance))
    for i in interrupted:
        context.log.warning(f"{i.document_id}: RUN_INTERRUPTED: {i.reason}")
    marked, cursor = mark_ended_runs(context.instance, store, context.cursor, site=site)
    for run_id, documents in marked.items():
        context.log.warning(
            f"run {run_id} ended before {len(documents)} of its documents: shown FAILED "
            f"({', '.join(documents[:5])}{', …' if len(documents) > 5 else ''})"
        )
    if cursor != context.cursor:
        context.update_cursor(cursor)
    acceleration = backfill_acceleration(context.instance)
    if acceleration is not None:
        for run_id in acceleration.retry_missed(context.instance, site):
            context.log.warning(f"run {run_id} failed and Dagster missed its retry: retried now")
    else:
        for run_id in release_missed_retries(context.instance, site):
            context.log.warning(
                f"run {run_id} failed and Dagster missed its retry: its backfill no longer waits "
                "for it; its documents wait, FAILED and retryable, for backfill --failed"
            )
    unfinished = sum(map(len, marked.values()))
    return dg.SkipReason(
        f"{len(interrupted)} documents moved out of RUNNING: their run was over; "
        f"{unfinished} unfinished documents of ended runs shown FAILED"
        if interrupted or unfinished
        else "no document is RUNNING in a run that is over"
    )


def build_backfill_planner_sensor(site: Site = DEFAULT_SITE) -> dg.SensorDefinition:
    @dg.sensor(
        name=site.name("backfill_planner"),
        job_name=site.job_name,
        minimum_interval_seconds=PLANNER_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Runs a backfill's documents in runs of the product's run size whatever "
        "their positions, not one run per stretch of contiguous documents: the runs Dagster "
        "planned are replaced while they wait in the queue (and, with the accelerator, a "
        "backfill launched from the UI is planned before Dagster plans it).",
        **_resources(site, "settings", "results_store"),
    )
    def backfill_planner(context: dg.SensorEvaluationContext, **_resources: Any) -> dg.SensorResult:
        return _planner_tick(
            context,
            site,
            _resource(context, site, "settings"),
            _resource(context, site, "results_store"),
        )

    return backfill_planner


def _planner_tick(
    context: dg.SensorEvaluationContext,
    site: Site,
    settings: PipelineSettings,
    results_store: ResultsStore,
) -> dg.SensorResult:
    instance = context.instance
    cursor = json.loads(context.cursor) if context.cursor else {}
    store = results_store.get()
    lines = []
    acceleration = backfill_acceleration(instance)
    _say_once(context, site, instance, acceleration is not None)
    asset_graph = context.repository_def.asset_graph  # type: ignore[union-attr]
    if acceleration is not None:
        planned, cursor["created"] = plan_new_backfills(
            instance, asset_graph, site, cursor.get("created"), acceleration
        )
        started = acceleration.start_planned_runs(instance, [p.backfill_id for p in planned], site)
        lines += [
            f"backfill {p.backfill_id}: {p.documents} documents in {p.runs} runs instead of "
            f"Dagster's {p.dagster_runs}"
            for p in planned
        ]
        if planned:
            lines.append(f"{started} runs started now, the rest on the daemon's next loop")
    suffix = current_task_suffix(settings.resolve(), store.analysis)
    policy = asset_graph.get(site.keys[0]).backfill_policy
    policy_size = (policy.max_partitions_per_run if policy else None) or DOCUMENTS_PER_BACKFILL_RUN
    for done in replan_open_backfills(instance, store, site, suffix, policy_size):
        lines.append(done.describe())
    new, cursor["replans"] = replan_requests(instance, store, site, int(cursor.get("replans", 0)))
    for line in lines:
        context.log.info(line)
    return dg.SensorResult(
        run_requests=new,
        cursor=json.dumps(cursor),
        skip_reason=None if new else dg.SkipReason("; ".join(lines) or "no backfill to plan"),
    )


_said: set[str] = set()


def _say_once(
    context: dg.SensorEvaluationContext, site: Site, instance: dg.DagsterInstance, fast: bool
) -> None:
    """Say in the daemon's log, once per process, which way backfills are planned here."""
    if site.name("") in _said:
        return
    _said.add(site.name(""))
    if fast:
        context.log.info(
            "the accelerator is on: backfills are planned by this package, runs name their "
            "documents, and a UI backfill is planned before Dagster plans it"
        )
    else:
        context.log.info(
            "Dagster's own storage: Dagster plans each backfill's runs and this sensor replaces "
            "those still queued by fewer; "
            + (
                "runs name their documents"
                if names_documents(instance)
                else "a run covers every document of its range (those done are re-reported "
                "from their checkpoints, no call)"
            )
        )


# The product's own code location's (``ai_pipeline.definitions`` builds its own).
submissions_sensor = build_submissions_sensor()
approvals_sensor = build_approvals_sensor()
reconcile_sensor = build_reconcile_sensor()
nightly_report_sensor = build_nightly_report_sensor()
backfill_planner = build_backfill_planner_sensor()
