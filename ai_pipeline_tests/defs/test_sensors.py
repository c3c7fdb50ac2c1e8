"""The inbox sensor: called directly as a function, and ticking in a real ``dagster-daemon``."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.defs.assets import ANALYSIS_RESULTS
from ai_pipeline.defs.jobs import ANALYSIS_JOB_NAME
from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.defs.resources import PipelineSettings, ResultsStore
from ai_pipeline_tests.dagster_procs import DagsterProcess, wait_for
from ai_pipeline_tests.support import (
    RANGE_END,
    RANGE_START,
    STATUS,
    TERMINAL,
    compute_log,
    doc_id,
    make_inbox,
    rejected_id,
    results_store,
    sample_text,
    statuses,
    task_of,
    user_messages,
)

# --- the sensor function, called directly --------------------------------------------------------


def call_sensor(
    instance: dg.DagsterInstance,
    inbox: Path | None,
    cursor: str | None = None,
    documents_per_run: int | None = 10,
    max_files: int | None = None,
) -> dg.SensorResult | dg.SkipReason:
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={
            "settings": PipelineSettings(
                inbox=str(inbox) if inbox else None,
                documents_per_run=documents_per_run,
                settle_seconds=0,
                sensor_max_files=max_files,
            ),
            "results_store": ResultsStore(),
        },
    )
    from ai_pipeline.definitions import defs

    return defs.get_repository_def().get_sensor_def("inbox_sensor")(context)


def added_keys(result: dg.SensorResult) -> list[str]:
    """The partition keys of the result's one add request for the ``documents`` partitions."""
    requests = result.dynamic_partitions_requests or []
    assert len(requests) == 1
    (request,) = requests
    assert isinstance(request, dg.AddDynamicPartitionsRequest)
    assert request.partitions_def_name == documents_partitions.name
    return list(request.partition_keys)


def run_ranges(result: dg.SensorResult) -> list[tuple[str, str, int]]:
    """(range start, range end, document count) of each run request, in order."""
    out = []
    for request in result.run_requests or []:
        assert request.job_name == ANALYSIS_JOB_NAME
        assert request.run_key
        out.append(
            (
                request.tags[RANGE_START],
                request.tags[RANGE_END],
                int(request.tags["ai_pipeline/documents"]),
            )
        )
    return out


def expected_ids(run: dg.DagsterRun) -> set[str]:
    """The documents of a range run, from its tags and the partitions' order."""
    keys = dg.DagsterInstance.get().get_dynamic_partitions(documents_partitions.name)
    start, end = keys.index(run.tags[RANGE_START]), keys.index(run.tags[RANGE_END])
    return set(keys[start : end + 1])


def expected_ranges(ids: list[str], size: int) -> list[tuple[str, str, int]]:
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    return [(c[0], c[-1], len(c)) for c in chunks]


def test_new_files_become_partitions_and_range_runs(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None
) -> None:
    """New files give one add request with their ids in arrival order and runs of ≤ N documents."""
    texts = {f"f{i:02d}.txt": sample_text(i) for i in range(23)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = [doc_id(t) for t in texts.values()]

    result = call_sensor(instance, inbox, documents_per_run=10)

    assert isinstance(result, dg.SensorResult)
    assert added_keys(result) == ids
    assert run_ranges(result) == expected_ranges(ids, 10)
    assert [n for _, _, n in run_ranges(result)] == [10, 10, 3]
    assert len({r.run_key for r in result.run_requests or []}) == 3
    assert result.cursor
    store = results_store()
    docs = {d.document_id: d for d in store.documents.rows()}
    assert set(docs) == set(ids)
    assert {d.state for d in docs.values()} == {"QUEUED"}

    # The same tick again (same cursor, nothing new): nothing to do.
    again = call_sensor(instance, inbox, cursor=result.cursor)
    assert isinstance(again, dg.SkipReason)
    assert "no new files" in (again.skip_message or "")


def test_a_ticks_runs_fill_the_run_queue_when_no_size_is_set(
    instance: dg.DagsterInstance,
    tmp_path: Path,
    no_inbox_env: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AI_PIPELINE_DOCUMENTS_PER_RUN unset: a tick's documents go in one run per slot of the run
    queue (max_concurrent_runs of the instance), as a backfill's would, not in runs of 25."""
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "2")
    slots = instance.get_concurrency_config().run_queue_config.max_concurrent_runs
    assert slots == 4
    texts = {f"f{i:02d}.txt": sample_text(i) for i in range(23)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = [doc_id(t) for t in texts.values()]

    result = call_sensor(instance, inbox, documents_per_run=None)

    assert isinstance(result, dg.SensorResult)
    assert run_ranges(result) == expected_ranges(ids, 6)  # ceil(23 / 4)
    assert [n for _, _, n in run_ranges(result)] == [6, 6, 6, 5]


def test_a_backlog_is_drained_over_bounded_ticks(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None
) -> None:
    """At most AI_PIPELINE_SENSOR_MAX_FILES files per tick, the cursor advancing with what it took:
    23 files at 10 a tick are 3 ticks of 10, 10 and 3 documents, each launched once, in arrival
    order; the fourth tick has nothing new."""
    texts = {f"f{i:02d}.txt": sample_text(i) for i in range(23)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = [doc_id(t) for t in texts.values()]

    cursor, taken, launched = None, [], []
    for expected in (10, 10, 3):
        result = call_sensor(instance, inbox, cursor, documents_per_run=4, max_files=10)
        assert isinstance(result, dg.SensorResult)
        keys = added_keys(result)
        assert len(keys) == expected
        taken += keys
        launched += [n for _, _, n in run_ranges(result)]
        instance.add_dynamic_partitions(documents_partitions.name, keys)  # as the daemon does
        assert result.cursor and result.cursor != cursor
        cursor = result.cursor
    assert taken == ids
    assert launched == [4, 4, 2] * 2 + [3]
    assert {d.document_id for d in results_store().documents.rows()} == set(ids)

    final = call_sensor(instance, inbox, cursor, max_files=10)
    assert isinstance(final, dg.SkipReason)
    assert "no new files" in (final.skip_message or "")


def test_copy_of_known_content_records_an_alias_and_launches_nothing(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None
) -> None:
    """A byte-identical copy of a known document under a new name launches no run; alias stored."""
    texts = {f"a{i}.txt": sample_text(200 + i) for i in range(3)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    first = call_sensor(instance, inbox)
    assert isinstance(first, dg.SensorResult)
    ids = added_keys(first)
    # What the daemon does with the tick's request.
    instance.add_dynamic_partitions(documents_partitions.name, ids)
    time.sleep(0.02)  # a new arrival time for the copy, whatever the clock's granularity
    shutil.copyfile(inbox / "a1.txt", inbox / "copy-of-a1.txt")

    second = call_sensor(instance, inbox, cursor=first.cursor)

    assert isinstance(second, dg.SensorResult)
    assert not second.run_requests
    assert not second.dynamic_partitions_requests
    assert second.skip_reason is not None
    assert second.cursor and second.cursor != first.cursor
    the_id = doc_id(texts["a1.txt"])
    sources = results_store().documents.sources([the_id])[the_id]
    assert [Path(s).name for s in sources] == ["a1.txt", "copy-of-a1.txt"]
    assert len(results_store().documents.rows()) == 3
    # With the new cursor, the copy is not seen again.
    third = call_sensor(instance, inbox, cursor=second.cursor)
    assert isinstance(third, dg.SkipReason)


def test_unreadable_files_are_registered_and_run(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, no_inbox_env: None
) -> None:
    """Empty and non-UTF-8 files become documents of the runs, which fail them as input issues."""
    good = sample_text(300)
    inbox = make_inbox(
        tmp_path / "inbox",
        {
            "b0-empty.txt": b"",
            "b1-latin1.txt": "Caf\xe9 in S\xe3o Paulo".encode("latin-1"),
            "b2.txt": good,
        },
    )
    empty_id = rejected_id(inbox / "b0-empty.txt")
    latin_id = rejected_id(inbox / "b1-latin1.txt")
    ids = [empty_id, latin_id, doc_id(good)]

    result = call_sensor(instance, inbox)

    assert isinstance(result, dg.SensorResult)
    assert added_keys(result) == ids
    assert run_ranges(result) == [(empty_id, doc_id(good), 3)]
    store = results_store()
    assert "empty" in (store.documents.get(empty_id).rejected_reason or "")  # type: ignore[union-attr]
    assert "UTF-8" in (store.documents.get(latin_id).rejected_reason or "")  # type: ignore[union-attr]

    # Run the requested run as the daemon would launch it: the bad files fail, the good one passes.
    from ai_pipeline.definitions import defs

    instance.add_dynamic_partitions(documents_partitions.name, ids)
    (request,) = result.run_requests or []
    run = defs.resolve_job_def(ANALYSIS_JOB_NAME).execute_in_process(
        instance=instance, tags=request.tags, raise_on_error=False
    )
    assert not run.success
    docs = {d.document_id: d for d in store.documents.rows()}
    assert {i: (docs[i].state, docs[i].category) for i in ids} == {
        empty_id: ("FAILED", "INPUT_QUALITY_ISSUE"),
        latin_id: ("FAILED", "INPUT_QUALITY_ISSUE"),
        doc_id(good): ("COMPLETED", None),
    }
    assert [r.document_id for r in store.results.get()] == [doc_id(good)]
    assert simulator.stats()["total"] == 1
    assert simulator.requests_for(task_of(doc_id(good))) == 1


def test_folder_moved_into_inbox_is_seen(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None
) -> None:
    """A folder of files written earlier and then moved into the inbox is registered by a tick."""
    staged = make_inbox(tmp_path / "staging" / "batch", {"b.txt": sample_text(401)})
    time.sleep(0.02)
    inbox = make_inbox(tmp_path / "inbox", {"a.txt": sample_text(400)})
    first = call_sensor(instance, inbox)
    assert isinstance(first, dg.SensorResult)
    instance.add_dynamic_partitions(documents_partitions.name, added_keys(first))

    os.rename(staged, inbox / "batch")
    second = call_sensor(instance, inbox, cursor=first.cursor)

    assert isinstance(second, dg.SensorResult), second
    assert added_keys(second) == [doc_id(sample_text(401))]


def test_new_file_in_a_known_folder_reads_only_the_new_file(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None, monkeypatch
) -> None:
    """A file added to a folder of known files registers that file alone, reading no sibling."""
    inbox = make_inbox(
        tmp_path / "inbox", {f"batch/old-{i}.txt": sample_text(500 + i) for i in range(3)}
    )
    first = call_sensor(instance, inbox)
    assert isinstance(first, dg.SensorResult)
    instance.add_dynamic_partitions(documents_partitions.name, added_keys(first))
    time.sleep(0.02)
    make_inbox(inbox, {"batch/new.txt": sample_text(600)})
    read: list[str] = []
    import ai_pipeline.intake as intake

    original = intake.load
    monkeypatch.setattr(
        intake, "load", lambda path, **kw: read.append(Path(path).name) or original(path, **kw)
    )

    second = call_sensor(instance, inbox, cursor=first.cursor)

    assert isinstance(second, dg.SensorResult), second
    assert added_keys(second) == [doc_id(sample_text(600))]
    assert read == ["new.txt"]


def test_no_inbox_configured_skips(
    instance: dg.DagsterInstance, tmp_path: Path, no_inbox_env: None
) -> None:
    """Without an inbox setting the sensor skips and says why; a missing folder is a skip too."""
    result = call_sensor(instance, None)
    assert isinstance(result, dg.SkipReason)
    assert "no inbox configured" in (result.skip_message or "")
    missing = call_sensor(instance, tmp_path / "does-not-exist")
    assert isinstance(missing, dg.SkipReason)
    assert "does not exist" in (missing.skip_message or "")


# --- the sensor in a real dagster-daemon ---------------------------------------------------------
# (The ``daemon`` fixture is in conftest.py, the process itself in ai_pipeline_tests.dagster_procs.)

SENSOR_INTERVAL_SECONDS = 2
DOCUMENTS_PER_RUN = 10


def drop(inbox: Path, staging: Path, files: dict[str, str]) -> None:
    """Write files beside the inbox, then move them in (as a person or a script drops files)."""
    make_inbox(staging, files)
    for name in files:
        os.rename(staging / name, inbox / name)


def analysis_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(job_name=ANALYSIS_JOB_NAME)))


def all_done(instance: dg.DagsterInstance, ids: list[str], n_runs: int) -> bool:
    runs = analysis_runs(instance)
    return (
        len(runs) >= n_runs
        and all(r.status in TERMINAL for r in runs)
        and set(statuses(instance, ANALYSIS_RESULTS, ids).values()) == {STATUS.MATERIALIZED}
    )


def inbox_sensor_state(instance: dg.DagsterInstance) -> Any:
    from dagster._core.scheduler.instigation import InstigatorType

    states = [
        s
        for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        if s.instigator_name == "inbox_sensor"
    ]
    return states[0] if states else None


def sensor_ticks(instance: dg.DagsterInstance) -> list[Any]:
    state = inbox_sensor_state(instance)
    if state is None:
        return []
    return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


# On SQLite only, to keep the suite within CI's time. On PostgreSQL, sensors launch runs under the
# daemon in the nightly-tick and killed-worker tests (test_backfills, test_one_owner), the inbox
# sensor's function runs above, and dynamic partitions are added to its storage by every
# two-backend test that processes an inbox.
@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_daemon_sensor_launches_each_document_once(
    instance: dg.DagsterInstance,
    simulator,
    daemon: DagsterProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real daemon turns dropped files into range runs that analyse every document exactly once."""
    from dagster._core.scheduler.instigation import InstigatorStatus, TickStatus

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    staging = tmp_path / "staging"
    monkeypatch.setenv("AI_PIPELINE_INBOX", str(inbox))
    monkeypatch.setenv("AI_PIPELINE_SENSOR_INTERVAL", str(SENSOR_INTERVAL_SECONDS))
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", str(DOCUMENTS_PER_RUN))
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "0.5")
    store = results_store()

    first = {f"first-{i:02d}.txt": sample_text(1000 + i) for i in range(25)}
    first_ids = [doc_id(t) for t in first.values()]
    drop(inbox, staging, first)
    started = time.monotonic()
    daemon.start()

    wait_for(daemon, "25 documents analysed", lambda: all_done(instance, first_ids, 3))
    first_seconds = time.monotonic() - started

    # Nobody turned the sensor on: it runs because its default status is RUNNING.
    state = inbox_sensor_state(instance)
    assert state is not None and state.status == InstigatorStatus.DECLARED_IN_CODE
    runs = analysis_runs(instance)
    assert len(runs) == math.ceil(25 / DOCUMENTS_PER_RUN) == 3
    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    ranges = sorted((r.tags[RANGE_START], r.tags[RANGE_END]) for r in runs)
    assert ranges == sorted((s, e) for s, e, _ in expected_ranges(first_ids, DOCUMENTS_PER_RUN))
    launching = [t for t in sensor_ticks(instance) if t.status == TickStatus.SUCCESS]
    assert sorted(run_id for t in launching for run_id in t.run_ids) == sorted(
        r.run_id for r in runs
    )
    assert {simulator.requests_for(task_of(i)) for i in first_ids} == {1}
    assert simulator.stats()["total"] == 25
    assert sorted(r.document_id for r in store.results.get()) == sorted(first_ids)
    assert {d.state for d in store.documents.rows()} == {"COMPLETED"}
    # A daemon-launched run's per-document lines are in its compute log, by task id, not in its
    # event log (each event-log line is a database write).
    for run in runs:
        held = [i for i in first_ids if i in expected_ids(run)]
        text = compute_log(instance, run.run_id)
        assert all(f"[TASK:{task_of(i)}] completed" in text for i in held), text[-2000:]
        assert not [m for m in user_messages(instance, run.run_id) if "] completed" in m]

    # A second drop: only the new files are analysed, in one more run.
    second = {f"second-{i}.txt": sample_text(2000 + i) for i in range(5)}
    second_ids = [doc_id(t) for t in second.values()]
    started = time.monotonic()
    drop(inbox, staging, second)

    wait_for(daemon, "5 more documents analysed", lambda: all_done(instance, second_ids, 4))
    second_seconds = time.monotonic() - started

    runs = analysis_runs(instance)
    assert len(runs) == 4
    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    (new_run,) = [r for r in runs if r.tags[RANGE_START] in second_ids]
    assert (new_run.tags[RANGE_START], new_run.tags[RANGE_END]) == (second_ids[0], second_ids[-1])
    assert {simulator.requests_for(task_of(i)) for i in first_ids + second_ids} == {1}
    assert simulator.stats()["total"] == 30
    assert store.results.count() == 30

    # A byte-identical copy under a new name: an alias, no run, no LLM call. No tick before the
    # copy skips for "already known" content; the tick that sees it may have started before it.
    shutil.copyfile(inbox / "first-03.txt", inbox / "copy-of-first-03.txt")

    def skip_tick_after_copy() -> Any:
        return [
            t
            for t in sensor_ticks(instance)
            if t.status == TickStatus.SKIPPED and "already known" in (t.skip_reason or "")
        ]

    wait_for(daemon, "the tick that sees the copy", skip_tick_after_copy)
    # One more tick after it, in case the daemon had anything left to launch.
    seen = max(t.timestamp for t in skip_tick_after_copy())
    wait_for(
        daemon, "one more tick", lambda: any(t.timestamp > seen for t in sensor_ticks(instance))
    )

    assert len(analysis_runs(instance)) == 4
    assert simulator.stats()["total"] == 30
    assert store.results.count() == 30
    copied = first_ids[3]
    assert [Path(s).name for s in store.documents.sources([copied])[copied]] == [
        "first-03.txt",
        "copy-of-first-03.txt",
    ]
    assert len(instance.get_dynamic_partitions(documents_partitions.name)) == 30
    print(f"first drop: {first_seconds:.1f} s to 25 analysed; second drop: {second_seconds:.1f} s")
