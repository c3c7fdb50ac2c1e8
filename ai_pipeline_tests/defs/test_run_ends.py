"""A failed run's unfinished documents shown FAILED in Dagster: in few transactions, a bounded
number per reconcile tick (``ai_pipeline.defs.run_ends``)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.storage.runs.schema import RunsTable

from ai_pipeline.defs import run_ends
from ai_pipeline.defs.jobs import RANGE_END_TAG, RANGE_START_TAG
from ai_pipeline.defs.site import DEFAULT_SITE
from ai_pipeline.failures import Category
from ai_pipeline.states import State
from ai_pipeline_tests.defs.test_one_owner import failed_in_dagster
from ai_pipeline_tests.support import launcher, make_inbox, results_store, sample_text


def _documents(instance: dg.DagsterInstance, folder: Path, count: int) -> list[str]:
    """``count`` registered documents, in the order of their partitions."""
    inbox = make_inbox(folder, {f"d{i}.txt": sample_text(i) for i in range(count)})
    ids = set(launcher(instance).register_inbox(inbox).document_ids)
    return [k for k in instance.get_dynamic_partitions(DEFAULT_SITE.partitions) if k in ids]


def _failed_run(instance: dg.DagsterInstance, documents: list[str]) -> dg.DagsterRun:
    """A run of the analysis over the range of ``documents`` that failed before it began any."""
    run = dg.DagsterRun(
        job_name="__ASSET_JOB",
        run_id=str(uuid.uuid4()),
        status=dg.DagsterRunStatus.FAILURE,
        asset_selection=frozenset(DEFAULT_SITE.keys),
        tags={RANGE_START_TAG: documents[0], RANGE_END_TAG: documents[-1]},
    )
    instance.add_run(run)
    return run


def _ended_at(instance: dg.DagsterInstance, run: dg.DagsterRun, at: datetime) -> None:
    """Set a run's update time (what the reconcile sensor's cursor follows)."""
    storage: Any = instance.run_storage
    with storage.connect() as conn:
        conn.execute(
            sa.update(RunsTable).where(RunsTable.c.run_id == run.run_id).values(update_timestamp=at)
        )


def _groups_of_planned_events(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Records, for each transaction the marking writes planned events in (``grouped_writes``),
    how many it wrote; an event written outside any counts as a transaction of its own."""
    storage: Any = instance.event_log_storage
    groups: list[int] = []
    store_event, grouped_writes = storage.store_event, storage.grouped_writes
    inside = [False]

    def counted_store_event(event: Any) -> None:
        if event.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED:
            if inside[0]:
                groups[-1] += 1
            else:
                groups.append(1)
        store_event(event)

    class Counted:
        def __enter__(self) -> None:
            self._group = grouped_writes()
            self._group.__enter__()
            inside[0] = True
            groups.append(0)

        def __exit__(self, *exc: Any) -> Any:
            inside[0] = False
            return self._group.__exit__(*exc)

    monkeypatch.setattr(storage, "store_event", counted_store_event)
    monkeypatch.setattr(storage, "grouped_writes", Counted)
    return groups


@pytest.mark.accelerated
def test_a_failed_runs_documents_are_marked_in_a_few_transactions(
    instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that failed before it began its 60 documents: their planned events (five stages
    each) are written ``EVENTS_PER_WRITE`` to a transaction, not one by one, and every document
    is then FAILED in Dagster and in the store (RUN_INTERRUPTED)."""
    monkeypatch.setattr(run_ends, "EVENTS_PER_WRITE", 120)
    documents = _documents(instance, tmp_path / "inbox", 60)
    run = _failed_run(instance, documents)
    groups = _groups_of_planned_events(instance, monkeypatch)
    store = results_store()

    marked, _ = run_ends.mark_ended_runs(instance, store, None)

    assert marked == {run.run_id: sorted(documents)}
    assert groups == [120, 120, 60]  # 300 events: 60 documents x 5 stages
    assert failed_in_dagster(instance, documents) == set(documents)
    assert {(d.state, d.category) for d in store.documents.rows(documents)} == {
        (State.FAILED, Category.RUN_INTERRUPTED)
    }
    # Marked once: the next tick from the start writes nothing again.
    assert run_ends.mark_ended_runs(instance, store, None)[0] == {}
    assert sum(groups) == 300


@pytest.mark.accelerated
def test_a_tick_stops_after_the_run_that_takes_it_past_its_documents(
    instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four failed runs of 20 documents, at most 30 documents a tick: the first tick marks runs
    until it is past 30 documents and leaves its cursor after the last; the next one marks the
    rest from there. The second and third ended in the same second (SQLite's run storage keeps
    whole seconds), so they are not split between two ticks, where the second would ask for
    later runs only: the first tick marks three."""
    monkeypatch.setattr(run_ends, "DOCUMENTS_PER_TICK", 30)
    documents = _documents(instance, tmp_path / "inbox", 80)
    runs = [_failed_run(instance, documents[i : i + 20]) for i in (0, 20, 40, 60)]
    at = datetime(2026, 12, 6, 12, 0, 0)
    for run, seconds in zip(runs, (0, 1, 1, 2), strict=True):
        _ended_at(instance, run, at + timedelta(seconds=seconds))
    store = results_store()

    first, cursor = run_ends.mark_ended_runs(instance, store, None)
    assert list(first) == [r.run_id for r in runs[:3]]
    assert failed_in_dagster(instance, documents) == set(documents[:60])

    second_tick, last = run_ends.mark_ended_runs(instance, store, cursor)
    assert list(second_tick) == [runs[3].run_id]
    assert failed_in_dagster(instance, documents) == set(documents)
    assert run_ends.mark_ended_runs(instance, store, last) == ({}, last)
