"""The Batch API path (``ai_pipeline.openai_batch``) on a real store (SQLite and PostgreSQL) and
the simulator over HTTP with the openai SDK: one job per task set, each line a checkpoint as a
call's reply is, at the batch price, and every phase resumable after a crash."""

from __future__ import annotations

import asyncio
import contextlib
import io
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from ai_pipeline.batch import run_batch
from ai_pipeline.documents import parse_document
from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import LLMClient, LLMReply
from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.openai_batch.planning import plan
from ai_pipeline.openai_batch.request_files import BatchRequest, file_of, requests_for, split
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.reporting import spend_report
from ai_pipeline.spend import Meter, Price, Prices, estimate_prompt_tokens
from ai_pipeline.stages import StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import JobStatus, LineState, PlannedTask
from ai_pipeline.store.tables import metadata
from ai_pipeline_tests.support import (
    TEST_API_KEY,
    TEST_MODEL,
    FakeTime,
    RecordingLog,
    sample_text,
    task_of,
)

PRICES = Prices({TEST_MODEL: Price(2.0, 8.0)}, Price(1.0, 1.0))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    else:
        url = str(request.getfixturevalue("pg_test_database_url"))
    s = Store(url)
    with s.db.engine.begin() as conn:
        for table in (s.results.history_table, s.results.table, *reversed(metadata.sorted_tables)):
            conn.execute(table.delete())
    yield s
    s.db.dispose()


def register(store: Store, count: int) -> list[str]:
    ids = []
    for i in range(count):
        doc = parse_document(sample_text(i).encode("utf-8"), f"inbox/doc-{i}.txt")
        store.documents.register(doc)
        ids.append(doc.document_id)
    return ids


def client_for(simulator: SimulatorServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=simulator.base_url, api_key=TEST_API_KEY, max_retries=0, timeout=10
    )


class Creating:
    """A resource of the simulator's client (``files`` or ``batches``) whose ``create`` is the
    test's own; its other calls go through."""

    def __init__(self, resource: Any, create: Callable[..., object]) -> None:
        self._resource = resource
        self.create = create

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resource, name)


def with_create(client: openai.OpenAI, resource: str, create: Callable[..., object]) -> Any:
    """The simulator's client, whose ``files.create`` or ``batches.create`` (``resource``) is
    ``create``."""
    resources: dict[str, Any] = {"files": client.files, "batches": client.batches}
    resources[resource] = Creating(resources[resource], create)
    return SimpleNamespace(**resources)


def jobs(store: Store, simulator: SimulatorServer, **kwargs: object) -> BatchJobs:
    return BatchJobs(store, client_for(simulator), PRICES, **kwargs)  # type: ignore[arg-type]


def drain(runner: BatchJobs, ticks: int = 10) -> None:
    for _ in range(ticks):
        runner.tick()
        if not runner.store.openai_batches.unfinished():
            return
    raise AssertionError("jobs left unfinished")


def analyser(store: Store, simulator: SimulatorServer) -> Analyser:
    fake = FakeTime()
    client = LLMClient(
        base_url=simulator.base_url,
        api_key=TEST_API_KEY,
        model=TEST_MODEL,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    return Analyser(store, client, store.results, log=RecordingLog(), run_id="run-1")


def test_a_batch_answers_every_task_and_the_run_after_it_makes_no_call(
    store: Store, simulator: SimulatorServer
) -> None:
    """Five documents: one file, one batch, five checkpoints at half the price; the ordinary
    run then completes every document from its checkpoint with no call."""
    ids = register(store, 5)
    planned = plan(store, ids, TEST_MODEL)
    assert len(planned.jobs) == 1 and planned.jobs[0].task_count == 5
    drain(jobs(store, simulator))

    job = store.openai_batches.get(planned.jobs[0].intent_id)
    assert job is not None and job.status == JobStatus.INGESTED
    assert (job.request_total, job.request_completed, job.request_failed) == (5, 5, 0)
    stats = simulator.stats()
    assert stats["by_endpoint"]["files.create"] == 1
    assert stats["by_endpoint"]["batches.create"] == 1
    assert stats["total"] == 0 and stats["batch_lines"] == 5
    a = analyser(store, simulator)
    tasks = [a.task_for(d) for d in ids]
    assert set(store.checkpoints.get_many(tasks)) == set(tasks)
    assert set(stats["batch_lines_by_key"]) == set(tasks), "custom_id is the task id"

    spent = store.spend.total()
    assert spent.attempts == 5
    full = PRICES.cost(TEST_MODEL, spent.prompt_tokens, spent.completion_tokens)
    assert spent.cost_usd == pytest.approx(full / 2)

    events = dict(run_batch(a, ids))
    assert not [e for evs in events.values() for e in evs if isinstance(e, StageFailed)]
    assert {store.documents.get(d).state for d in ids} == {State.COMPLETED}  # type: ignore[union-attr]
    assert simulator.stats()["total"] == 0, "every answer came from the batch's checkpoints"
    assert len(store.results.get(ids)) == 5


def test_usage_rows_say_they_came_from_a_batch_and_the_report_says_what_it_saved(
    store: Store, simulator: SimulatorServer
) -> None:
    """Each answered line's usage row is ``via`` batch, a synchronous call's ``via`` sync; the
    spend report prices the batch lines both ways: half of the synchronous price was saved."""
    first, second = register(store, 2)
    plan(store, [first], TEST_MODEL)
    drain(jobs(store, simulator))
    fake = FakeTime()
    client = LLMClient(
        base_url=simulator.base_url,
        api_key=TEST_API_KEY,
        model=TEST_MODEL,
        sleep=fake.sleep,
        clock=fake.clock,
        meter=Meter(store, PRICES, run_id="run-1"),
    )
    a = Analyser(store, client, store.results, log=RecordingLog(), run_id="run-1")
    dict(run_batch(a, [second]))

    vias = {row["document_id"]: row["via"] for row in store.spend.attempts([first, second])}
    assert vias == {first: "batch", second: "sync"}
    saved = spend_report(store, prices=PRICES)["batch_api"]
    (line,) = store.spend.by_batch_api().values()
    full = PRICES.cost(TEST_MODEL, line.prompt_tokens, line.completion_tokens)
    assert saved["lines"] == 1 and saved["at_sync_price_usd"] == pytest.approx(full, abs=1e-6)
    assert saved["saved_usd"] == pytest.approx(full / 2, abs=1e-6) and saved["saved_usd"] > 0


def test_a_line_is_answered_and_stored_as_the_synchronous_call_would_be(
    store: Store, simulator: SimulatorServer
) -> None:
    """The checkpoint a batch line leaves equals the synchronous reply to the same request
    (content, model, finish reason, tokens); only the latency differs."""
    (document,) = register(store, 1)
    plan(store, [document], TEST_MODEL)
    drain(jobs(store, simulator))
    a = analyser(store, simulator)
    stored = LLMReply.from_payload(store.checkpoints.get(a.task_for(document)) or {})
    doc = store.documents.load(document)
    assert doc is not None and doc.text is not None
    analysis = store.analysis
    called = asyncio.run(
        a.llm.analyse(
            "sync-twin",
            analysis.messages(doc.text),
            response_format=analysis.response_format(),
            settings=analysis.model,
        )
    )
    assert stored.to_payload() | {"latency_ms": 0} == called.to_payload() | {"latency_ms": 0}


PHASES = ["uploaded", "created", "polled", "checkpointed", "ingested"]


class Crash(BaseException):
    """A crash: no handler of the code under test catches it (as a killed process)."""


@pytest.mark.parametrize("phase", PHASES)
def test_a_crash_at_any_phase_is_resumed_without_a_second_batch_or_a_second_ingestion(
    store: Store, simulator: SimulatorServer, phase: str
) -> None:
    """A crash after the phase's outside effect, before it is recorded: planning again adds no
    job, and resuming makes one upload, one batch, and settles each line once."""
    ids = register(store, 4)
    (job,) = plan(store, ids, TEST_MODEL).jobs
    seen: list[str] = []

    def crash(at: str, _job: object) -> None:
        seen.append(at)
        if at == phase and (phase != "checkpointed" or seen.count(at) == 2):
            raise Crash(at)

    with pytest.raises(Crash):
        drain(jobs(store, simulator, on_phase=crash))
    again = plan(store, ids, TEST_MODEL)
    assert again.jobs == [] and len(set(again.in_open_jobs) | set(again.done)) == 4
    drain(jobs(store, simulator))

    stats = simulator.stats()
    assert stats["by_endpoint"]["files.create"] == 1
    assert stats["by_endpoint"]["batches.create"] == 1
    assert stats["batch_lines"] == 4 and set(stats["batch_lines_by_key"].values()) == {1}
    assert stats["total"] == 0
    lines = store.openai_batches.lines(job.intent_id)
    assert [line.state for line in lines] == [LineState.ANSWERED] * 4
    assert store.spend.total().attempts == 4, "each line's usage recorded once"
    assert store.checkpoints.count() == 4


def test_a_pass_killed_mid_ingestion_loses_no_run_and_no_retry(
    store: Store, simulator: SimulatorServer
) -> None:
    """A pass dies in the middle of a job: one line answered, the next one's checkpoint stored
    but the line not yet settled. The next pass reports the answered line's document again, for
    its run, beside the lines it settles itself (the rest, and the one that failed retryably, for
    a new job); and it pays for nothing twice."""
    ids = register(store, 4)
    simulator.set_faults([{"kind": "status", "status": 503, "match": task_of(ids[1])}])
    (job,) = plan(store, ids, TEST_MODEL).jobs
    settled: list[str] = []

    def crash(at: str, _job: object) -> None:
        if at == "checkpointed":
            settled.append(at)
            if len(settled) == 2:
                raise Crash(at)

    with pytest.raises(Crash):
        drain(jobs(store, simulator, on_phase=crash))
    lines = store.openai_batches.lines(job.intent_id)
    assert LineState.PENDING in {line.state for line in lines}, "killed in the middle"

    progress = jobs(store, simulator).tick()
    assert sorted(progress.answered_documents) == sorted(d for d in ids if d != ids[1])
    assert progress.unanswered_documents == {ids[1]}
    assert store.spend.total().attempts == 3, "each answered line paid once (a 503 is not)"


@pytest.mark.parametrize("first", ["tick", "send"])
def test_two_followers_at_once_make_one_batch(
    store: Store, simulator: SimulatorServer, first: str
) -> None:
    """Two processes follow the same job at the same moment (the daemon's sensor ticks while
    another tick, or ``submit --via batch``, sends it): each ``batches.create`` waits for the
    other's (up to 2 s), so both would look for an earlier batch, find none, and create one each.
    One holds the job; the other leaves it: one batch."""
    ids = register(store, 3)
    (job,) = plan(store, ids, TEST_MODEL).jobs
    jobs(store, simulator).advance(job)  # uploaded, as the sender left it
    together = threading.Barrier(2, timeout=2)

    def create(**kwargs: object) -> object:
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait()
        return client_for(simulator).batches.create(**kwargs)  # type: ignore[arg-type]

    followers = [
        BatchJobs(store, with_create(client_for(simulator), "batches", create), PRICES)
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        uploaded = store.openai_batches.get(job.intent_id)
        assert uploaded is not None and uploaded.status == JobStatus.UPLOADED
        one = followers[0]
        runs = [pool.submit(lambda: one.send(uploaded) if first == "send" else one.tick())]
        runs.append(pool.submit(followers[1].tick))
        for run in runs:
            run.result()

    assert simulator.calls_to("batches.create") == 1
    drain(jobs(store, simulator))
    assert [line.state for line in store.openai_batches.lines(job.intent_id)] == [
        LineState.ANSWERED
    ] * 3


def test_an_error_in_a_step_is_recorded_and_the_step_taken_again(
    store: Store, simulator: SimulatorServer
) -> None:
    """An error after the batch was created (before it was recorded) is recorded on the job,
    which the next tick takes on without a second batch."""
    ids = register(store, 2)
    (job,) = plan(store, ids, TEST_MODEL).jobs

    def fail(at: str, _job: object) -> None:
        if at == "created":
            raise RuntimeError("disk full")

    progress = jobs(store, simulator, on_phase=fail).tick()
    assert progress.errors == {job.intent_id: "INTERNAL_ERROR: RuntimeError: disk full"}
    failed = store.openai_batches.get(job.intent_id)
    assert failed is not None and failed.status == JobStatus.UPLOADED
    assert failed.error == "INTERNAL_ERROR: RuntimeError: disk full"
    drain(jobs(store, simulator))
    assert simulator.calls_to("batches.create") == 1
    assert store.checkpoints.count() == 2


def test_a_batch_the_endpoint_refuses_abandons_its_job_and_frees_its_tasks(
    store: Store, simulator: SimulatorServer
) -> None:
    """A 401 leaves the job for later; a 400 to its creation abandons it."""
    ids = register(store, 1)
    (job,) = plan(store, ids, TEST_MODEL).jobs
    simulator.set_api_keys(["another"])
    progress = jobs(store, simulator).tick()
    assert progress.errors[job.intent_id].startswith("AUTH_FAILED")
    assert store.openai_batches.get(job.intent_id).status == JobStatus.PLANNED  # type: ignore[union-attr]
    simulator.set_api_keys(None)

    client = client_for(simulator)

    def refused(**kwargs: object) -> object:
        """batches.create, with a completion window the endpoint refuses with a 400."""
        return client.batches.create(**{**kwargs, "completion_window": "1h"})  # type: ignore[arg-type]

    BatchJobs(store, with_create(client, "batches", refused), PRICES).tick()
    abandoned = store.openai_batches.get(job.intent_id)
    assert abandoned is not None and abandoned.status == JobStatus.ABANDONED
    assert abandoned.error is not None and "INPUT_QUALITY_ISSUE" in abandoned.error
    assert store.openai_batches.open_jobs_of([line.task_id for line in job_lines(store, job)]) == {}


def test_a_reply_cut_off_at_its_limit_is_paid_for_and_left_to_the_synchronous_path(
    store: Store, simulator: SimulatorServer
) -> None:
    """The synchronous path asks again with a larger limit after a reply cut off at it: such a
    line leaves no checkpoint, its usage is recorded, and its task is not batched again."""
    (document,) = register(store, 1)
    task = analyser(store, simulator).task_for(document)
    simulator.set_faults([{"kind": "truncate", "match": task}])
    (job,) = plan(store, [document], TEST_MODEL).jobs
    drain(jobs(store, simulator))
    (line,) = store.openai_batches.lines(job.intent_id)
    assert (line.state, line.category) == (LineState.FAILED, Category.SCHEMA_VIOLATION)
    assert store.checkpoints.get(task) is None
    assert store.spend.total().attempts == 1
    assert task in plan(store, [document], TEST_MODEL).gave_up


def test_failed_and_expired_lines_are_classified_and_their_tasks_freed(
    store: Store, simulator: SimulatorServer
) -> None:
    """A 429 line is RATE_LIMIT_EXCEEDED, a 400 INPUT_QUALITY_ISSUE, a batch_expired line
    expired; none leaves a checkpoint, and a new plan takes exactly those tasks."""
    ids = register(store, 5)
    a = analyser(store, simulator)
    limited, refused, late = (a.task_for(d) for d in ids[:3])
    simulator.set_faults(
        [
            {"kind": "status", "status": 429, "match": limited},
            {"kind": "status", "status": 400, "match": refused},
            {"kind": "expire", "match": late},
        ]
    )
    (job,) = plan(store, ids, TEST_MODEL).jobs
    drain(jobs(store, simulator))

    after = store.openai_batches.get(job.intent_id)
    assert after is not None and after.status == JobStatus.INGESTED
    lines = {line.task_id: line for line in store.openai_batches.lines(job.intent_id)}
    assert (lines[limited].state, lines[limited].category, lines[limited].status_code) == (
        LineState.FAILED,
        Category.RATE_LIMIT_EXCEEDED,
        429,
    )
    assert lines[refused].category == Category.INPUT_QUALITY_ISSUE
    assert lines[late].state == LineState.EXPIRED
    assert set(store.checkpoints.get_many(lines)) == {a.task_for(d) for d in ids[3:]}

    (retry,) = (again := plan(store, ids, TEST_MODEL)).jobs
    assert {line.task_id for line in store.openai_batches.lines(retry.intent_id)} == {
        limited,
        late,
    }, "a retryable failure and an expired line go again, a refused line does not"
    assert set(again.gave_up) == {refused}
    assert again.gave_up[refused].startswith("INPUT_QUALITY_ISSUE: HTTP 400")

    drain(jobs(store, simulator))  # the same faults: both fail again
    assert plan(store, ids, TEST_MODEL, max_attempts=2).jobs == []
    third = plan(store, ids, TEST_MODEL, max_attempts=3)
    assert len(third.jobs) == 1 and third.jobs[0].task_count == 2


def test_a_cancelled_batch_releases_its_unanswered_tasks(
    store: Store, simulator: SimulatorServer
) -> None:
    """Lines a cancelled batch never answered are left unanswered, their tasks free again."""
    simulator.set_batch_timing(seconds=3600)
    ids = register(store, 3)
    (job,) = plan(store, ids, TEST_MODEL).jobs
    runner = jobs(store, simulator)
    runner.tick()
    created = store.openai_batches.get(job.intent_id)
    assert created is not None and created.batch_id is not None
    assert not created.status.remote_ended
    client_for(simulator).batches.cancel(created.batch_id)
    progress = runner.tick()
    assert store.openai_batches.unfinished() == []
    assert progress.unanswered_documents == set(), "a cancel is not undone by a new job"
    ended = store.openai_batches.get(job.intent_id)
    assert ended is not None and ended.remote_status == "cancelled"
    assert [line.state for line in store.openai_batches.lines(job.intent_id)] == [
        LineState.UNANSWERED
    ] * 3
    assert store.openai_batches.open_jobs_of(line.task_id for line in job_lines(store, job)) == {}
    assert store.checkpoints.count() == 0


def job_lines(store: Store, job: object) -> list[object]:
    return store.openai_batches.lines(job.intent_id)  # type: ignore[attr-defined, return-value]


def test_tasks_another_planner_took_meanwhile_are_left_out_of_the_job(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another planner records a job for some of the same tasks between the check and the
    record, the job is recorded without them, and the plan says they are in an open job."""
    ids = register(store, 3)
    (first,) = plan(store, ids[:2], TEST_MODEL).jobs
    real = store.openai_batches.open_jobs_of
    checks: list[int] = []

    def first_check_sees_nothing(tasks: object) -> dict[str, str]:
        checks.append(1)  # the other planner recorded its job just after this first check
        return {} if len(checks) == 1 else real(tasks)  # type: ignore[arg-type]

    monkeypatch.setattr(store.openai_batches, "open_jobs_of", first_check_sees_nothing)
    planned = plan(store, ids, TEST_MODEL)
    assert len(checks) > 1, "the record was refused, and the taken tasks looked up"
    (job,) = planned.jobs
    assert [line.document_id for line in store.openai_batches.lines(job.intent_id)] == [ids[2]]
    assert len(planned.in_open_jobs) == 2
    assert {line.intent_id for line in job_lines(store, first)} == {first.intent_id}


def test_expired_lines_can_be_left_to_the_synchronous_path(
    store: Store, simulator: SimulatorServer
) -> None:
    """With expired_to_sync, a task whose line expired is given up on (for the synchronous
    path) instead of batched again."""
    (document,) = register(store, 1)
    task = analyser(store, simulator).task_for(document)
    simulator.set_faults([{"kind": "expire", "match": task}])
    plan(store, [document], TEST_MODEL)
    drain(jobs(store, simulator))
    assert len(plan(store, [document], TEST_MODEL, expired_to_sync=True).jobs) == 0
    assert plan(store, [document], TEST_MODEL, expired_to_sync=True).gave_up == {
        task: "its batch line expired: left to the synchronous path"
    }
    assert len(plan(store, [document], TEST_MODEL).jobs) == 1


def test_a_batch_that_fails_validation_counts_as_an_attempt_of_its_tasks(
    store: Store, simulator: SimulatorServer
) -> None:
    """A batch refused at validation (here: its file corrupted on the way) leaves its lines
    unanswered and its errors on the job; its tasks go again, until max_attempts."""

    client = client_for(simulator)

    def corrupted(*, file: tuple[str, io.BytesIO], purpose: str) -> object:
        """files.create, uploading each file with its first line twice."""
        data = file[1].getvalue()
        doubled = data.splitlines(keepends=True)[0] + data
        return client.files.create(file=(file[0], io.BytesIO(doubled)), purpose=purpose)  # type: ignore[arg-type]

    ids = register(store, 2)
    for attempt in range(1, 5):
        planned = plan(store, ids, TEST_MODEL, max_attempts=3)
        if attempt == 4:
            assert planned.jobs == [] and len(planned.gave_up) == 2
            break
        (job,) = planned.jobs
        progress = BatchJobs(store, with_create(client, "files", corrupted), PRICES).tick()
        failed = store.openai_batches.get(job.intent_id)
        assert failed is not None and failed.remote_status == "failed"
        assert failed.error is not None and "duplicate_custom_id" in failed.error
        assert progress.unanswered_documents == set(ids)


def test_requests_are_split_within_the_line_and_size_limits(store: Store) -> None:
    """Files hold at most max_lines lines and max_bytes bytes; plan makes one job per file."""
    ids = register(store, 5)
    requests, skipped = requests_for(store, ids, TEST_MODEL)
    assert skipped == {} and len(requests) == 5
    assert [len(part) for part in split(requests, max_lines=2)] == [2, 2, 1]
    one = len(requests[0].line())
    by_size = split(requests, max_bytes=2 * one + 10)
    assert all(len(file_of(part)) <= 2 * one + 10 for part in by_size)
    assert sum(len(part) for part in by_size) == 5
    with pytest.raises(ValueError):
        split(requests, max_bytes=one - 1)
    planned = plan(store, ids, TEST_MODEL, max_lines=2)
    assert [job.task_count for job in planned.jobs] == [2, 2, 1]


def test_sixty_thousand_lines_make_two_files() -> None:
    """60,000 requests are cut at OpenAI's 50,000 lines a file."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    requests: Sequence[BatchRequest] = [
        BatchRequest(PlannedTask(f"d{i}-analyse-v1-x", f"d{i}", "analyse"), body)
        for i in range(60_000)
    ]
    assert [len(part) for part in split(requests)] == [50_000, 10_000]


def test_the_batch_price_is_half_unless_the_table_says_otherwise() -> None:
    """A model without batch columns pays half of each price; one with them pays those."""
    plain = Price(2.0, 8.0, 1.0)
    assert plain.for_batch() == Price(1.0, 4.0, 0.5)
    table = Price(2.0, 8.0, None, Price(1.5, 5.0))
    assert table.for_batch().cost(1_000_000, 1_000_000) == pytest.approx(6.5)


KILLED_AT = """
import os, signal, sys
import openai
from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.spend import Price, Prices, estimate_prompt_tokens
from ai_pipeline.store import Store

url, base_url, phase = sys.argv[1:4]

def kill(at, job):
    if at == phase:
        os.kill(os.getpid(), signal.SIGKILL)

client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=10)
for _ in range(5):
    BatchJobs(Store(url), client, Prices({}, Price(1.0, 1.0)), on_phase=kill).tick()
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_a_process_killed_at_any_phase_is_resumed_by_the_next(
    tmp_path: Path, simulator: SimulatorServer, phase: str
) -> None:
    """A process SIGKILLed right after a phase's outside effect (no handler runs): the next
    process makes no second upload or batch and settles each line once."""
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    store = Store(url)
    ids = register(store, 3)
    (job,) = plan(store, ids, TEST_MODEL).jobs
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT, url, simulator.base_url, phase], timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    drain(jobs(store, simulator))

    stats = simulator.stats()
    assert stats["by_endpoint"]["files.create"] == 1
    assert stats["by_endpoint"]["batches.create"] == 1
    assert set(stats["batch_lines_by_key"].values()) == {1} and stats["total"] == 0
    lines = store.openai_batches.lines(job.intent_id)
    assert [line.state for line in lines] == [LineState.ANSWERED] * 3
    assert store.spend.total().attempts == 3
    store.db.dispose()


def test_jobs_reserve_their_budget_at_the_batch_price_and_settle_it_line_by_line(
    store: Store, simulator: SimulatorServer
) -> None:
    """Under a budget each job reserves its lines' prompt estimate and capped completion at the
    batch price; a job the budget cannot hold is not planned; ingestion moves each answered
    line's reservation into what was spent and gives back a failed line's."""
    ids = register(store, 3)
    requests, _ = requests_for(store, ids, TEST_MODEL, completion_cap=200)
    assert {r.body["max_tokens"] for r in requests} == {200}, "capped as a call under a budget"
    per_line = [
        estimate_prompt_tokens(TEST_MODEL, r.body["messages"], r.body["response_format"]) + 200
        for r in requests
    ]
    store.spend.set_budget("launch:b", tokens=per_line[0] + per_line[1], usd=None)
    planned = plan(
        store,
        ids,
        TEST_MODEL,
        max_lines=1,
        budget_keys=["launch:b"],
        prices=PRICES,
        completion_reserve=200,
    )
    assert len(planned.jobs) == 2 and planned.over_budget == [requests[2].task.task_id]
    assert planned.budget_message is not None
    budget = store.spend.budget("launch:b")
    assert budget is not None and budget.reserved_tokens == per_line[0] + per_line[1]
    assert budget.reserved_usd == pytest.approx(
        sum(PRICES.price(TEST_MODEL).for_batch().cost(t - 200, 200) for t in per_line[:2])
    )

    simulator.set_faults([{"kind": "status", "status": 500, "match": requests[1].task.task_id}])
    drain(jobs(store, simulator))
    budget = store.spend.budget("launch:b")
    spent = store.spend.total()
    assert budget is not None and budget.reserved_tokens == 0
    assert budget.reserved_usd == pytest.approx(0, abs=1e-12)
    assert (budget.spent_tokens, spent.attempts) == (spent.tokens, 1)
    assert budget.spent_usd == pytest.approx(spent.cost_usd)
