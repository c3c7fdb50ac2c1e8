"""A document's story with what the Dagster instance holds of it: what the results database
holds (``ai_pipeline.trace``), each of its runs (status, start, end) and every check evaluated
on its partition, in time order. What the CLI's ``trace`` shows, through ``Launcher.trace``."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import dagster as dg

from ai_pipeline.store import Store
from ai_pipeline.trace import trace


def trace_with_runs(instance: dg.DagsterInstance, store: Store, any_id: str) -> dict[str, Any]:
    """A document's story (``ai_pipeline.trace``) with what Dagster holds of it: each of its
    runs (status, start, end) and every check evaluated on its partition."""
    story = trace(store, any_id)
    document_id = story["document_id"]
    events = story["events"]
    runs = []
    # Dagster refuses a filter on an empty list of runs (a document never run yet).
    records = (
        instance.get_run_records(dg.RunsFilter(run_ids=story["runs"])) if story["runs"] else []
    )
    for record in records:
        run = record.dagster_run
        runs.append({"run_id": run.run_id, "status": run.status.value})
        for at, what in ((record.start_time, "started"), (record.end_time, "ended")):
            if at is not None:
                detail = f"run {what}" + (f": {run.status.value}" if what == "ended" else "")
                events.append(_at(at, "run", detail, run_id=run.run_id))
        checks = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, limit=100_000
        ).records
        for entry in (c.event_log_entry for c in checks):
            event = entry.dagster_event
            evaluation = event.event_specific_data if event else None
            if (
                not isinstance(evaluation, dg.AssetCheckEvaluation)
                or evaluation.partition != document_id
            ):
                continue
            verdict = "passed" if evaluation.passed else "FAILED"
            events.append(
                _at(
                    entry.timestamp,
                    "check",
                    f"{evaluation.check_name}: {verdict}",
                    run_id=run.run_id,
                    passed=evaluation.passed,
                )
            )
    events.sort(key=lambda e: e["at"])
    story["dagster_runs"] = runs
    return story


def _at(timestamp: float, kind: str, detail: str, **fields: Any) -> dict[str, Any]:
    at = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return {"at": at.isoformat(), "kind": kind, "detail": detail, **fields}
