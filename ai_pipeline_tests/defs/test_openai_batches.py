"""The Batch API sensor (``build_openai_batch_sensor``), its function called with
``build_sensor_context``: it follows open jobs, launches runs for what they answered, and sends
failed lines into a new job."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.defs.openai_batches import build_openai_batch_sensor
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.intake import register_files
from ai_pipeline.openai_batch import plan
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.states import State
from ai_pipeline.store.openai_batches import LineState
from ai_pipeline_tests.dagster_procs import DagsterProcess, running, wait_for
from ai_pipeline_tests.support import (
    TEST_API_KEY,
    TEST_MODEL,
    make_inbox,
    results_store,
    run_cli,
    sample_text,
    task_of,
)


def tick(instance: dg.DagsterInstance) -> dg.SensorResult | dg.SkipReason:
    context = dg.build_sensor_context(
        instance=instance,
        resources={
            "settings": PipelineSettings(documents_per_run=10),
            "results_store": ResultsStore(),
            "llm": LLMResource(api_key=TEST_API_KEY),
        },
    )
    return build_openai_batch_sensor()(context)


def test_the_sensor_follows_jobs_and_launches_runs_for_what_they_answered(
    instance: dg.DagsterInstance, simulator: SimulatorServer, tmp_path: Path
) -> None:
    """One tick sends, polls and ingests a job, adds the answered documents as partitions with
    a range run, and puts the line that failed retryably into a new job; the next tick answers
    it and launches its run; then nothing is left to do."""
    inbox = make_inbox(tmp_path / "inbox", {f"doc-{i}.txt": sample_text(i) for i in range(4)})
    store = results_store()
    ids = [r.document_id for r in register_files(store, sorted(inbox.iterdir()), max_bytes=10**6)]
    limited = task_of(ids[0])
    simulator.set_faults([{"kind": "status", "status": 429, "match": limited, "times": 1}])
    (job,) = plan(store, ids, TEST_MODEL).jobs
    assert {line.task_id for line in store.openai_batches.lines(job.intent_id)} >= {limited}

    first = tick(instance)
    assert isinstance(first, dg.SensorResult)
    (added,) = first.dynamic_partitions_requests or []
    assert isinstance(added, dg.AddDynamicPartitionsRequest)
    assert sorted(added.partition_keys or []) == sorted(ids[1:])
    (run,) = first.run_requests or []
    assert run.tags["ai_pipeline/documents"] == "3"
    (retry,) = store.openai_batches.unfinished()
    assert [line.task_id for line in store.openai_batches.lines(retry.intent_id)] == [limited]

    second = tick(instance)
    assert isinstance(second, dg.SensorResult)
    assert [
        r.partition_key or r.tags.get("dagster/asset_partition_range_start")
        for r in second.run_requests or []
    ] == [ids[0]]
    assert store.openai_batches.lines(retry.intent_id)[0].state == LineState.ANSWERED
    assert isinstance(tick(instance), dg.SkipReason)
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
