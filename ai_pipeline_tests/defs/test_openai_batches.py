"""The Batch API sensor (``build_openai_batch_sensor``), its function called with
``build_sensor_context``: it follows open jobs, launches runs for what they answered, and sends
failed lines into a new job."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.defs.dagster_private import repository_of
from ai_pipeline.defs.jobs import range_tags
from ai_pipeline.defs.openai_batches import JOB_TAG, VIA_TAG, build_openai_batch_sensor
from ai_pipeline.defs.relaunch import BATCH_API, submit_batch
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.defs.schedules import build_nightly_retry_schedule
from ai_pipeline.defs.site import DEFAULT_SITE
from ai_pipeline.intake import register_files
from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.openai_batch.operations import batch_client
from ai_pipeline.openai_batch.planning import plan
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.settings import Settings
from ai_pipeline.spend import Prices
from ai_pipeline.states import State
from ai_pipeline.store.openai_batch_rows import LineState
from ai_pipeline_tests.dagster_procs import DagsterProcess, running, wait_for
from ai_pipeline_tests.support import (
    TEST_API_KEY,
    TEST_MODEL,
    cli,
    launcher,
    make_inbox,
    process_inbox,
    results_store,
    run_cli,
    sample_text,
    task_of,
)


def tick(instance: dg.DagsterInstance) -> dg.SensorResult | dg.SkipReason:
    from ai_pipeline.definitions import defs

    context = dg.build_sensor_context(
        instance=instance,
        resources={
            "settings": PipelineSettings(documents_per_run=10),
            "results_store": ResultsStore(),
            "llm": LLMResource(api_key=TEST_API_KEY),
        },
        repository_def=repository_of(defs, instance),
    )
    return build_openai_batch_sensor()(context)


def backfilled(instance: dg.DagsterInstance, since: int = 0) -> list[list[str]]:
    """The documents of each backfill launched for a Batch API job, oldest first, from the
    ``since``-th on."""
    jobs = [b for b in instance.get_backfills() if JOB_TAG in b.tags]
    jobs.sort(key=lambda b: b.backfill_timestamp)
    return [sorted(b.asset_backfill_data.target_subset.partitions_subsets_by_asset_key[
        DEFAULT_SITE.key("llm_analysis")].get_partition_keys()) for b in jobs[since:]]  # fmt: skip


def test_the_sensor_follows_jobs_and_launches_runs_for_what_they_answered(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """One tick sends, polls and ingests a job, adds the answered documents as partitions with
    one backfill over them, and puts the line that failed retryably into a new job; the next
    tick answers it and launches its backfill; then nothing is left to do."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(4)})
    store = results_store()
    ids = [r.document_id for r in register_files(store, sorted(inbox.iterdir()), max_bytes=10**6)]
    limited = task_of(ids[0])
    simulator.set_faults([{"kind": "status", "status": 429, "match": limited, "times": 1}])
    (job,) = plan(store, ids, TEST_MODEL).jobs
    assert {line.task_id for line in store.openai_batches.lines(job.intent_id)} >= {limited}

    assert isinstance(tick(instance), dg.SkipReason)  # no run: a backfill
    assert backfilled(instance) == [sorted(ids[1:])]
    assert set(ids[1:]) <= set(instance.get_dynamic_partitions(DEFAULT_SITE.partitions))
    (retry,) = store.openai_batches.unfinished()
    assert [line.task_id for line in store.openai_batches.lines(retry.intent_id)] == [limited]

    assert isinstance(tick(instance), dg.SkipReason)
    assert backfilled(instance, since=1) == [[ids[0]]]
    assert store.openai_batches.lines(retry.intent_id)[0].state == LineState.ANSWERED
    assert isinstance(tick(instance), dg.SkipReason)
    assert len(backfilled(instance)) == 2, "nothing launched twice"
    assert simulator.calls_to("batches.create") == 2 and simulator.stats()["total"] == 0


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_task_given_up_on_gets_an_ordinary_run(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path, backend: str
) -> None:
    """A line refused for good (400) is not batched again: its document gets an ordinary run
    (here a new partition's range run), where the synchronous path classifies it."""
    inbox = make_inbox(tmp_path / "inbox", {"doc.txt": sample_text(7)})
    store = results_store()
    (doc,) = [r.document_id for r in register_files(store, [inbox / "doc.txt"], max_bytes=10**6)]
    simulator.set_faults([{"kind": "status", "status": 400, "match": task_of(doc)}])
    plan(store, [doc], TEST_MODEL)

    result = tick(instance)
    assert isinstance(result, dg.SensorResult)
    (run,) = result.run_requests or []
    assert run.tags["dagster/asset_partition_range_start"] == doc
    assert store.openai_batches.unfinished() == [], "not sent again"


def test_a_synchronous_run_leaves_documents_in_an_open_job_to_it(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """A run over three documents, two of them in a Batch API job not yet answered: one chat
    call (for the third), and the run's log names the job the two were left to."""
    simulator.set_batch_timing(seconds=3600)
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(3)})
    store = results_store()
    ids = [r.document_id for r in register_files(store, sorted(inbox.iterdir()), max_bytes=10**6)]
    (job,) = plan(store, ids[:2], TEST_MODEL).jobs
    BatchJobs(store, batch_client(Settings.load(), TEST_API_KEY), Prices.of(Settings.load())).tick()
    sent = store.openai_batches.get(job.intent_id)
    assert sent is not None and sent.batch_id is not None

    report = process_inbox(inbox)

    assert simulator.stats()["total"] == 1 and simulator.requests_for(task_of(ids[2])) == 1
    assert [simulator.requests_for(task_of(d)) for d in ids[:2]] == [0, 0]
    by_id = {d["document_id"]: d["state"] for d in report["documents"]}
    assert by_id[ids[2]] == "COMPLETED" and by_id[ids[0]] != "COMPLETED"
    (run,) = report["runs"]
    messages = [e.user_message for e in instance.all_logs(run["run_id"])]
    (line,) = [m for m in messages if "waiting in open Batch API jobs" in m]
    assert line.startswith("2 documents") and job.intent_id in line and sent.batch_id in line


def test_status_and_trace_say_which_batch_api_job_a_document_waits_in(
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A document in a Batch API job not yet answered: status and trace name the job, its batch
    id, remote status and request counts, in JSON and in text; the other document has none."""
    simulator.set_batch_timing(seconds=3600)
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    store = results_store()
    (job,) = plan(store, ids[:1], TEST_MODEL).jobs
    settings = Settings.load()
    runner = BatchJobs(store, batch_client(settings, TEST_API_KEY), Prices.of(settings))
    runner.tick()  # uploaded and created
    runner.tick()  # polled: not done yet
    sent = store.openai_batches.get(job.intent_id)
    assert sent is not None and sent.batch_id and sent.request_total == 1

    code, status = run_cli(capsys, "status", "--json")
    waits = {d["document_id"]: d["batch_api"] for d in status["documents"]}
    assert waits[ids[1]] is None and status["in_batch_api"] == 1
    assert waits[ids[0]]["batch_id"] == sent.batch_id
    assert waits[ids[0]]["remote_status"] == sent.remote_status != "completed"
    assert waits[ids[0]]["request_counts"] == {"total": 1, "completed": 0, "failed": 0}
    code, story = run_cli(capsys, "trace", ids[0], "--json")
    assert story["batch_api"]["intent_id"] == job.intent_id
    (line,) = [e for e in story["events"] if e["kind"] == "batch_line"]
    assert line["batch_id"] == sent.batch_id and line["line_state"] == "pending"

    assert cli("status") == 0
    text = capsys.readouterr().out
    assert (
        f"waiting in Batch API job {job.intent_id} (batch {sent.batch_id} {sent.remote_status}"
        in text
    )
    assert cli("trace", ids[0]) == 0
    assert "0/1 done" in capsys.readouterr().out


def run_what_the_sensor_asks(instance: dg.DagsterInstance, ids: list[str]) -> None:
    """One tick of the sensor must launch one backfill of ``ids``; their runs are then made
    here, in this process (as the daemon would)."""
    before = len(backfilled(instance))
    tick(instance)
    assert backfilled(instance, since=before) == [sorted(ids)]
    launcher(instance).execute(ids)


def test_submit_via_batch_hands_the_pending_documents_to_one_batch_api_job(
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``submit --via batch`` launches no backfill but one Batch API job of its pending
    documents; the sensor's runs complete them with no chat call; submitting again sends
    nothing."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(3)})
    code, out = run_cli(capsys, "submit", str(inbox), "--batch", "b", "--via", "batch", "--json")
    assert code == 0 and out["backfill_id"] is None and instance.get_backfills() == []
    ids = out["batch_api"]["documents_in_jobs"]
    assert out["batch_api"]["tasks"] == 3 and len(ids) == 3
    assert simulator.calls_to("batches.create") == 1 and simulator.stats()["total"] == 0

    run_what_the_sensor_asks(instance, ids)

    assert {d.state for d in results_store().documents.rows(ids)} == {State.COMPLETED}
    assert simulator.stats()["total"] == 0, "every answer came from the batch"
    code, again = run_cli(capsys, "submit", str(inbox), "--batch", "b", "--via", "batch", "--json")
    assert again["pending_at_submit"] == 0 and "batch_api" not in again
    assert simulator.calls_to("batches.create") == 1


def test_submit_via_batch_waits_until_the_sensor_runs_have_settled_its_documents(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """``submit --via batch --wait`` returns COMPLETED only once the runs the sensor asked for
    have completed every document, not when the job is sent."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    found: dict[str, Any] = {}

    def submit() -> None:
        found["out"] = submit_batch(
            launcher(instance), inbox, "b", via=BATCH_API, api_key=TEST_API_KEY, wait=True
        )

    waiting = threading.Thread(target=submit)
    waiting.start()
    store = results_store()
    deadline = time.monotonic() + 30
    while not [j for j in store.openai_batches.unfinished() if j.batch_id]:
        assert time.monotonic() < deadline, "no job sent"
        time.sleep(0.2)
    time.sleep(3)
    assert waiting.is_alive() and "out" not in found, "returned before the documents settled"

    found_ids = sorted(d.document_id for d in store.documents.rows())
    run_what_the_sensor_asks(instance, found_ids)
    waiting.join(60)

    assert found["out"]["status"] == "COMPLETED" and found["out"]["succeeded"] == len(found_ids)
    assert simulator.stats()["total"] == 0


def test_a_run_tagged_via_batch_sends_its_documents_to_the_batch_api(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """A run tagged ``ai_pipeline/via: batch`` (as a UI backfill can be) makes no call: its
    documents go in one Batch API job, and the sensor's runs then complete them."""
    from ai_pipeline.definitions import defs

    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    job = defs.resolve_job_def("analyse_documents_job")
    result = job.execute_in_process(
        instance=instance, tags={**range_tags(ids), VIA_TAG: "batch"}, raise_on_error=False
    )

    assert result.success and simulator.stats()["total"] == 0
    assert simulator.calls_to("batches.create") == 1
    assert set(results_store().openai_batches.waiting(ids)) == set(ids)
    run_what_the_sensor_asks(instance, ids)
    assert {d.state for d in results_store().documents.rows(ids)} == {State.COMPLETED}
    assert simulator.stats()["total"] == 0


def test_backfill_failed_via_batch_sends_the_failed_document_to_the_batch_api(
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A document that failed for want of an answer (503s) is sent by ``backfill --failed
    --via batch`` in a Batch API job rather than a backfill; its run then makes no call."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(ids[0])}])
    process_inbox(inbox)
    assert results_store().documents.get(ids[0]).state == State.FAILED  # type: ignore[union-attr]
    simulator.set_faults([])
    calls = simulator.stats()["total"]

    code, out = run_cli(capsys, "backfill", "--failed", "--via", "batch", "--json")
    assert code == 0 and out["backfill_id"] is None and instance.get_backfills() == []
    assert out["batch_api"]["documents_in_jobs"] == [ids[0]]

    run_what_the_sensor_asks(instance, [ids[0]])

    assert results_store().documents.get(ids[0]).state == State.COMPLETED  # type: ignore[union-attr]
    assert simulator.stats()["total"] == calls, "its answer came from the batch"


def test_the_nightly_schedule_via_batch_sends_the_retries_to_the_batch_api(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """Built with ``via="batch"`` (AI_PIPELINE_NIGHTLY_VIA), the nightly tick puts the
    retryable failure in a Batch API job, launches no backfill and asks for the report; the
    same night evaluated again sends nothing more."""
    from ai_pipeline.definitions import defs

    simulator.set_batch_timing(seconds=3600)
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(2)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(ids[0])}])
    process_inbox(inbox)
    simulator.set_faults([])
    schedule = build_nightly_retry_schedule("0 2 * * *", "UTC", via="batch")

    def night() -> dg.RunRequest | dg.SkipReason:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=datetime(2026, 3, 14, 2, 0, tzinfo=timezone.utc),
            resources={"results_store": ResultsStore(), "llm": LLMResource(api_key=TEST_API_KEY)},
            repository_def=repository_of(defs, instance),
        )
        return schedule(context)  # type: ignore[no-any-return]

    first = night()
    assert isinstance(first, dg.RunRequest) and first.run_key == "report-2026-03-14"
    assert instance.get_backfills() == []
    (job,) = results_store().openai_batches.unfinished()
    assert job.batch_id and job.task_count == 1
    assert results_store().openai_batches.waiting(ids) == {ids[0]: job}
    assert isinstance(night(), dg.RunRequest)
    assert simulator.calls_to("batches.create") == 1, "the tick again sent nothing more"


@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"])
def test_under_the_daemon_a_submitted_batch_completes_every_document_with_no_call(
    instance: dg.DagsterInstance,
    simulator: SimulatorServer,
    tmp_path: Path,
    backend: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``batch-api submit`` sends one batch; a real dagster-daemon ticks the sensor, which
    ingests it and launches the runs: every document COMPLETED with its results row, no chat
    call, one batch at the simulator."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(10)})
    store = results_store()
    ids = [r.document_id for r in register_files(store, sorted(inbox.iterdir()), max_bytes=10**6)]
    code, sent = run_cli(capsys, "batch-api", "submit", "--json")
    assert code == 0 and sent["tasks"] == 10

    # The product's own code location, its Batch API sensor ticking every second.
    daemon = DagsterProcess.daemon(
        tmp_path / "daemon.log", env={"AI_PIPELINE_BATCH_API_INTERVAL": "1"}
    )
    with running(daemon, Path(os.environ["DAGSTER_HOME"])):
        daemon.start()

        def all_done() -> bool:
            rows = results_store().documents.rows(ids)
            runs = instance.get_runs()
            return (
                bool(runs)
                and all(r.state == State.COMPLETED for r in rows)
                and all(run.is_finished for run in runs)
            )

        wait_for(daemon, "every document COMPLETED by the runs the sensor launched", all_done, 240)

    assert len(results_store().results.get(ids)) == 10
    assert simulator.stats()["total"] == 0, "every answer came from the batch"
    assert simulator.calls_to("batches.create") == 1
    assert results_store().spend.total().attempts == 10
