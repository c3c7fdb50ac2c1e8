"""Runs of Dagster's own storage: a run covers its whole range, the completed documents between the
ones it is for ride along (re-reported from their checkpoints), and only the documents that fail
show FAILED (``ai_pipeline.defs.replan``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)

from ai_pipeline.defs.assets import ANALYSIS_KEYS, ANALYSIS_RESULTS, LLM_ANALYSIS
from ai_pipeline.defs.checks import CHECK_SPECS
from ai_pipeline.defs.jobs import range_tags
from ai_pipeline.defs.replan import (
    MISSED_RETRY_SECONDS,
    REPLAN_TAG,
    hand_over,
    plan_ranges,
    release_missed_retries,
    replan_backfill,
)
from ai_pipeline.defs.site import DEFAULT_SITE
from ai_pipeline.states import State
from ai_pipeline_tests.support import (
    STATUS,
    launcher,
    make_inbox,
    process_inbox,
    results_store,
    sample_text,
    statuses,
    task_of,
)

KEYS = [f"d{i:02d}" for i in range(20)]


@pytest.mark.parametrize(
    ("wanted", "riding", "size", "most", "runs"),
    [
        # Every document between two wanted ones rides along: runs of the run size.
        ([1, 5, 9, 13], set(range(20)), 2, 10, [[1, 5], [9, 13]]),
        # One that may not (a failure nobody asked for, a stale result) cuts the run there.
        ([1, 5, 9, 13], set(range(20)) - {7}, 4, 10, [[1, 5], [9, 13]]),
        # A gap longer than ``most`` is cheaper as another run.
        ([1, 5, 9, 13], set(range(20)), 4, 2, [[1], [5], [9], [13]]),
        # Contiguous documents need no one to ride along.
        ([3, 4, 5, 6], set(), 3, 0, [[3, 4, 5], [6]]),
    ],
)
def test_runs_cover_whole_ranges_of_documents_that_may_ride_along(
    wanted: list[int], riding: set[int], size: int, most: int, runs: list[list[int]]
) -> None:
    """``plan_ranges`` puts the wanted documents in runs of at most the run size, in partition
    order, and goes on over the documents between two of them only when each may ride along and
    there are at most ``most`` of them."""
    asked: list[list[str]] = []

    def rides(documents: Any) -> set[str]:
        asked.append(list(documents))
        return {KEYS[i] for i in riding} & set(documents)

    planned = plan_ranges([KEYS[i] for i in wanted], KEYS, size, rides, most)

    assert planned == [[KEYS[i] for i in run] for run in runs]
    assert len(asked) <= 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # Dagster's own planned events
def test_a_range_run_that_fails_for_some_of_its_documents_shows_exactly_those_failed(
    instance: dg.DagsterInstance,
    simulator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dagster's own storage: a run over a range of 41 documents — six that failed, scattered,
    and the completed ones between them riding along — where two of the six fail again. Dagster
    shows exactly those two FAILED, every other document MATERIALIZED with every check passed;
    the four are analysed with one call each, the completed ones with none."""
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "50")  # the first pass in one run
    texts = {f"doc-{i:03d}.txt": sample_text(900 + i) for i in range(50)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = launcher().register_inbox(inbox).document_ids
    failing = [ids[i] for i in (4, 11, 19, 26, 37, 44)]
    faults = [{"kind": "status", "status": 400, "match": task_of(d)} for d in failing]
    simulator.set_faults(faults)
    process_inbox(inbox)
    assert results_store().documents.count_by_state(failing) == {State.FAILED: len(failing)}
    again = failing[1::3]
    simulator.set_faults([f for f in faults if f["match"] in {task_of(d) for d in again}])
    before = {d: simulator.requests_for(task_of(d)) for d in ids}

    job = launcher().repository.get_job("analyse_documents_job")
    span = ids[ids.index(failing[0]) : ids.index(failing[-1]) + 1]
    result = job.execute_in_process(instance=instance, tags=range_tags(span), raise_on_error=False)

    assert not result.success
    by_stage = {key: statuses(instance, key, ids) for key in ANALYSIS_KEYS}
    failed = {d for status in by_stage.values() for d, s in status.items() if s == STATUS.FAILED}
    assert failed == set(again)
    assert statuses(instance, ANALYSIS_RESULTS, ids) == {
        d: STATUS.FAILED if d in again else STATUS.MATERIALIZED for d in ids
    }
    calls = {d: simulator.requests_for(task_of(d)) - before[d] for d in ids}
    assert {d: n for d, n in calls.items() if n} == dict.fromkeys(failing, 1)
    riding = [d for d in span if d not in failing]
    for d in riding:
        answer = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=LLM_ANALYSIS, asset_partitions=[d]), limit=1
        ).records[0]
        assert answer.event_log_entry.run_id == result.run_id
        assert answer.asset_materialization.metadata["from_checkpoint"].value is True
    latest: dict[tuple[str, str], str] = {}
    for spec in CHECK_SPECS:
        for e in instance.event_log_storage.get_asset_check_execution_history(spec.key, 1000):
            latest.setdefault((spec.name, e.partition or ""), e.status.value)
    assert {k: v for k, v in latest.items() if k[1] in riding and v != "SUCCEEDED"} == {}


def test_on_dagsters_own_storage_a_missed_retry_is_released_not_waited_for(
    instance: dg.DagsterInstance,
) -> None:
    """A failed run of a backfill marked to be retried, with no retry a minute after its failure,
    is marked not to be retried (its backfill then ends); one that has its retry, one of no
    backfill, one of another job, and any within the grace are left alone."""
    analysis = frozenset(DEFAULT_SITE.keys)

    def failed_run(tags: dict[str, str], selection: frozenset[dg.AssetKey] = analysis) -> str:
        run = instance.add_run(
            dg.DagsterRun(
                job_name="analyse_documents_job",
                run_id=str(uuid.uuid4()),
                status=dg.DagsterRunStatus.FAILURE,
                tags={"dagster/will_retry": "true", **tags},
                asset_selection=selection,
            )
        )
        return run.run_id

    missed = failed_run({"dagster/backfill": "b1"})
    failed_run({"dagster/backfill": "b1", "dagster/auto_retry_run_id": "r2"})
    failed_run({})
    failed_run({"dagster/backfill": "b1"}, frozenset({dg.AssetKey("a_teams_own")}))

    assert release_missed_retries(instance, DEFAULT_SITE) == [], "within the grace"
    later = time.time() + MISSED_RETRY_SECONDS + 1
    assert release_missed_retries(instance, DEFAULT_SITE, now=later) == [missed]
    released = instance.get_run_by_id(missed)
    assert released is not None and released.tags["dagster/will_retry"] == "false"
    assert release_missed_retries(instance, DEFAULT_SITE, now=later) == [], "once"


def test_a_replaced_run_is_cancelled_and_ends_only_once_a_replans_run_holds_its_documents(
    instance: dg.DagsterInstance,
) -> None:
    """A backfill whose runs are all over ends, counting a cancelled run's documents as failed: so
    Dagster's queued runs whose documents a replan took stay queued (marked replaced) until a run
    of the replan holds each of their documents — then they are cancelled and deleted — and one
    that starts meanwhile waits for it."""
    instance.add_dynamic_partitions(DEFAULT_SITE.partitions, KEYS)
    store = results_store()
    assert store.replans.record("b1", [KEYS[1:4]], named=False) is not None

    # A queued run names the code it runs (never used here: nothing starts).
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(GrpcServerCodeLocationOrigin("localhost", 1), "__repository__"),
        DEFAULT_SITE.job_name,
    )

    def run(status: dg.DagsterRunStatus, tags: dict[str, str]) -> dg.DagsterRun:
        return instance.add_run(
            dg.DagsterRun(
                job_name=DEFAULT_SITE.job_name,
                run_id=str(uuid.uuid4()),
                status=status,
                tags={"dagster/backfill": "b1", **tags},
                asset_selection=frozenset(DEFAULT_SITE.keys),
                remote_job_origin=origin,
            )
        )

    queued = [run(dg.DagsterRunStatus.QUEUED, {"dagster/partition": k}) for k in KEYS[1:4]]
    started = run(dg.DagsterRunStatus.STARTED, {"dagster/partition": KEYS[3]})

    def replan() -> None:
        replan_backfill(instance, store, DEFAULT_SITE, "", "b1", 1)

    def statuses_now() -> list[dg.DagsterRunStatus | None]:
        return [
            (found.status if (found := instance.get_run_by_id(r.run_id)) else None) for r in queued
        ]

    replan()
    assert statuses_now() == [dg.DagsterRunStatus.QUEUED] * 3
    assert all(
        "ai_pipeline/replaced_by" in instance.get_run_by_id(r.run_id).tags  # type: ignore[union-attr]
        for r in queued
    )
    assert not hand_over(instance, started, DEFAULT_SITE, [KEYS[3]], timeout=0.2, poll=0.05)

    run(dg.DagsterRunStatus.QUEUED, {**range_tags(KEYS[1:3]), REPLAN_TAG: "1"})
    replan()
    assert statuses_now() == [None, None, dg.DagsterRunStatus.QUEUED], "cancelled, then deleted"
    assert not hand_over(instance, started, DEFAULT_SITE, [KEYS[3]], timeout=0.2, poll=0.05)

    run(dg.DagsterRunStatus.QUEUED, {**range_tags(KEYS[3:4]), REPLAN_TAG: "1"})
    assert hand_over(instance, started, DEFAULT_SITE, [KEYS[3]], timeout=0)
    replan()
    assert statuses_now() == [None] * 3
