"""Failed-only backfills: the UI's "Failed" selection, the CLI, the nightly schedule and batches.

Each test starts from documents that really failed (faults injected at the simulator, then run
through Dagster by ``process_inbox``) and checks what a rerun touched: the runs and the partitions
they cover, the requests the simulator received per task id, the documents' states and Dagster's
partition statuses. Backfills run only in a daemon, so the tests marked
``daemon`` start a real ``dagster-daemon`` (and, for the UI, ``dagster-webserver``): the daemon
fixture of ``conftest.py``, the processes of ``ai_pipeline_tests.dagster_procs``, whose backfill
loop pauses 3 s instead of Dagster's 30. Each daemon test runs on one backend (named at its
``parametrize``), to keep the suite within CI's time: the nightly tick and the killed run worker
(``test_one_owner``) run backfills under the daemon on PostgreSQL, the others on SQLite; the
schedule function, which needs no daemon, runs on both.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.accelerator.start_runs import daemon_location
from ai_pipeline.cli import main
from ai_pipeline.defs import launch
from ai_pipeline.defs.assets import ANALYSIS_KEYS, ANALYSIS_RESULTS, LLM_ANALYSIS
from ai_pipeline.defs.backfills import (
    BACKFILL_TAG,
    REPLACED_TAG,
    backfill_id_for,
    backfill_run_size,
    documents_settled_status,
    launch_backfill,
    plan_runs,
    planned_run_size,
    retry_pending,
    wait_for_backfill,
)
from ai_pipeline.defs.checks import CHECK_SPECS
from ai_pipeline.defs.dagster_private import BulkActionStatus, repository_of
from ai_pipeline.defs.partitions import add_partitions, documents_partitions, named_in
from ai_pipeline.defs.resources import ResultsStore
from ai_pipeline.defs.run_ends import run_documents
from ai_pipeline.defs.schedules import NIGHTLY_TAG
from ai_pipeline.intake import batch_key
from ai_pipeline.reporting import build_report
from ai_pipeline.states import State
from ai_pipeline_tests.dagster_procs import (
    BACKFILL_LOOP_SECONDS,
    DEADLINE_SECONDS,
    DagsterProcess,
    running,
    wait_for,
)
from ai_pipeline_tests.opaque_storage import opaque_run_storage_yaml
from ai_pipeline_tests.support import (
    STATUS,
    TERMINAL,
    latest_materialization,
    launcher,
    make_inbox,
    process_inbox,
    results_store,
    run_cli,
    sample_text,
    statuses,
    task_of,
)

BACKFILL_DEADLINE_SECONDS = 240
REPORT = dg.AssetKey("failure_report")

LAUNCH_BACKFILL = """
mutation($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on Error { message }
  }
}
"""
BACKFILL_STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status numPartitions }
  }
}
"""


# --- documents that really failed -----------------------------------------------------------------


@dataclass
class Seeded:
    """Documents registered and run once through Dagster with faults; ids in partition order."""

    inbox: Path
    ids: list[str]
    network: list[str]
    low_confidence: list[str]

    @property
    def failed(self) -> list[str]:
        return [i for i in self.ids if i in self.network or i in self.low_confidence]

    @property
    def untouched(self) -> list[str]:
        return [i for i in self.ids if i not in self.failed]


def seed(
    tmp_path: Path,
    simulator: Any,
    *,
    count: int = 8,
    network: Sequence[int] = (1, 5),
    low_confidence: Sequence[int] = (3,),
) -> Seeded:
    """Documents at ``network`` get persistent 503s (NETWORK_TIMEOUT: no answer is ever stored),
    those at ``low_confidence`` an answer with confidence 0.42 (checkpointed, then failed at
    validation); the faults stay in place until the test clears them."""
    texts = {f"doc-{i}.txt": sample_text(i) for i in range(count)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = launcher().register_inbox(inbox).document_ids
    seeded = Seeded(inbox, ids, [ids[i] for i in network], [ids[i] for i in low_confidence])
    simulator.set_faults(
        [{"kind": "status", "status": 503, "match": task_of(i)} for i in seeded.network]
        + [{"kind": "low_confidence", "match": task_of(i)} for i in seeded.low_confidence]
    )
    process_inbox(inbox)
    return seeded


def states(ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """(state, category) of each document in the results database."""
    docs = {d.document_id: d for d in results_store().documents.rows(ids)}
    return {i: (docs[i].state, docs[i].category) for i in ids}


def calls(simulator: Any, ids: Sequence[str]) -> dict[str, int]:
    """LLM requests the simulator received per document (its analysis task id)."""
    return {i: simulator.requests_for(task_of(i)) for i in ids}


def dagster_failed(instance: dg.DagsterInstance, ids: Sequence[str]) -> list[str]:
    """The documents Dagster shows FAILED for ``analysis_results``, in partition order."""
    by_key = statuses(instance, ANALYSIS_RESULTS, list(ids))
    return [i for i in ids if by_key.get(i) == STATUS.FAILED]


def assert_seeded(instance: dg.DagsterInstance, seeded: Seeded, simulator: Any) -> None:
    """What the faults did: the failed documents are FAILED here and in Dagster, the rest done."""
    assert dagster_failed(instance, seeded.ids) == seeded.failed
    assert states(seeded.ids) == (
        {i: ("COMPLETED", None) for i in seeded.untouched}
        | {i: ("FAILED", "NETWORK_TIMEOUT") for i in seeded.network}
        | {i: ("FAILED", "LOW_CONFIDENCE") for i in seeded.low_confidence}
    )
    # A 503 is tried three times (two retries), every other document once.
    assert calls(simulator, seeded.ids) == {i: 3 if i in seeded.network else 1 for i in seeded.ids}


# --- backfills, runs and the partitions they cover ------------------------------------------------


def targeted(backfill: Any) -> dict[dg.AssetKey, set[str]]:
    """The partitions an asset backfill targets, per asset."""
    subsets = backfill.asset_backfill_data.target_subset.partitions_subsets_by_asset_key
    return {key: set(subset.get_partition_keys()) for key, subset in subsets.items()}


def backfill_runs(instance: dg.DagsterInstance, backfill_id: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id})))


def covered(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[str]:
    """The documents a run works on: its one partition, or those of its range its config names
    (all of them when it names none)."""
    keys = instance.get_dynamic_partitions(documents_partitions.name or "documents")
    return run_documents(run, keys)


def backfill_ended(instance: dg.DagsterInstance, backfill_id: str) -> bool:
    backfill = instance.get_backfill(backfill_id)
    return backfill is not None and ended(backfill)


def ended_backfills(instance: dg.DagsterInstance) -> list[Any]:
    """Every backfill, once each has ended (else an empty list)."""
    found = instance.get_backfills()
    return found if found and all(ended(b) for b in found) else []


def ended(backfill: Any) -> bool:
    from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES

    return backfill.status in BULK_ACTION_TERMINAL_STATUSES


# --- the processes --------------------------------------------------------------------------------


def quiet_nightly_cron() -> str:
    """A daily cron twelve hours away: the nightly schedule (RUNNING by default) cannot tick."""
    return f"0 {(datetime.now(timezone.utc).hour + 12) % 24} * * *"


@pytest.fixture
def daemon_env(no_inbox_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment the daemon inherits: no inbox, no webhook, a nightly schedule that waits."""
    monkeypatch.delenv("AI_PIPELINE_WEBHOOK_URL", raising=False)
    monkeypatch.delenv("AI_PIPELINE_RETRY_BUDGET", raising=False)
    monkeypatch.setenv("AI_PIPELINE_TIMEZONE", "UTC")
    monkeypatch.setenv("AI_PIPELINE_NIGHTLY_CRON", quiet_nightly_cron())


def launch_ui_backfill(webserver: DagsterProcess, documents: list[str]) -> str:
    """What the asset page's "Materialize…" → "Failed" → "Launch backfill" sends, for these
    documents of the analysis's stages; the backfill's id."""
    launched = webserver.graphql(
        LAUNCH_BACKFILL,
        {
            "backfillParams": {
                "partitionNames": documents,
                "assetSelection": [{"path": k.path} for k in ANALYSIS_KEYS],
                "fromFailure": False,
                "tags": [],
            }
        },
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return str(launched["backfillId"])


# --- 1. "Failed" from the UI ----------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # one backend: see the docstring
def test_ui_failed_backfill_reruns_only_the_failed_documents(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    webserver: DagsterProcess,
    tmp_path: Path,
) -> None:
    """The UI's "Failed" backfill reruns exactly the failed documents and never repays an answer."""
    webserver.start()  # it loads while the documents are run
    seeded = seed(tmp_path, simulator)
    assert_seeded(instance, seeded, simulator)
    simulator.set_faults([])
    before = calls(simulator, seeded.ids)
    total_before = simulator.stats()["total"]
    runs_before = {r.run_id for r in instance.get_runs()}
    webserver.wait_ready(locations_loaded=True)

    failed = dagster_failed(instance, seeded.ids)
    backfill_id = launch_ui_backfill(webserver, failed)
    # Started after the launch, the daemon's first backfill iteration picks it up at once.
    daemon.start()
    shown = webserver.graphql(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
    assert (shown["status"], shown["numPartitions"]) == ("REQUESTED", 3), "on the Backfills page"
    webserver.stop()  # while the daemon loads: nothing else needs the UI
    wait_for(
        daemon,
        f"backfill {backfill_id} to end",
        lambda: backfill_ended(instance, backfill_id),
        timeout=BACKFILL_DEADLINE_SECONDS,
    )

    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None
    assert targeted(backfill) == {k: set(seeded.failed) for k in ANALYSIS_KEYS}
    # The low-confidence document fails again, from its stored answer.
    assert backfill.status.value == "COMPLETED_FAILED"

    new_runs = [r for r in instance.get_runs() if r.run_id not in runs_before]
    assert new_runs and {r.run_id for r in new_runs} == {
        r.run_id for r in backfill_runs(instance, backfill_id)
    }
    working = working_runs(new_runs)
    assert all(
        r.status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE) for r in working
    )
    assert all(r.status != dg.DagsterRunStatus.FAILURE for r in new_runs if r not in working)
    reran = [k for r in working for k in covered(instance, r) if k in seeded.failed]
    assert sorted(reran) == sorted(seeded.failed), "each failed document in one run"
    # A run that covers a completed document between the failed ones (Dagster's own storage: a
    # run covers its whole range) re-reports it from its checkpoint: no call (counted below).
    for i in seeded.untouched:
        answer = latest_materialization(instance, LLM_ANALYSIS, i)
        if answer.run_id in {r.run_id for r in new_runs}:
            assert answer.asset_materialization.metadata["from_checkpoint"].value is True

    (low,) = seeded.low_confidence
    assert calls(simulator, seeded.ids) == {
        i: before[i] + 1 if i in seeded.network else before[i] for i in seeded.ids
    }
    assert simulator.stats()["total"] == total_before + len(seeded.network)
    answer = latest_materialization(instance, LLM_ANALYSIS, low).asset_materialization
    assert answer.metadata["from_checkpoint"].value is True
    assert states(seeded.ids) == {i: ("COMPLETED", None) for i in seeded.ids} | {
        low: ("FAILED", "LOW_CONFIDENCE")
    }
    assert results_store().documents.get(low).attempts == 2  # type: ignore[union-attr]
    assert statuses(instance, ANALYSIS_RESULTS, seeded.ids) == {
        i: STATUS.MATERIALIZED for i in seeded.ids
    } | {low: STATUS.FAILED}


def seed_scattered(
    instance: dg.DagsterInstance,
    simulator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dagster_home: Path,
) -> tuple[Seeded, dict[str, int], dict[str, str]]:
    """Six documents of 24 failed at the network, scattered (every fourth from the second), with
    three documents per backfill run and two run slots; the faults cleared. Returns them, the
    calls each had so far, and the run that last materialized each of the others."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "3")
    config = dagster_home / "dagster.yaml"
    queue = config.read_text()
    assert "max_concurrent_runs: 4" in queue
    config.write_text(queue.replace("max_concurrent_runs: 4", "max_concurrent_runs: 2"))
    seeded = seed(tmp_path, simulator, count=24, network=(1, 5, 9, 13, 17, 21), low_confidence=())
    assert_seeded(instance, seeded, simulator)
    simulator.set_faults([])
    before = calls(simulator, seeded.ids)
    last_materialized = {
        i: latest_materialization(instance, ANALYSIS_RESULTS, i).run_id for i in seeded.untouched
    }
    return seeded, before, last_materialized


def working_runs(runs: Sequence[dg.DagsterRun]) -> list[dg.DagsterRun]:
    """The runs of a backfill that worked on its documents: not those the backfill planner
    replaced while they were queued."""
    return [r for r in runs if REPLACED_TAG not in r.tags]


def latest_checks(instance: dg.DagsterInstance, ids: Sequence[str]) -> dict[tuple[str, str], Any]:
    """(check, document) → the status of the latest execution of that check on that document."""
    latest: dict[tuple[str, str], Any] = {}
    for spec in CHECK_SPECS:
        for e in instance.event_log_storage.get_asset_check_execution_history(spec.key, 1000):
            if e.partition in ids:
                if os.environ.get("DEBUG_CHECKS") and (spec.name, e.partition) not in latest:
                    r = instance.get_run_by_id(e.run_id) if e.run_id else None
                    print(
                        "LATEST",
                        spec.name,
                        e.partition,
                        e.id,
                        e.status,
                        e.run_id,
                        r and r.status,
                        r
                        and {k: v for k, v in r.tags.items() if "ai_pipeline" in k or "range" in k},
                    )
                latest.setdefault((spec.name, e.partition), e.status)
    return latest


def assert_only_the_failed_rerun(
    instance: dg.DagsterInstance,
    simulator: Any,
    seeded: Seeded,
    runs: Sequence[dg.DagsterRun],
    before: dict[str, int],
    last_materialized: dict[str, str],
    *,
    accelerated: bool,
    most_runs: int,
) -> None:
    """The rerun's ``runs`` worked on the documents that failed at the network, each in one run
    (at most ``most_runs`` runs worked), one call each, and the others got no call; every
    document is COMPLETED here, none FAILED in Dagster, and each check's latest execution on each
    document passed. With the accelerator the runs name their documents: those between them get
    no materialization and no check execution at all. On Dagster's own storage a run covers its
    range, and the completed documents in it are re-reported from their checkpoints."""
    working = working_runs(runs)
    assert len(working) <= most_runs, [covered(instance, r) for r in working]
    analysed = [d for r in working for d in covered(instance, r) if d in seeded.network]
    assert sorted(analysed) == sorted(seeded.network), "each failed document in one run"
    assert calls(simulator, seeded.ids) == {
        i: before[i] + 1 if i in seeded.network else before[i] for i in seeded.ids
    }
    assert states(seeded.ids) == {i: ("COMPLETED", None) for i in seeded.ids}
    assert dagster_failed(instance, seeded.ids) == []
    checks = latest_checks(instance, seeded.ids)
    assert {k: s.value for k, s in checks.items() if s.value != "SUCCEEDED"} == {}
    assert {d for _, d in checks} == set(seeded.ids)
    if not accelerated:
        return
    assert {
        i: latest_materialization(instance, ANALYSIS_RESULTS, i).run_id for i in seeded.untouched
    } == last_materialized
    run_ids = {r.run_id for r in runs}
    checked = {
        e.partition
        for spec in CHECK_SPECS
        for e in instance.event_log_storage.get_asset_check_execution_history(spec.key, 1000)
        if e.run_id in run_ids
    }
    assert checked == set(seeded.network)


def planner_ticked(instance: dg.DagsterInstance) -> bool:
    """Whether the daemon has begun a tick of the backfill planner sensor."""
    return any(
        state.instigator_name == "backfill_planner"
        and getattr(state.instigator_data, "last_tick_start_timestamp", None)
        for state in instance.all_instigator_state()
    )


@pytest.mark.accelerated
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the planning knows no backend
def test_a_ui_failed_backfill_of_scattered_documents_runs_in_runs_of_the_run_size(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    dagster_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six failures scattered over 24 documents, three documents per run, two run slots: the
    backfill the UI's "Failed" launches (its GraphQL mutation) runs in two runs, started by the
    backfill planner sensor — Dagster's own planning makes six, one per document, and its
    backfill loop (here 10 minutes: after the launch only the sensor can act) never gets to it.
    One call per failed document; the completed documents between them get no call, no
    materialization and no check execution; every document's status in Dagster is exact."""
    seeded, before, last_materialized = seed_scattered(
        instance, simulator, tmp_path, monkeypatch, dagster_home
    )
    runs_before = {r.run_id for r in instance.get_runs()}
    slow_loop = DagsterProcess.daemon(tmp_path / "daemon.log", backfill_loop_seconds=600)
    with (
        running(slow_loop, dagster_home) as daemon,
        running(DagsterProcess.webserver(tmp_path / "webserver.log")) as webserver,
    ):
        daemon.start()  # its backfill loop runs once now, then in ten minutes
        webserver.start()
        webserver.wait_ready(locations_loaded=True)
        wait_for(daemon, "the backfill planner's first tick", lambda: planner_ticked(instance))

        backfill_id = launch_ui_backfill(webserver, seeded.failed)

        def runs_over() -> list[dg.DagsterRun]:
            runs = backfill_runs(instance, backfill_id)
            done = len(runs) == 2 and all(r.status in TERMINAL for r in runs)
            return runs if done else []

        runs = wait_for(daemon, "the backfill's two runs", runs_over, timeout=180)

    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    assert not {r.run_id for r in instance.get_runs()} - runs_before - {r.run_id for r in runs}
    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None
    assert set(backfill.reserved_run_ids) == {r.run_id for r in runs}
    assert targeted(backfill) == {k: set(seeded.failed) for k in ANALYSIS_KEYS}
    assert_only_the_failed_rerun(
        instance,
        simulator,
        seeded,
        runs,
        before,
        last_materialized,
        accelerated=True,
        most_runs=2,
    )


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the CLI's runs: on SQLite
def test_a_ui_failed_backfill_of_scattered_failures_on_dagsters_own_storage(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    webserver: DagsterProcess,
    tmp_path: Path,
) -> None:
    """dagster-postgres's own storage, no accelerator, no switch: 10 failures scattered over 40
    documents, and the UI's "Failed" backfill launched while the daemon runs, at whatever moment
    of its backfill loop. Each failed document is analysed exactly once (one call each, counted at
    the endpoint) in one run, by at most ceil(10 / run size) + max_concurrent_runs runs that
    worked (Dagster's own plan: 10); the backfill completes and Dagster shows none FAILED.
    (``benchmarks/scattered.py --stock --via ui`` measures 50 over 1,000.)"""
    webserver.start()  # it loads while the documents are run
    seeded = seed(tmp_path, simulator, count=40, network=range(1, 40, 4), low_confidence=())
    assert_seeded(instance, seeded, simulator)
    simulator.set_faults([])
    before = calls(simulator, seeded.ids)
    last_materialized = {
        i: latest_materialization(instance, ANALYSIS_RESULTS, i).run_id for i in seeded.untouched
    }
    daemon.start()
    webserver.wait_ready(locations_loaded=True)
    moment = random.uniform(0, BACKFILL_LOOP_SECONDS)
    time.sleep(moment)

    backfill_id = launch_ui_backfill(webserver, seeded.failed)
    wait_for(
        daemon,
        f"backfill {backfill_id} to end (launched {moment:.1f} s into the daemon's run)",
        lambda: backfill_ended(instance, backfill_id),
        # Dagster creates the backfill's 10 runs first, a second or more each on a busy machine.
        timeout=2 * BACKFILL_DEADLINE_SECONDS,
    )

    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None and backfill.status == BulkActionStatus.COMPLETED_SUCCESS
    slots = instance.get_concurrency_config().run_queue_config.max_concurrent_runs  # type: ignore[union-attr]
    run_size = planned_run_size(instance, len(seeded.failed))
    assert_only_the_failed_rerun(
        instance,
        simulator,
        seeded,
        backfill_runs(instance, backfill_id),
        before,
        last_materialized,
        accelerated=False,
        most_runs=-(-len(seeded.failed) // run_size) + slots,
    )


# --- 2. the CLI -----------------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # one backend: see the docstring
def test_cli_backfill_plans_by_category_then_waits_for_the_daemon(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``backfill`` plans by category (people's left out), launches nothing dry, and can wait."""
    seeded = seed(tmp_path, simulator)
    assert_seeded(instance, seeded, simulator)
    simulator.set_faults([])
    before = calls(simulator, seeded.ids)
    (low,) = seeded.low_confidence

    code, plan = run_cli(
        capsys, "backfill", "--failed", "--category", "NETWORK_TIMEOUT", "--dry-run", "--json"
    )
    assert code == 0
    assert (plan["dry_run"], plan["backfill_id"]) == (True, None)
    assert [(d["document_id"], d["category"]) for d in plan["selected"]] == [
        (i, "NETWORK_TIMEOUT") for i in seeded.network
    ]
    assert [(d["document_id"], d["skipped"]) for d in plan["skipped"]] == [
        (low, "category LOW_CONFIDENCE not selected")
    ]
    # Without --category: every retryable failure; the categories that need a person left out.
    code, default = run_cli(capsys, "backfill", "--failed", "--dry-run", "--json")
    assert code == 0
    assert [d["document_id"] for d in default["selected"]] == seeded.network
    assert [(d["document_id"], d["category"]) for d in default["skipped"]] == [
        (low, "LOW_CONFIDENCE")
    ]
    assert "needs a person" in default["skipped"][0]["skipped"]
    assert instance.get_backfills() == []
    assert calls(simulator, seeded.ids) == before

    daemon.start()

    code, out = run_cli(
        capsys,
        *("backfill", "--failed", "--category", "NETWORK_TIMEOUT"),
        *("--wait", "--timeout", str(BACKFILL_DEADLINE_SECONDS), "--json"),
    )

    assert code == 0, out
    assert out["status"] == "COMPLETED_SUCCESS"
    # --wait returned once the runs had ended the documents; the daemon's next loop agrees.
    (backfill,) = wait_for(daemon, "the backfill's end recorded", lambda: ended_backfills(instance))
    assert backfill.backfill_id == out["backfill_id"]
    assert backfill.status.value == out["status"]
    assert targeted(backfill) == {k: set(seeded.network) for k in ANALYSIS_KEYS}
    assert [(d["document_id"], d["state"]) for d in out["documents"]] == [
        (i, "COMPLETED") for i in seeded.network
    ]
    reran = [k for r in backfill_runs(instance, backfill.backfill_id) for k in covered(instance, r)]
    assert sorted(reran) == sorted(seeded.network)
    assert calls(simulator, seeded.ids) == {
        i: before[i] + 1 if i in seeded.network else before[i] for i in seeded.ids
    }
    assert states(seeded.ids) == {i: ("COMPLETED", None) for i in seeded.ids} | {
        low: ("FAILED", "LOW_CONFIDENCE")
    }
    assert dagster_failed(instance, seeded.ids) == [low]


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the planning knows no backend
@pytest.mark.parametrize(
    ("accelerated", "opaque"),
    [(False, False), (True, False), (False, True)],
    indirect=["accelerated"],
    ids=["stock", "accelerated", "runs-not-in-sql"],
)
def test_cli_backfill_of_scattered_failures_runs_them_in_runs_of_the_run_size(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    accelerated: bool,
    opaque: bool,
) -> None:
    """Six failures scattered over 24 documents, three documents per backfill run, two run slots:
    ``backfill --failed`` reruns them in few runs (Dagster's own planning: six, one per
    document), one call each, each document in one run: two runs with the accelerator, which
    plans them; on Dagster's own storage at most the two Dagster starts before the queued ones
    are replaced, plus the two that replace them — also with a run storage that is not SQL
    (Dagster+'s case), where no sensor tick fails. The completed documents between them get no
    call, and every document's status and checks in Dagster are exact."""
    home = Path(os.environ["DAGSTER_HOME"])
    if opaque:
        # The processes' instance; this test's reads the same files through Dagster's own.
        config = home / "dagster.yaml"
        config.write_text(config.read_text() + "\n" + opaque_run_storage_yaml(home))
        with dg.DagsterInstance.from_config(str(home)) as theirs:
            assert type(theirs.run_storage).__name__ == "OpaqueRunStorage"
    seeded, before, last_materialized = seed_scattered(
        instance, simulator, tmp_path, monkeypatch, home
    )
    daemon.start()

    out = subprocess.run(
        [sys.executable, "-m", "ai_pipeline.cli", "backfill", "--failed", "--wait", "--json"],
        capture_output=True,
        text=True,
        timeout=BACKFILL_DEADLINE_SECONDS,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)

    assert report["status"] == "COMPLETED_SUCCESS"
    # --wait returns once the documents are settled; their last events follow as the runs close.
    (backfill,) = wait_for(daemon, "the backfill's end recorded", lambda: ended_backfills(instance))
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS
    runs = backfill_runs(instance, report["backfill_id"])
    if accelerated:
        assert len(runs) == 2
    assert_only_the_failed_rerun(
        instance,
        simulator,
        seeded,
        runs,
        before,
        last_materialized,
        accelerated=accelerated,
        most_runs=2 if accelerated else 2 + 2,
    )
    failed_ticks = [
        (state.instigator_name, tick.error)
        for state in instance.all_instigator_state()
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id)
        if tick.status.value == "FAILURE"
    ]
    assert failed_ticks == []


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the wait knows no backend
def test_submit_wait_returns_when_its_runs_end_and_a_resubmission_launches_at_once(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    dagster_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under Dagster's own 30 s backfill loop: ``submit --wait`` returns as soon as its run has
    settled the pending document (failed again), while the backfill is still recorded REQUESTED;
    submitting again at once launches a new backfill (the first one's work is over, its run
    closed) instead of waiting for the first; the daemon then records for each the status the
    command printed."""
    seeded = seed(tmp_path, simulator, count=3, network=(1,), low_confidence=())
    (failing,) = seeded.network
    submit = ("submit", str(seeded.inbox), "--batch", "b", "--wait", "--json")
    with running(
        DagsterProcess.daemon(tmp_path / "daemon-30s.log", backfill_loop_seconds=30), dagster_home
    ) as daemon:
        daemon.start()

        code, first = run_cli(capsys, *submit)  # the 503s go on: the document fails again

        assert (code, first["status"], first["failed_ids"]) == (1, "COMPLETED_FAILED", [failing])
        recorded = instance.get_backfill(first["backfill_id"])
        assert recorded is not None and recorded.status == BulkActionStatus.REQUESTED
        simulator.set_faults([])

        code, second = run_cli(capsys, *submit)

        assert (code, second["already_running"], second["status"]) == (
            0,
            False,
            "COMPLETED_SUCCESS",
        )
        assert second["backfill_id"] != first["backfill_id"]
        assert states(seeded.ids) == {i: ("COMPLETED", None) for i in seeded.ids}
        assert simulator.requests_for(task_of(failing)) >= 1
        ended_ones = wait_for(
            daemon,
            "the daemon to record both backfills",
            lambda: (found := ended_backfills(instance)) and len(found) == 2 and found,
            timeout=150,
        )
        printed = {first["backfill_id"]: first["status"], second["backfill_id"]: second["status"]}
        assert {b.backfill_id: b.status.value for b in ended_ones} == printed


@pytest.mark.accelerated
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the submission knows no backend
def test_submit_starts_its_planned_runs_without_waiting_for_the_backfill_loop(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    dagster_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a daemon whose backfill loop comes round again only after ten minutes (Dagster's
    comes every 30 s), ``submit --wait`` of seven documents in runs of three returns with all
    seven done: the command submitted the three runs it planned itself, under the run ids the
    backfill reserved for them (the daemon, on its next loop, skips runs that exist), from the
    code location the daemon runs."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "3")
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(960 + i) for i in range(7)})
    submit = ("submit", str(inbox), "--batch", "now", "--wait", "--json", "--timeout", "150")
    slow_loop = DagsterProcess.daemon(tmp_path / "daemon.log", backfill_loop_seconds=600)
    with running(slow_loop, dagster_home) as daemon:
        daemon.start()
        # A deployment's daemon runs before batches come: its sensors are ticking.
        wait_for(daemon, "the daemon's sensors", lambda: daemon_location(instance) is not None)

        code, out = run_cli(capsys, *submit)

        assert (code, out["status"], out["succeeded"]) == (0, "COMPLETED_SUCCESS", 7), out
        backfill = instance.get_backfill(out["backfill_id"])
        assert backfill is not None and backfill.status == BulkActionStatus.REQUESTED
        runs = backfill_runs(instance, out["backfill_id"])
        assert sorted(r.run_id for r in runs) == sorted(backfill.reserved_run_ids)
        assert len(runs) == 3
        assert {r.remote_job_origin.location_name for r in runs if r.remote_job_origin} == {
            "ai_pipeline"
        }
        ids = results_store().batches.get(out["batch_id"]).document_ids
        assert states(ids) == {i: ("COMPLETED", None) for i in ids}
        assert calls(simulator, ids) == {i: 1 for i in ids}


# --- 3. the nightly schedule ----------------------------------------------------------------------


def evaluate_nightly(instance: dg.DagsterInstance, night: datetime) -> Any:
    from ai_pipeline.definitions import defs

    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=night,
        resources={"results_store": ResultsStore()},
        repository_def=repository_of(defs, instance),
    )
    return repository_of(defs, instance).get_schedule_def("nightly_retry_schedule")(context)


def seed_night(
    instance: dg.DagsterInstance, simulator: Any, tmp_path: Path
) -> tuple[Any, Any, str]:
    """Three network failures, the last moved to the dead letter: (seeded, retryable, dead)."""
    seeded = seed(tmp_path, simulator, network=(1, 5, 6))
    assert_seeded(instance, seeded, simulator)
    simulator.set_faults([])
    dead = seeded.network[-1]
    results_store().documents.transition(dead, State.DEAD_LETTER)
    return seeded, seeded.network[:-1], dead


def test_nightly_schedule_backfills_retryable_failures_once_per_night(
    instance: dg.DagsterInstance, simulator: Any, tmp_path: Path
) -> None:
    """A night's tick backfills the retryable failures once (no dead letter); none: the report."""
    seeded, retryable, dead = seed_night(instance, simulator, tmp_path)
    night = datetime(2026, 3, 14, 2, 0, tzinfo=timezone.utc)

    first = evaluate_nightly(instance, night)

    assert isinstance(first, dg.SkipReason), first
    (backfill,) = instance.get_backfills()
    assert backfill.backfill_id == backfill_id_for("nightly-2026-03-14")
    assert backfill.backfill_id in (first.skip_message or "")
    assert backfill.tags[NIGHTLY_TAG] == "2026-03-14"
    assert targeted(backfill) == {k: set(retryable) for k in ANALYSIS_KEYS}

    # The same night evaluated again (a retried tick): still the one backfill.
    again = evaluate_nightly(instance, night)
    assert isinstance(again, dg.SkipReason)
    assert [b.backfill_id for b in instance.get_backfills()] == [backfill.backfill_id]

    # The retryable ones fixed; what is left needs a person or is dead: the report, no backfill.
    launcher().execute(retryable)
    assert states(retryable) == {i: ("COMPLETED", None) for i in retryable}
    next_night = evaluate_nightly(instance, night + timedelta(days=1))
    assert isinstance(next_night, dg.RunRequest), next_night
    assert next_night.run_key == "report-2026-03-15"
    assert next_night.tags[NIGHTLY_TAG] == "2026-03-15"
    assert len(instance.get_backfills()) == 1
    assert states([dead])[dead][0] == "DEAD_LETTER"


def nightly_backfills(instance: dg.DagsterInstance) -> list[Any]:
    return [b for b in instance.get_backfills() if NIGHTLY_TAG in b.tags]


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # one backend: see the docstring
def test_nightly_tick_backfills_then_reports(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's nightly tick backfills the retryable failures, and the report follows it."""
    seeded, retryable, dead = seed_night(instance, simulator, tmp_path)
    (low,) = seeded.low_confidence
    before = calls(simulator, seeded.ids)
    # Read when the daemon's code server imports the definitions: every minute is "the night".
    monkeypatch.setenv("AI_PIPELINE_NIGHTLY_CRON", "* * * * *")
    daemon.start()

    def nightly_ended() -> Any:
        # Judged on the records returned, so that the test reads the statuses it waited for.
        found = nightly_backfills(instance)
        return found and all(ended(b) for b in found) and found

    (backfill, *later) = wait_for(daemon, "the nightly backfill to end", nightly_ended)
    assert not later or backfill.tags[NIGHTLY_TAG] != later[0].tags[NIGHTLY_TAG]  # past midnight
    assert backfill.backfill_id == backfill_id_for(f"nightly-{backfill.tags[NIGHTLY_TAG]}")
    assert targeted(backfill) == {k: set(retryable) for k in ANALYSIS_KEYS}
    assert backfill.status.value == "COMPLETED_SUCCESS"
    ended_at = backfill.backfill_end_timestamp or time.time()

    def report_after_backfill() -> Any:
        event = instance.get_latest_materialization_event(REPORT)
        return event is not None and event.timestamp >= ended_at and event

    event = wait_for(daemon, "the failure report", report_after_backfill, DEADLINE_SECONDS)
    print(f"the report {event.timestamp - ended_at:.1f} s after the backfill's end")

    assert states(seeded.ids) == {i: ("COMPLETED", None) for i in seeded.ids} | {
        low: ("FAILED", "LOW_CONFIDENCE"),
        dead: ("DEAD_LETTER", "NETWORK_TIMEOUT"),
    }
    assert calls(simulator, seeded.ids) == {
        i: before[i] + 1 if i in retryable else before[i] for i in seeded.ids
    }
    metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    expected = build_report(results_store())
    assert (metadata["documents"], metadata["success_rate"], metadata["failed"]) == (
        expected["documents"],
        expected["success_rate"],
        2,
    )
    assert (expected["documents"], expected["success_rate"]) == (8, 0.75)


# --- 4. batches -----------------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # one backend: see the docstring
def test_batch_resubmission_resumes_only_the_failed_document(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon_env: None,
    daemon: DagsterProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A batch reports its failed document; resubmitted, the same batch reruns only that one."""
    texts = {f"contract-{i}.txt": sample_text(700 + i) for i in range(5)}
    inbox = make_inbox(tmp_path / "contracts", texts)
    ids = launcher().register_inbox(inbox).document_ids
    bad = ids[2]
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(bad)}])
    daemon.start()

    submit = ("submit", str(inbox), "--batch", "nightly-contracts", "--wait", "--json")
    code, first = run_cli(capsys, *submit, "--timeout", str(BACKFILL_DEADLINE_SECONDS))

    assert code == 1, "a document of the batch failed"
    batch_id = batch_key(sorted(ids))
    assert first["batch_id"] == batch_id
    assert (first["pending_at_submit"], first["status"]) == (5, "COMPLETED_FAILED")
    code, summary = run_cli(capsys, "batch", batch_id, "--json")
    assert code == 0
    assert summary["name"] == "nightly-contracts"
    assert (summary["total"], summary["succeeded"], summary["failed"], summary["pending"]) == (
        5,
        4,
        1,
        0,
    )
    assert summary["failed_ids"] == [bad]
    assert summary["failures"][bad]["category"] == "NETWORK_TIMEOUT"
    assert calls(simulator, ids) == {i: 3 if i == bad else 1 for i in ids}

    simulator.set_faults([])
    # A fresh daemon's first backfill iteration runs at once; this one would sleep out its 30 s.
    daemon.stop()
    daemon.start()
    code, second = run_cli(capsys, *submit, "--timeout", str(BACKFILL_DEADLINE_SECONDS))

    assert code == 0, second
    assert second["batch_id"] == batch_id
    assert second["pending_at_submit"] == 1
    assert second["status"] == "COMPLETED_SUCCESS"
    assert second["backfill_id"] != first["backfill_id"]
    resubmitted = instance.get_backfill(second["backfill_id"])
    assert resubmitted is not None
    assert targeted(resubmitted) == {k: {bad} for k in ANALYSIS_KEYS}
    assert resubmitted.tags["ai_pipeline/batch"] == batch_id
    reran = [
        k for r in backfill_runs(instance, second["backfill_id"]) for k in covered(instance, r)
    ]
    assert reran == [bad]
    assert (second["total"], second["succeeded"], second["failed"], second["failed_ids"]) == (
        5,
        5,
        0,
        [],
    )
    assert calls(simulator, ids) == {i: 4 if i == bad else 1 for i in ids}
    # --wait returns once the document is settled; its run writes its last events as it closes.
    wait_for(
        daemon,
        "the resubmission's runs to end",
        lambda: all(r.status in TERMINAL for r in backfill_runs(instance, second["backfill_id"])),
    )
    assert statuses(instance, ANALYSIS_RESULTS, ids) == {i: STATUS.MATERIALIZED for i in ids}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # exit codes know no backend
@pytest.mark.parametrize("verdict", ["COMPLETED_FAILED", "COMPLETED_SUCCESS"])
def test_submit_wait_exits_1_while_a_document_of_the_batch_is_failed(
    instance: dg.DagsterInstance,
    simulator: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    verdict: str,
) -> None:
    """``submit --wait`` exits 1 while a document of its batch is failed, whatever status its
    backfill ended in: the exit code and the failures listed come from the batch's documents."""
    seeded = seed(tmp_path, simulator, count=3, network=(1,), low_confidence=())
    # No daemon runs the backfill: it ends as stubbed here, and its documents stay as they were.
    monkeypatch.setattr(launch, "wait_for_backfill", lambda *_a, **_kw: verdict)

    code, out = run_cli(capsys, "submit", str(seeded.inbox), "--batch", "b", "--wait", "--json")

    assert code == 1
    assert (out["failed_ids"], out["succeeded"], out["pending"]) == (seeded.network, 2, 0)
    assert out["failures"][seeded.network[0]]["category"] == "NETWORK_TIMEOUT"


def test_resubmitting_a_batch_whose_backfill_is_queued_launches_nothing(
    instance: dg.DagsterInstance,
    simulator: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No daemon runs here, so the first submit's backfill stays queued: submitting the batch again
    names that backfill, launches nothing new, and says so; once the backfill is over, a
    resubmission launches again."""
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(i) for i in range(3)})
    submit = ("submit", str(inbox), "--batch", "weekly", "--json")

    code, first = run_cli(capsys, *submit)
    assert code == 0 and first["backfill_id"] and first["already_running"] is False
    code, second = run_cli(capsys, *submit)
    assert code == 0
    assert (second["backfill_id"], second["already_running"]) == (first["backfill_id"], True)
    assert [b.backfill_id for b in instance.get_backfills()] == [first["backfill_id"]]
    assert simulator.stats()["total"] == 0

    capsys.readouterr()
    assert main(["submit", str(inbox), "--batch", "weekly"]) == 0
    text = capsys.readouterr().out
    assert f"its backfill {first['backfill_id']} is still queued or running" in text
    assert "nothing new launched" in text

    backfill = instance.get_backfill(first["backfill_id"])
    assert backfill is not None
    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELED))
    code, third = run_cli(capsys, *submit)
    assert third["already_running"] is False
    assert third["backfill_id"] not in (None, first["backfill_id"])
    assert len(instance.get_backfills()) == 2


# --- 5. the run size and the end of a wait --------------------------------------------------------


@pytest.mark.parametrize(
    ("documents", "slots", "concurrency", "cap", "size", "runs"),
    [
        (1000, 4, 8, None, 250, 4),  # one wave: ceil(1,000 / 4)
        (10_000, 4, 4, None, 2500, 4),
        (10_001, 4, 4, None, 1251, 8),  # above 4 × 2,500: two full waves of equal runs
        (50, 4, 4, None, 13, 4),  # 50 scattered failures
        (6, 4, 8, None, 6, 1),  # too few to keep four runs' calls busy: one run
        (1000, None, 8, None, 100, 10),  # no run queue: the size Dagster plans UI backfills with
        (1000, 0, 8, None, 100, 10),  # a closed queue
        (1000, 4, 8, 16, 500, 2),  # a global cap of 16 calls: two runs of 8 have them all out
        (1000, 4, 8, 20, 334, 3),  # 20: a third run takes the last 4
        (1000, 4, 8, 5, 1000, 1),  # a cap below one run's concurrency: one run
        (1000, 4, 8, 64, 250, 4),  # a cap above the slots' calls changes nothing
    ],
)
def test_backfill_run_size_fills_the_run_slots_in_one_wave(
    documents: int, slots: int | None, concurrency: int, cap: int | None, size: int, runs: int
) -> None:
    """The run size of a planned backfill is ceil(documents / max_concurrent_runs), so that its
    runs start in one wave; at least the runs' LLM concurrency, at most 2,500 a run; under a
    global cap, over only as many slots as can have calls out at once."""
    assert backfill_run_size(documents, slots, concurrency, global_llm_concurrency=cap) == size
    ids = [f"{i:016x}" for i in range(documents)]
    assert len(plan_runs(ids, ids, size)) == runs


@pytest.mark.accelerated
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the queue's config, not storage
def test_a_launched_backfill_takes_its_run_size_from_max_concurrent_runs(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the checkout's dagster.yaml (``max_concurrent_runs: 4``) and no
    AI_PIPELINE_BACKFILL_RUN_SIZE, 40 documents are planned as four runs of ten, one wave; the
    setting, when given, is the run size."""
    from ai_pipeline.definitions import defs

    monkeypatch.delenv("AI_PIPELINE_BACKFILL_RUN_SIZE", raising=False)
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "8")
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None and queue.max_concurrent_runs == 4
    ids = [f"{i:016x}" for i in range(40)]
    add_partitions(instance, ids)
    graph = repository_of(defs, instance).asset_graph

    def planned(name: str) -> list[int]:
        backfill = instance.get_backfill(launch_backfill(instance, graph, ids, title=name))
        assert backfill is not None
        return [len(covered_by(r, ids)) for r in backfill.submitting_run_requests]

    assert planned_run_size(instance, len(ids)) == 10
    assert planned("auto") == [10, 10, 10, 10]
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "25")
    assert planned("override") == [25, 15]


@pytest.mark.accelerated
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # Dagster's cursor, not storage
def test_a_planned_backfill_counts_the_materializations_from_the_first_event_on(
    instance: dg.DagsterInstance,
) -> None:
    """A planned backfill's cursor (after which the daemon counts materializations as its
    progress) is the event log's last id, and 0 on an empty one: with none, the daemon counts no
    materialization, and the first batch of an instance, its runs over before the daemon's next
    loop, ended COMPLETED_FAILED with every document done."""
    from ai_pipeline.definitions import defs

    ids = [f"{i:016x}" for i in range(3)]
    add_partitions(instance, ids)
    graph = repository_of(defs, instance).asset_graph

    def cursor() -> int | None:
        backfill = instance.get_backfill(launch_backfill(instance, graph, ids, title="first"))
        assert backfill is not None and backfill.asset_backfill_data is not None
        return backfill.asset_backfill_data.latest_storage_id

    assert instance.event_log_storage.get_maximum_record_id() is None
    assert cursor() == 0
    instance.report_runless_asset_event(dg.AssetMaterialization("elsewhere"))
    last = instance.event_log_storage.get_maximum_record_id()
    assert last is not None and last > 0
    assert cursor() == last


def covered_by(request: dg.RunRequest, keys: list[str]) -> list[str]:
    """The documents of a planned run: those its config names, else its whole range of ``keys``."""
    named = named_in(request.run_config)
    if named is not None:
        return sorted(named)
    start = keys.index(request.tags["dagster/asset_partition_range_start"])
    return keys[start : keys.index(request.tags["dagster/asset_partition_range_end"]) + 1]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the wait knows no backend
def test_wait_returns_when_the_last_document_settles_not_when_its_run_closes(
    instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--wait``'s wait returns, with the status the backfill will end in, as soon as its last
    document has settled in the results store, while its run is still STARTED (closing) and
    the backfill still recorded REQUESTED — not when the run ends, nor at the daemon's next loop;
    until then it waits."""
    from ai_pipeline.definitions import defs

    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(i) for i in range(3)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    backfill_id = launch_backfill(
        instance, repository_of(defs, instance).asset_graph, ids, title="t"
    )
    run = dg.DagsterRun(
        job_name="analysis_job",
        run_id=str(uuid.uuid4()),
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/backfill": backfill_id},
    )
    instance.add_run(run)
    store = results_store()
    for document in ids:
        store.documents.transition(document, State.RUNNING, through=State.QUEUED, run_id=run.run_id)

    def wait(timeout: float) -> str:
        return wait_for_backfill(
            instance,
            backfill_id,
            timeout=timeout,
            poll=0.05,
            ended_in=lambda runs: store.documents.ended_in(ids, runs),
            all_completed=lambda: store.documents.count_by_state(ids) == {State.COMPLETED: 3},
        )

    for document in ids[:-1]:
        store.documents.transition(document, State.COMPLETED)
    reads = []
    read = instance.get_backfill
    monkeypatch.setattr(instance, "get_backfill", lambda b: reads.append(b) or read(b))
    with pytest.raises(TimeoutError):
        wait(0.3)  # the last document is still RUNNING
    # Settled from the documents, the wait reads the backfill itself (every partition it
    # targets, deserialized) once, not at each of its six polls.
    assert reads == [backfill_id]
    store.documents.transition(ids[-1], State.COMPLETED)
    started = time.monotonic()

    assert wait(30) == "COMPLETED_SUCCESS"

    assert time.monotonic() - started < 2
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
    recorded = instance.get_backfill(backfill_id)
    assert recorded is not None and recorded.status == BulkActionStatus.REQUESTED


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the wait knows no backend
def test_a_document_failed_in_a_lost_run_is_not_settled_while_its_retry_runs(
    instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    """A run lost with its worker host: its documents are FAILED (RUN_INTERRUPTED) in it, and the
    daemon's retry of it is STARTED, about to take them up. Every document has ended in one of the
    backfill's runs, but the batch is not over: ``--wait``'s early answer must wait for the retry
    (once seen: ``submit --wait`` exited 1 with 5 documents the retry then completed)."""
    from ai_pipeline.definitions import defs
    from ai_pipeline.failures import Category

    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(i) for i in range(3)})
    ids = launcher(instance).register_inbox(inbox).document_ids
    backfill_id = launch_backfill(
        instance, repository_of(defs, instance).asset_graph, ids, title="t"
    )
    lost, retry = str(uuid.uuid4()), str(uuid.uuid4())
    tags = {"dagster/backfill": backfill_id}
    lost_tags = tags | {"dagster/will_retry": "true", "dagster/auto_retry_run_id": retry}
    instance.add_run(
        dg.DagsterRun(
            job_name="analysis_job",
            run_id=lost,
            status=dg.DagsterRunStatus.FAILURE,
            tags=lost_tags,
        )
    )
    instance.add_run(
        dg.DagsterRun(
            job_name="analysis_job", run_id=retry, status=dg.DagsterRunStatus.STARTED, tags=tags
        )
    )
    store = results_store()
    for document in ids:
        store.documents.transition(document, State.RUNNING, through=State.QUEUED, run_id=lost)
    store.documents.transition(ids[0], State.COMPLETED)
    for document in ids[1:]:
        store.documents.transition(document, State.FAILED, category=Category.RUN_INTERRUPTED)

    def settled() -> str | None:
        return documents_settled_status(
            instance,
            backfill_id,
            lambda runs: store.documents.ended_in(ids, runs),
            lambda: store.documents.count_by_state(ids) == {State.COMPLETED: 3},
        )

    assert store.documents.ended_in(ids, [lost, retry])
    assert settled() is None, "the retry is still to take up the two failed documents"
    for document in ids[1:]:
        store.documents.transition(document, State.RUNNING, through=State.QUEUED, run_id=retry)
        store.documents.transition(document, State.COMPLETED)
    assert settled() == "COMPLETED_SUCCESS"


def test_a_failed_run_the_daemon_may_yet_retry_keeps_its_backfill_unsettled(
    instance: dg.DagsterInstance,
) -> None:
    """A worker lost mid-run: its run FAILED, its documents failed RUN_INTERRUPTED, and the daemon
    retries it a moment later. Until the retry exists — also in the instant before Dagster tags
    the failed run ``will_retry`` — a ``--wait`` must not call the backfill over."""
    assert instance.run_retries_enabled, "the checkout's dagster.yaml retries failed runs"

    def run(status: dg.DagsterRunStatus, **tags: str) -> dg.DagsterRun:
        return dg.DagsterRun(job_name="__ASSET_JOB", status=status, tags=tags)

    done = run(dg.DagsterRunStatus.SUCCESS)
    failed = dg.DagsterRunStatus.FAILURE
    assert not retry_pending(instance, [done])
    assert retry_pending(instance, [done, run(failed)]), "not tagged yet: undecided"
    assert retry_pending(instance, [done, run(failed, **{"dagster/will_retry": "true"})])
    assert not retry_pending(instance, [done, run(failed, **{"dagster/will_retry": "false"})])
    retried = {"dagster/will_retry": "true", "dagster/auto_retry_run_id": "r2"}
    assert not retry_pending(instance, [done, run(failed, **retried)]), "its retry is a run"


def add_ui_backfill(
    instance: dg.DagsterInstance,
    graph: Any,
    backfill_id: str,
    documents: list[str],
    *extra: dg.AssetKey,
    **tags: str,
) -> None:
    """A backfill as the UI's "Launch backfill" creates it: the analysis's stages (and ``extra``)
    for ``documents``, nothing planned."""
    from ai_pipeline.defs.dagster_private import PartitionBackfill

    instance.add_backfill(
        PartitionBackfill.from_asset_partitions(
            backfill_id=backfill_id,
            asset_graph=graph,
            partition_names=documents,
            asset_selection=[*ANALYSIS_KEYS, *extra],
            backfill_timestamp=time.time(),
            tags=tags,
            dynamic_partitions_store=instance,
            all_partitions=False,
            title=None,
            description=None,
            run_config=None,
        )
    )


@pytest.mark.accelerated
def test_the_backfill_planner_plans_only_the_ui_backfills_dagster_would_cut_finer(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backfills as the UI creates them (no tag of this package), three documents per run: six
    scattered documents of the analysis's stages get two planned runs naming their documents
    (Dagster's plan: six); three contiguous ones (one run either way), a selection that also
    takes ``failure_report``, and a backfill this package launched are left as they are. The
    cursor skips what a tick saw; a backfill written by someone else between the read and the
    write keeps what they wrote."""
    from ai_pipeline.accelerator.backfills import replace_backfill
    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.acceleration import backfill_acceleration
    from ai_pipeline.defs.backfill_planner import plan, plan_new_backfills
    from ai_pipeline.defs.site import DEFAULT_SITE

    acceleration = backfill_acceleration(instance)
    assert acceleration is not None
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "3")
    keys = [f"{i:016x}" for i in range(12)]
    add_partitions(instance, keys)
    graph = repository_of(defs, instance).asset_graph

    def ui(backfill_id: str, documents: list[str], *extra: dg.AssetKey, **tags: str) -> None:
        add_ui_backfill(instance, graph, backfill_id, documents, *extra, **tags)

    scattered = keys[0:12:2]
    ui("scattered", scattered)
    ui("contiguous", keys[1:4])
    ui("withreport", keys[1:12:4], REPORT)
    ui("launched", keys[1:12:4], **{BACKFILL_TAG: "failed"})

    planned, cursor = plan_new_backfills(instance, graph, DEFAULT_SITE, None, acceleration)

    assert [(p.backfill_id, p.documents, p.runs, p.dagster_runs) for p in planned] == [
        ("scattered", 6, 2, 6)
    ]
    backfill = instance.get_backfill("scattered")
    assert backfill is not None
    assert [covered_by(r, keys) for r in backfill.submitting_run_requests] == [
        scattered[:3],
        scattered[3:],
    ]
    assert len(set(backfill.reserved_run_ids)) == 2
    assert {tuple(r.asset_selection or ()) for r in backfill.submitting_run_requests} == {
        tuple(ANALYSIS_KEYS)
    }
    for left in ("contiguous", "withreport", "launched"):
        other = instance.get_backfill(left)
        assert other is not None and not other.submitting_run_requests, left
    assert plan_new_backfills(instance, graph, DEFAULT_SITE, cursor, acceleration)[0] == []

    ui("raced", keys[0:12:3])

    def written_in_between(stored: Any) -> Any:
        instance.update_backfill(stored.with_failure_count(1))  # the daemon, say
        result = plan(instance, graph, stored, DEFAULT_SITE, acceleration)
        assert result is not None
        return result[0]

    assert replace_backfill(instance, "raced", written_in_between) is None
    raced = instance.get_backfill("raced")
    assert raced is not None
    assert (raced.failure_count, raced.submitting_run_requests) == (1, [])


def planned_after_the_daemon_read_it(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], Any, Any]:
    """A UI backfill of six scattered documents (runs of three), read as the daemon's iteration
    reads it, then planned by the backfill planner: the documents, what the daemon read, and the
    planned backfill as stored."""
    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.acceleration import backfill_acceleration
    from ai_pipeline.defs.backfill_planner import plan_new_backfills
    from ai_pipeline.defs.site import DEFAULT_SITE

    acceleration = backfill_acceleration(instance)
    assert acceleration is not None
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_RUN_SIZE", "3")
    keys = [f"{i:016x}" for i in range(12)]
    add_partitions(instance, keys)
    graph = repository_of(defs, instance).asset_graph
    scattered = keys[0:12:2]
    add_ui_backfill(instance, graph, "ui", scattered)
    read_by_the_daemon = instance.get_backfill("ui")
    assert read_by_the_daemon is not None
    planned, _ = plan_new_backfills(instance, graph, DEFAULT_SITE, None, acceleration)
    assert [p.backfill_id for p in planned] == ["ui"]
    ours = instance.get_backfill("ui")
    assert ours is not None and len(ours.reserved_run_ids) == 2
    return scattered, read_by_the_daemon, ours


@pytest.mark.accelerated
def test_a_plan_made_before_the_planners_is_refused_not_written_over_it(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster's backfill daemon read a UI backfill, then the planner planned it: the daemon's plan,
    made from what it read (one run per document, under its own run ids), is refused by the run
    storage before it could submit anything, and the planner's runs stay the backfill's. The
    writes Dagster makes while submitting a plan, counting a failure or canceling go through, and
    once nothing waits a next plan does."""
    from ai_pipeline.accelerator.backfill_writes import PlanMadeMeanwhile
    from ai_pipeline.accelerator.internals import make_new_run_id
    from ai_pipeline.defs.dagster_private import BulkActionStatus

    scattered, read_by_the_daemon, ours = planned_after_the_daemon_read_it(instance, monkeypatch)

    per_document = [
        dg.RunRequest(partition_key=k, asset_selection=ANALYSIS_KEYS) for k in scattered
    ]
    daemons = read_by_the_daemon.with_submitting_run_requests(
        per_document, [make_new_run_id() for _ in per_document]
    )
    with pytest.raises(PlanMadeMeanwhile, match="ui not written"):
        instance.update_backfill(daemons)
    assert instance.get_backfill("ui") == ours

    # Dagster submitting the stored plan: the runs left to submit, then none.
    instance.update_backfill(
        ours.with_submitting_run_requests(
            ours.submitting_run_requests[1:], ours.reserved_run_ids[1:]
        ).with_failure_count(1)
    )
    stored = instance.get_backfill("ui")
    assert stored is not None
    assert (stored.reserved_run_ids, stored.failure_count) == (ours.reserved_run_ids[1:], 1)
    instance.update_backfill(stored.with_status(BulkActionStatus.CANCELING))
    stored = instance.get_backfill("ui")
    assert stored is not None and stored.status == BulkActionStatus.CANCELING
    instance.update_backfill(stored.with_submitting_run_requests([], []))
    nothing_waits = instance.get_backfill("ui")
    assert nothing_waits is not None and not nothing_waits.submitting_run_requests
    instance.update_backfill(daemons)  # a next plan, over a backfill with no runs waiting
    stored = instance.get_backfill("ui")
    assert stored is not None and stored.reserved_run_ids == daemons.reserved_run_ids


@pytest.mark.accelerated
def test_the_daemons_iteration_from_a_read_before_the_plan_submits_nothing_then_resumes_it(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster's own backfill iteration (what the daemon's loop calls), given the UI backfill as
    it read it before the planner planned it: the write of its plan is refused, it submits no run
    and counts one failure it will retry; its next iteration, on the backfill as stored, submits
    the planner's runs under the planner's run ids — each document in one run."""
    import logging

    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._daemon.backfill import execute_backfill_iteration_with_instigation_logger

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the runs' config; nothing is called
    scattered, read_by_the_daemon, ours = planned_after_the_daemon_read_it(instance, monkeypatch)

    target = InProcessWorkspaceLoadTarget(
        InProcessCodeLocationOrigin(
            LoadableTargetOrigin(
                executable_path=sys.executable,
                module_name="ai_pipeline.definitions",
                attribute="defs",
            ),
            location_name="ai_pipeline",
        )
    )
    logger = logging.getLogger("backfill-test")
    with WorkspaceProcessContext(instance, target) as context:
        errors = list(
            execute_backfill_iteration_with_instigation_logger(
                read_by_the_daemon, logger, context, instance
            )
        )
        assert [e is not None and "PlanMadeMeanwhile" in e.to_string() for e in errors] == [True]
        assert instance.get_runs_count() == 0, "nothing submitted"
        stored = instance.get_backfill("ui")
        assert stored is not None
        assert (stored.reserved_run_ids, stored.failure_count, stored.status) == (
            ours.reserved_run_ids,
            1,
            BulkActionStatus.REQUESTED,
        )

        errors = list(
            execute_backfill_iteration_with_instigation_logger(stored, logger, context, instance)
        )
        assert errors == [None] or not any(errors), errors
    runs = instance.get_runs()
    assert sorted(r.run_id for r in runs) == sorted(ours.reserved_run_ids)
    keys_now = instance.get_dynamic_partitions(documents_partitions.name or "documents")
    assert sorted(k for r in runs for k in run_documents(r, keys_now)) == sorted(scattered)
