"""The inbox sensor: new files become documents (partitions) and range runs of up to N of them.

A tick lists the inbox and reads only the files that arrived after its cursor, so its cost grows with
the new files, not with the documents already processed. A file whose content is already a
partition (a copy under another name) is recorded as an alias and launches nothing.
"""

import os

import dagster as dg

from ai_pipeline.defs.jobs import analysis_job, range_run_request
from ai_pipeline.defs.partitions import PARTITIONS_NAME, documents_partitions
from ai_pipeline.defs.resources import PipelineSettings, ResultsStore
from ai_pipeline.documents import InboxCursor, scan_inbox
from ai_pipeline.intake import batches, register_files, unique_in_order
from ai_pipeline.pipeline import ANALYSE_STEP, task_id
from ai_pipeline.prompts import ANALYSIS
from ai_pipeline.states import State

SENSOR_INTERVAL_SECONDS = int(os.environ.get("AI_PIPELINE_SENSOR_INTERVAL", "30"))


@dg.sensor(
    job=analysis_job,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Registers new files of the inbox (AI_PIPELINE_INBOX) and launches range runs.",
)
def inbox_sensor(
    context: dg.SensorEvaluationContext, settings: PipelineSettings, results_store: ResultsStore
) -> dg.SensorResult | dg.SkipReason:
    config = settings.resolve()
    if not config.inbox:
        return dg.SkipReason("no inbox configured: set AI_PIPELINE_INBOX or the inbox setting")
    if not os.path.isdir(config.inbox):
        return dg.SkipReason(f"inbox {config.inbox} does not exist")
    scan = scan_inbox(
        config.inbox, InboxCursor.parse(context.cursor), settle_seconds=config.settle_seconds
    )
    if not scan.paths:
        return dg.SkipReason(f"no new files in {config.inbox}")
    store = results_store.get()
    # Files that count as new only because a folder above them changed are read only if their path
    # was never registered: a folder that gains a file is not read again whole.
    known = store.known_sources(str(p) for p in scan.revisited)
    paths = [p for p in scan.paths if not (p in scan.revisited and str(p) in known)]
    if not paths:
        return dg.SensorResult(
            cursor=scan.cursor.serialize(),
            skip_reason=dg.SkipReason(f"no new files in {config.inbox} (a folder changed)"),
        )
    registered = register_files(store, paths, max_bytes=config.max_document_bytes)
    new_ids = unique_in_order(
        r.document_id
        for r in registered
        if not context.instance.has_dynamic_partition(PARTITIONS_NAME, r.document_id)
    )
    aliases = len(registered) - len(new_ids)
    context.log.info(
        f"{len(paths)} new files: {len(new_ids)} new documents, {aliases} already known"
    )
    for r in registered:
        if r.rejected_reason:
            task = task_id(r.document_id, ANALYSE_STEP, ANALYSIS.version, config.model)
            context.log.warning(
                f"[TASK:{task}] {r.source}: {r.rejected_reason} (it will fail as "
                "INPUT_QUALITY_ISSUE)"
            )
    if not new_ids:
        return dg.SensorResult(
            cursor=scan.cursor.serialize(),
            skip_reason=dg.SkipReason(f"{aliases} files with content already known"),
        )
    for document_id in new_ids:
        if store.get_document(document_id)["state"] == State.PENDING.value:  # type: ignore[index]
            store.transition(document_id, State.QUEUED)
    return dg.SensorResult(
        run_requests=[
            range_run_request(batch, prefix="inbox")
            for batch in batches(new_ids, config.documents_per_run)
        ],
        dynamic_partitions_requests=[documents_partitions.build_add_request(new_ids)],
        cursor=scan.cursor.serialize(),
    )
