"""Batch API jobs in the results store: an intent claims its tasks, each step is recorded once, a
line is settled once (its usage with it), and a finished job frees its tasks."""

from __future__ import annotations

import pytest

from ai_pipeline.failures import Category
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import JobStatus, LineState, PlannedTask, TasksTaken
from ai_pipeline.store.spend import Usage


def tasks(*names: str) -> list[PlannedTask]:
    return [PlannedTask(f"d{n}-analyse-v1-abc", f"d{n}", "analyse") for n in names]


def plan(store: Store, intent: str, *names: str) -> None:
    store.openai_batches.plan(
        intent,
        model="gpt-4o-mini",
        endpoint="/v1/chat/completions",
        tasks=tasks(*names),
        content_hash="h" * 64,
        content_bytes=123,
    )


def usage(task: str) -> Usage:
    return Usage(task, task.split("-")[0], "analyse", "gpt-4o-mini", "answer", 100, 20, 0.5)


def test_an_intent_claims_its_tasks_until_it_is_finished(store: Store) -> None:
    """A task in an open job cannot be planned into another (nothing of the second is
    recorded); once the first job is finished, it can."""
    plan(store, "i1", "1", "2")
    job = store.openai_batches.get("i1")
    assert job is not None and job.status == JobStatus.PLANNED and job.task_count == 2
    assert [line.state for line in store.openai_batches.lines("i1")] == [LineState.PENDING] * 2
    with pytest.raises(TasksTaken):
        plan(store, "i2", "3", "2")
    assert store.openai_batches.get("i2") is None
    assert store.openai_batches.open_jobs_of(["d2-analyse-v1-abc", "d3-analyse-v1-abc"]) == {
        "d2-analyse-v1-abc": "i1"
    }
    assert store.openai_batches.finish("i1", JobStatus.ABANDONED, "rebuilt differently") == 2
    plan(store, "i2", "3", "2")
    assert [j.intent_id for j in store.openai_batches.unfinished()] == ["i2"]
    lines = store.openai_batches.lines_of(["d2-analyse-v1-abc"])
    assert sorted((line.intent_id, line.state) for line in lines) == [
        ("i1", LineState.UNANSWERED),
        ("i2", LineState.PENDING),
    ]


def test_the_file_and_the_batch_are_recorded_once(store: Store) -> None:
    """A second upload or batch id recorded for the same intent does not replace the first."""
    plan(store, "i1", "1")
    assert store.openai_batches.record_file("i1", "file-a")
    assert not store.openai_batches.record_file("i1", "file-b")
    assert store.openai_batches.record_batch("i1", "batch_a", JobStatus.VALIDATING)
    assert not store.openai_batches.record_batch("i1", "batch_b", JobStatus.VALIDATING)
    job = store.openai_batches.by_batch_id("batch_a")
    assert job is not None and job.file_id == "file-a" and job.submitted_at is not None
    store.openai_batches.record_remote(
        "i1",
        JobStatus.COMPLETED,
        total=1,
        completed=1,
        failed=0,
        output_file_id="file-out",
        error_file_id=None,
    )
    job = store.openai_batches.get("i1")
    assert job is not None and job.status == JobStatus.COMPLETED and job.ended_at is not None
    assert (job.request_total, job.request_completed, job.output_file_id) == (1, 1, "file-out")


def test_a_line_is_settled_once_and_its_usage_recorded_once(store: Store) -> None:
    """Answering a line twice records its usage once; a failed line keeps its category; the
    job's end leaves the rest unanswered and its tasks free."""
    plan(store, "i1", "1", "2", "3")
    task1, task2, task3 = (t.task_id for t in tasks("1", "2", "3"))
    assert store.openai_batches.answer_line("i1", task1, usage(task1))
    assert not store.openai_batches.answer_line("i1", task1, usage(task1))
    assert store.spend.total().attempts == 1
    assert store.openai_batches.fail_line(
        "i1",
        task2,
        LineState.FAILED,
        category=Category.RATE_LIMIT_EXCEEDED,
        status_code=429,
        error="HTTP 429",
    )
    assert not store.openai_batches.answer_line("i1", task2, usage(task2))
    assert store.openai_batches.finish("i1", JobStatus.INGESTED) == 1
    states = {line.task_id: line for line in store.openai_batches.lines("i1")}
    assert states[task1].state == LineState.ANSWERED
    assert states[task2].state == LineState.FAILED
    assert states[task2].category == Category.RATE_LIMIT_EXCEEDED
    assert states[task2].status_code == 429
    assert states[task3].state == LineState.UNANSWERED
    assert store.openai_batches.open_jobs_of([task1, task2, task3]) == {}
    assert store.openai_batches.unfinished() == []
    assert not store.openai_batches.record_remote(
        "i1",
        JobStatus.EXPIRED,
        total=3,
        completed=1,
        failed=2,
        output_file_id=None,
        error_file_id=None,
    ), "a finished job's status stays"
