"""One owner per task under real processes: overlapping launches, a killed owner, a database
outage, a killed run worker. "Paid once" is counted where it is paid: at the simulator, per
Idempotency-Key."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.accelerator.start_runs import daemon_location
from ai_pipeline.defs.backfills import backfill_ended
from ai_pipeline.defs.dagster_private import BulkActionStatus, PartitionBackfill
from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.failures import Category
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.states import State
from ai_pipeline.tasks import ANALYSE_STEP
from ai_pipeline_tests.dagster_procs import DagsterProcess, live_members, wait_for
from ai_pipeline_tests.postgres import OwnedPostgres
from ai_pipeline_tests.support import (
    REPO,
    doc_id,
    instance_yaml_on_postgres,
    make_inbox,
    own_simulator,
    process_inbox,
    results_store,
    sample_text,
    task_of,
)


@pytest.fixture
def slow_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorServer]:
    """A simulator that takes 3 s per answer, with the LLM settings of every process pointing at
    it."""
    with own_simulator(monkeypatch, latency_ms=3000, concurrency=50, max_concurrency=128) as server:
        monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "100")
        yield server


def start_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ai_pipeline.cli", *argv],
        cwd=REPO,
        env=os.environ.copy() | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 420) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    assert out, err[-3000:]
    return proc.returncode, json.loads(out)


def corpus(tmp_path: Path, n: int, offset: int) -> tuple[Path, list[str]]:
    texts = {f"doc-{i:03d}.txt": sample_text(offset + i) for i in range(n)}
    return make_inbox(tmp_path / "inbox", texts), [doc_id(t) for t in texts.values()]


def assert_paid_once(simulator: SimulatorServer, ids: list[str]) -> None:
    calls = {d: simulator.requests_for(task_of(d)) for d in ids}
    assert {d: c for d, c in calls.items() if c != 1} == {}
    assert simulator.stats()["total"] == len(ids)
    store = results_store()
    assert store.results.count() == len(ids)
    assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}


@pytest.mark.slow
def test_two_runs_started_together_pay_once(
    dagster_home: Path, slow_llm: SimulatorServer, tmp_path: Path
) -> None:
    """Two ``ai-pipeline run`` on the same 100 documents at once, 3 s per answer: every document
    is called for exactly once, one row each, and both commands report every one COMPLETED."""
    inbox, ids = corpus(tmp_path, 100, 10_000)

    first = start_cli("run", "--inbox", str(inbox), "--json")
    second = start_cli("run", "--inbox", str(inbox), "--json")
    outcomes = [finish(first), finish(second)]

    for code, report in outcomes:
        assert code == 0, report["counts"]
        assert report["counts"]["by_state"] == {"COMPLETED": 100}
        assert report["in_progress_elsewhere"] == []
    assert_paid_once(slow_llm, ids)


# The daemon tests run on one backend: what they add to the two-run and takeover tests (which run
# on both) is the daemon's path — backfill, queued runs, a run worker — which is the same on both.
@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_batch_under_the_daemon_overlapping_a_run_pays_once(
    dagster_home: Path,
    slow_llm: SimulatorServer,
    daemon: DagsterProcess,
    tmp_path: Path,
) -> None:
    """``submit --wait`` (a backfill, queued runs under a real daemon) and ``run`` over the same
    100 documents at once: one call per document, both exit 0."""
    inbox, ids = corpus(tmp_path, 100, 20_000)
    daemon.start()

    batch = start_cli("submit", str(inbox), "--batch", "overlap", "--wait", "--json")
    time.sleep(5)  # the backfill is registered; the daemon picks it up while the run goes on
    run = start_cli("run", "--inbox", str(inbox), "--json")
    run_code, run_report = finish(run)
    batch_code, batch_report = finish(batch)

    assert run_code == 0, run_report["counts"]
    assert (batch_code, batch_report["status"]) == (0, "COMPLETED_SUCCESS")
    assert (batch_report["succeeded"], batch_report["pending"]) == (100, 0)
    assert_paid_once(slow_llm, ids)


KILL_AFTER_CHECKPOINTS = 4


def _instance_on(server: OwnedPostgres, home: Path) -> None:
    name = "dagster_outage"
    server.create_database(name)
    (home / "dagster.yaml").write_text(instance_yaml_on_postgres("127.0.0.1", server.port, name))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the outage is PostgreSQL's
def test_a_15_s_database_outage_loses_no_paid_answer(
    dagster_home: Path,
    owned_postgres: OwnedPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The PostgreSQL server holding both the instance and the results stops for 15 s mid-run:
    ``run`` rides it out (exit 0: every document completed here and materialized in Dagster, a
    run that failed meanwhile followed by one more wave), or ends with every unfinished document
    explained and one line naming the command that finishes them; nothing of SQLAlchemy's text
    (the statement, its link) reaches the terminal. Afterwards no document is RUNNING, no answer
    returned before the outage is bought again, and one rerun completes the rest."""
    _instance_on(owned_postgres, dagster_home)
    monkeypatch.setenv("AI_PIPELINE_DATABASE_URL", owned_postgres.create_database("results_outage"))
    with own_simulator(monkeypatch, latency_ms=500, concurrency=4) as llm:
        inbox, ids = corpus(tmp_path, 40, 40_000)
        store = results_store()
        run = start_cli("run", "--inbox", str(inbox), "--json")
        deadline = time.monotonic() + 120
        while store.checkpoints.count(ANALYSE_STEP) < 8:
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        owned_postgres.stop()
        stopped_at = time.monotonic()
        answered_before = {r["key"] for r in llm.stats()["requests"] if r["status"] == 200}
        time.sleep(15)
        owned_postgres.start()
        out, err = run.communicate(timeout=300)
        code, report = run.returncode, json.loads(out)
        print(f"run exit {code} {time.monotonic() - stopped_at:.0f} s after the stop")

        assert not [m for m in ("[SQL:", "sqlalche.me", "Traceback") if m in out + err], err
        instance = dg.DagsterInstance.get()
        states = {d["document_id"]: d for d in report["documents"]}
        if code == 0:
            assert {d["state"] for d in states.values()} == {"COMPLETED"}
            assert set(ids) - materialized_in_dagster(instance, ids) == set()
        else:
            assert code == 1, err
            unfinished = [d for d in states.values() if d["state"] != "COMPLETED"]
            assert unfinished and all(d["category"] and d["error"] for d in unfinished)
            assert f"`ai-pipeline run --inbox {inbox}` again finishes them" in err
        assert not [d for d in store.documents.rows(ids) if d.state == State.RUNNING]
        rerun = process_inbox(inbox)
        assert rerun["counts"]["by_state"] == {"COMPLETED": 40}
        calls = {d: llm.requests_for(task_of(d)) for d in ids}
        bought_twice = [d for d in ids if task_of(d) in answered_before and calls[d] > 1]
        assert bought_twice == []
        assert store.results.count() == 40


def materialized_in_dagster(instance: dg.DagsterInstance, ids: list[str]) -> set[str]:
    status = instance.get_status_by_partition(
        dg.AssetKey("analysis_results"), ids, documents_partitions
    )
    return {k for k, v in (status or {}).items() if v == dg.AssetPartitionStatus.MATERIALIZED}


def failed_in_dagster(instance: dg.DagsterInstance, ids: list[str]) -> set[str]:
    status = instance.get_status_by_partition(
        dg.AssetKey("analysis_results"), ids, documents_partitions
    )
    return {k for k, v in (status or {}).items() if v == dg.AssetPartitionStatus.FAILED}


def _run_workers(daemon: DagsterProcess, marker: bytes = b"spawn_main") -> list[int]:
    """The daemon's run workers: the code server starts each run in a process of its own
    (multiprocessing's spawn), in the daemon's process group. With another ``marker``: those
    processes of the group whose command line holds it."""
    assert daemon.proc is not None
    workers = []
    for pid in live_members(daemon.proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            workers.append(pid)
    return workers


@pytest.mark.slow
@pytest.mark.daemon
def test_a_killed_run_worker_is_reconciled_and_rerun(
    dagster_home: Path,
    instance: dg.DagsterInstance,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon-launched run worker SIGKILLed before it started all its documents (two calls in
    flight, a window of four, twelve documents), and its code server with it, so that nothing but
    the daemon is left to notice: within 60 s every document it had not finished
    — those it held and those it never started — is FAILED in the store (RUN_INTERRUPTED,
    retryable) and in Dagster, the run itself FAILURE in Dagster within 90 s (run monitoring, the
    run launcher's health check), ``submit --wait`` exits non-zero with the batch not done, and
    ``backfill --failed`` selects and finishes exactly those.

    Dagster's run retry is off here: this is the path once its one retry is spent (or where an
    instance turns retries off). With it on, the retry finishes the documents with no command
    (``service/test_api.py``, the 60-section document)."""
    # One run slot: the batch is one run (it would be cut into one run per slot otherwise).
    config = dagster_home / "dagster.yaml"
    text = config.read_text().replace("max_concurrent_runs: 4", "max_concurrent_runs: 1")
    assert "  max_retries: 1\n" in text
    config.write_text(text.replace("  max_retries: 1\n", "  max_retries: 0\n"))
    with own_simulator(monkeypatch, latency_ms=2000, concurrency=2):
        inbox, ids = corpus(tmp_path, 12, 50_000)
        store = results_store()
        daemon.start()
        batch = start_cli("submit", str(inbox), "--batch", "killed", "--wait", "--json")

        def a_worker_holding_documents() -> tuple[str, list[int]] | None:
            held = [d for d in store.documents.rows(ids) if d.state == State.RUNNING]
            run_ids = {d.run_id for d in held if d.run_id}
            workers = _run_workers(daemon)
            if len(run_ids) == 1 and workers:
                return run_ids.pop(), workers
            return None

        run_id, pids = wait_for(
            daemon, "a run worker holding documents", a_worker_holding_documents
        )
        # Its code server too: the one that started it would see it die and fail its run itself.
        for pid in pids + _run_workers(daemon, b"api\x00grpc"):
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        never_started = [d.document_id for d in store.documents.rows(ids) if d.run_id is None]
        assert never_started, "the run had documents it had not started"

        def unfinished_failed() -> list[str] | None:
            docs = store.documents.rows(ids)
            unfinished = [d for d in docs if d.state != State.COMPLETED]
            if all(
                d.state == State.FAILED and d.category == Category.RUN_INTERRUPTED
                for d in unfinished
            ):
                return [d.document_id for d in unfinished]
            return None

        unfinished = wait_for(
            daemon, "the killed run's documents FAILED, RUN_INTERRUPTED", unfinished_failed
        )
        assert time.monotonic() - killed_at < 60
        assert set(never_started) <= set(unfinished)
        wait_for(
            daemon,
            "every unfinished document FAILED in Dagster",
            lambda: failed_in_dagster(instance, ids) == set(unfinished),
            timeout=90,
        )
        assert time.monotonic() - killed_at < 60

        def failed_run() -> dg.DagsterRun | None:
            run = instance.get_run_by_id(run_id)
            return run if run is not None and run.status == dg.DagsterRunStatus.FAILURE else None

        wait_for(daemon, f"run {run_id} FAILURE in Dagster", failed_run, timeout=90)
        assert time.monotonic() - killed_at < 90
        monitored = [
            e.message for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        ]
        assert any("has ended" in m for m in monitored), monitored
        code, summary = finish(batch)
        assert code == 1 and summary["failed"] == len(unfinished)

        plan_code, plan = finish(start_cli("backfill", "--failed", "--dry-run", "--json"))
        assert plan_code == 0, plan
        assert sorted(d["document_id"] for d in plan["selected"]) == sorted(unfinished)

        backfill = start_cli("backfill", "--failed", "--wait", "--json")
        backfill_code, out = finish(backfill)
        assert backfill_code == 0, out
        assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}
        assert store.results.count() == len(ids)
        assert failed_in_dagster(instance, ids) == set()


@pytest.mark.accelerated  # on Dagster's own storage run creation planned each document
@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_documents_of_runs_that_failed_before_starting_are_failed_and_backfilled(
    dagster_home: Path,
    instance: dg.DagsterInstance,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's runs that fail before they start (marked FAILURE while queued, as Dagster's run
    queue does when a launch fails) never start their documents, and with planned events per run
    Dagster would not show them FAILED. The reconcile sensor marks them FAILED in Dagster and in
    the store (RUN_INTERRUPTED); ``backfill --failed`` selects exactly them and, once runs may
    start, finishes them with one call each."""
    config = dagster_home / "dagster.yaml"
    open_queue = config.read_text()
    assert "max_concurrent_runs: 4" in open_queue
    config.write_text(open_queue.replace("max_concurrent_runs: 4", "max_concurrent_runs: 0"))
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "5")
    with own_simulator(monkeypatch, latency_ms=50, concurrency=4) as llm:
        inbox, ids = corpus(tmp_path, 10, 60_000)
        store = results_store()
        daemon.start()
        code, submitted = finish(start_cli("submit", str(inbox), "--batch", "unlaunched", "--json"))
        assert code == 0, submitted

        def queued_runs() -> list[dg.DagsterRun] | None:
            runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
            return runs if len(runs) == 2 else None

        for run in wait_for(daemon, "the batch's two runs queued", queued_runs):
            instance.report_run_failed(run, message="the run could not be launched")
        wait_for(
            daemon,
            "the failed runs' documents FAILED in Dagster",
            lambda: failed_in_dagster(instance, ids) == set(ids),
            timeout=120,
        )
        docs = store.documents.rows(ids)
        assert {(d.state, d.category) for d in docs} == {(State.FAILED, Category.RUN_INTERRUPTED)}

        plan_code, plan = finish(start_cli("backfill", "--failed", "--dry-run", "--json"))
        assert plan_code == 0, plan
        assert sorted(d["document_id"] for d in plan["selected"]) == sorted(ids)
        assert llm.stats()["total"] == 0

        daemon.stop()
        config.write_text(open_queue)
        daemon.start()
        backfill_code, out = finish(start_cli("backfill", "--failed", "--wait", "--json"))
        assert backfill_code == 0, out
        assert_paid_once(llm, ids)
        assert failed_in_dagster(instance, ids) == set()


_TASK_LINE = re.compile(r"\[TASK:(\S+)\] (.*)")


def _task_lines(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """A run's lines about its tasks, in the order it wrote them: (task id, the rest)."""
    found = (_TASK_LINE.search(e.user_message or "") for e in instance.all_logs(run_id))
    return [(m.group(1), m.group(2)) for m in found if m]


@pytest.mark.slow
def test_a_run_after_a_killed_run_takes_its_documents_over_at_once(
    dagster_home: Path,
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ai-pipeline run`` SIGKILLed mid-batch, its claims good for ten minutes; run again at
    once, allowed to wait for no claim: it takes every document the dead run held over on its
    first ask (the dead run's process is gone), leaves none to the dead run, and finishes every
    document, paying twice for no more than the calls in flight at the kill."""
    with own_simulator(monkeypatch, latency_ms=1000, concurrency=4) as llm:
        monkeypatch.setenv("AI_PIPELINE_LEASE_SECONDS", "600")
        inbox, ids = corpus(tmp_path, 40, 70_000)
        store = results_store()
        owner = start_cli("run", "--inbox", str(inbox), "--json")
        deadline = time.monotonic() + 120
        while store.checkpoints.count(ANALYSE_STEP) < KILL_AFTER_CHECKPOINTS:
            assert owner.poll() is None and time.monotonic() < deadline, "never reached the kill"
            time.sleep(0.05)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        # Calls sent before the kill whose answers were never checkpointed: all that may be
        # bought again.
        in_flight = [
            d
            for d in ids
            if llm.requests_for(task_of(d)) and store.checkpoints.get(task_of(d)) is None
        ]
        checkpointed = [d for d in ids if store.checkpoints.get(task_of(d)) is not None]
        held = [d.document_id for d in store.documents.rows(ids) if d.state == State.RUNNING]
        assert held, "the killed run held documents"
        (killed,) = [r.run_id for r in instance.get_runs()]

        # With no wait for claims, a claim the rerun does not judge dead on its first ask is left
        # to its holder ("in progress elsewhere"): finishing every document is taking each over
        # at once. Whatever the machine's load, no poll, no lease expiry can hide in it.
        rerun_at = time.monotonic()
        rerun = start_cli(
            "run", "--inbox", str(inbox), "--json", env={"AI_PIPELINE_CLAIM_WAIT_SECONDS": "0"}
        )
        code, report = finish(rerun, timeout=300)
        took = time.monotonic() - rerun_at

        reruns = [r.run_id for r in instance.get_runs() if r.run_id != killed]
        lines = {run_id: _task_lines(instance, run_id) for run_id in reruns}
        took_over = f"taken over from run {killed}: its process has ended"
        taken = {task for run in lines.values() for task, line in run if line == took_over}
        print(f"{len(taken)} documents taken over from the killed run; rerun {took:.0f} s")
        assert report["in_progress_elsewhere"] == []
        assert (code, report["counts"]["by_state"]) == (0, {"COMPLETED": 40}), report["counts"]
        assert {task_of(d) for d in held} <= taken
        # A run works on its documents in their order (``ai_pipeline.window``), each up to its
        # first wait: a document taken over at once is taken before any later one is touched.
        for run in lines.values():
            for i, (task, line) in enumerate(run):
                if line == took_over:
                    assert max(t for t, _ in run[: i + 1]) == task, f"{task}: later ones went first"
        assert took < 300, "the dead run's ten-minute claims were not waited out"
        calls = {d: llm.requests_for(task_of(d)) for d in ids}
        assert {d for d in ids if calls[d] > 1} <= set(in_flight)
        assert all(calls[d] <= 2 for d in ids)
        assert {d: calls[d] for d in checkpointed} == {d: 1 for d in checkpointed}
        assert store.results.count() == 40


def backfill_over(
    daemon: DagsterProcess, instance: dg.DagsterInstance, backfill_id: str, timeout: float
) -> PartitionBackfill:
    """The backfill once the daemon has ended it, whatever its status."""
    return wait_for(
        daemon,
        "the backfill over",
        lambda: (b := instance.get_backfill(backfill_id)) and backfill_ended(b) and b,
        timeout=timeout,
    )


def assert_no_run_unfinished(instance: dg.DagsterInstance) -> None:
    unfinished = instance.get_runs(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.QUEUED])
    )
    assert unfinished == []


@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_backfill_outlives_a_killed_and_restarted_daemon(
    dagster_home: Path,
    instance: dg.DagsterInstance,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dagster-daemon`` SIGKILLed while a batch's backfill is half done, then started again:
    the backfill completes with no other command, every document COMPLETED, none RUNNING, no
    run left unfinished, and no document paid twice but for the calls in flight at the kill."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "10")
    with own_simulator(monkeypatch, latency_ms=1000, concurrency=4) as llm:
        inbox, ids = corpus(tmp_path, 60, 80_000)
        store = results_store()
        daemon.start()
        code, submitted = finish(start_cli("submit", str(inbox), "--batch", "restart", "--json"))
        assert code == 0, submitted
        backfill_id = submitted["backfill_id"]
        wait_for(
            daemon,
            "a quarter of the batch checkpointed",
            lambda: store.checkpoints.count(ANALYSE_STEP) >= 15,
        )
        assert daemon.proc is not None
        old_group = daemon.proc.pid
        os.kill(old_group, signal.SIGKILL)
        daemon.proc.wait(timeout=30)
        in_flight = {
            d
            for d in ids
            if llm.requests_for(task_of(d)) and store.checkpoints.get(task_of(d)) is None
        }
        done_at_kill = store.checkpoints.count(ANALYSE_STEP)
        assert done_at_kill < len(ids), "the backfill was over before the kill"

        daemon.start()
        restarted = time.monotonic()
        try:
            backfill = backfill_over(daemon, instance, backfill_id, timeout=300)
        except pytest.fail.Exception:
            runs = instance.get_runs(dg.RunsFilter.for_backfill(backfill_id))
            print("the backfill's runs:", {r.run_id: r.status.value for r in runs})
            raise
        finally:
            # What the killed daemon left (its code server waits for a heartbeat to stop).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old_group, signal.SIGTERM)

        calls = {d: llm.requests_for(task_of(d)) for d in ids}
        print(
            f"{done_at_kill}/{len(ids)} checkpointed at the kill, {len(in_flight)} calls in "
            f"flight; backfill over {time.monotonic() - restarted:.0f} s after the restart; "
            f"{sum(c > 1 for c in calls.values())} paid twice"
        )
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS
        docs = store.documents.rows(ids)
        assert {d.state for d in docs} == {State.COMPLETED}
        assert store.results.count() == len(ids)
        assert_no_run_unfinished(instance)
        assert {d for d in ids if calls[d] > 1} <= in_flight
        assert all(calls[d] >= 1 for d in ids)


@pytest.mark.accelerated  # the submit starts the runs the accelerator planned
@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_run_whose_launch_was_cut_off_is_failed_and_run_again(
    dagster_home: Path,
    instance: dg.DagsterInstance,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run the daemon marked STARTING and then never launched (a ``dagster-daemon`` killed
    between the two, as the test above can meet by chance): run monitoring fails it once it has
    not started in time, run retries re-execute it, and its backfill completes, every document
    COMPLETED and paid once, with no other command. Without monitoring the run stays STARTING
    and the backfill open forever; without retries the backfill ends failed. (Should the
    daemon's retry miss the failure, the reconcile sensor retries it a minute later:
    ``ai_pipeline.accelerator.missed_retries``.)

    The daemon runs once first, as it had before it was killed: its sensors ticked (so
    ``submit`` submits the batch's runs itself) and its run-retry consumer keeps a cursor into
    the event log (one that starts fresh skips the events before it). The checkout's
    dagster.yaml, polled every 2 s instead of 30; the launch is dated ten minutes back, past its
    start timeout, while the other run starts as runs do, whatever the load."""
    config = dagster_home / "dagster.yaml"
    text, found = re.subn(
        r"poll_interval_seconds: \d+", "poll_interval_seconds: 2", config.read_text()
    )
    assert found == 1, "the checkout's dagster.yaml has no run monitoring"
    config.write_text(text)
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "10")
    with own_simulator(monkeypatch, latency_ms=100, concurrency=8) as llm:
        inbox, ids = corpus(tmp_path, 20, 90_000)
        # The key dagster's event-log consumer keeps its run-failure cursor under.
        cursor = f"EVENT_LOG_CONSUMER_CURSOR-{dg.DagsterEventType.RUN_FAILURE.value}"
        daemon.start()
        wait_for(
            daemon,
            "a sensor tick and the run-retry cursor",
            lambda: (
                daemon_location(instance)
                and instance.daemon_cursor_storage.get_cursor_values({cursor})
            ),
        )
        daemon.stop()

        code, submitted = finish(start_cli("submit", str(inbox), "--batch", "cut", "--json"))
        assert code == 0, submitted
        backfill_id = submitted["backfill_id"]
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and len(backfill.reserved_run_ids) == 2
        cut_off = backfill.reserved_run_ids[0]
        run = instance.get_run_by_id(cut_off)
        assert run is not None and run.status == dg.DagsterRunStatus.QUEUED, "not submitted"
        starting = dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_STARTING.value, job_name=run.job_name
        )
        instance.report_dagster_event(starting, run_id=cut_off, timestamp=time.time() - 600)
        assert instance.get_run_by_id(cut_off).status == dg.DagsterRunStatus.STARTING

        daemon.start()
        backfill = backfill_over(daemon, instance, backfill_id, timeout=180)

        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS
        failed = instance.get_run_by_id(cut_off)
        assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
        (retry,) = instance.get_runs(dg.RunsFilter(tags={"dagster/parent_run_id": cut_off}))
        assert retry.status == dg.DagsterRunStatus.SUCCESS
        assert retry.tags["dagster/backfill"] == backfill_id
        assert_no_run_unfinished(instance)
        assert_paid_once(llm, ids)
