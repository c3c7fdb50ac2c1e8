"""Reconciling documents with their runs: none stays RUNNING once its run is over; claims taken
over from dead runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ai_pipeline.claims import Claims
from ai_pipeline.documents import parse_document
from ai_pipeline.failures import Category
from ai_pipeline.processes import ProcessRef, current
from ai_pipeline.reconcile import fail_unstarted, reconcile
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline_tests.support import FakeTime, RecordingLog


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'reconcile.sqlite'}")
    yield s
    s.db.dispose()


def running(store: Store, text: str, run_id: str, *, lease_seconds: float | None = 60) -> str:
    """A document RUNNING in ``run_id`` (with a lease of that many seconds, or none)."""
    doc = parse_document(text.encode("utf-8"), f"inbox/{run_id}-{len(text)}.txt")
    store.documents.register(doc)
    if lease_seconds is not None:
        assert store.leases.claim(
            f"{doc.document_id}-analyse", doc.document_id, run_id, lease_seconds
        )
    store.documents.transition(doc.document_id, State.QUEUED)
    store.documents.transition(doc.document_id, State.RUNNING, run_id=run_id)
    return doc.document_id


def test_a_document_of_a_run_that_is_over_is_interrupted(store: Store) -> None:
    """RUNNING in a run Dagster says FAILED: FAILED, RUN_INTERRUPTED, a failure event, its
    claims given up; a document of a live run with a live claim is left alone."""
    dead = running(store, "A document whose worker was killed.", "run-dead")
    alive = running(store, "A document whose run is still going.", "run-alive")

    out = reconcile(store, lambda ids: {"run-dead": "FAILURE", "run-alive": "STARTED"})

    assert [i.document_id for i in out] == [dead]
    doc = store.documents.get(dead)
    assert doc is not None
    assert (doc.state, doc.category, doc.attempts) == (State.FAILED, Category.RUN_INTERRUPTED, 1)
    assert "run-dead ended (FAILURE)" in (doc.last_error or "")
    assert [e.category for e in store.events.failures(dead)] == [Category.RUN_INTERRUPTED]
    assert store.leases.of_documents([dead]) == {}
    still = store.documents.get(alive)
    assert still is not None and still.state == State.RUNNING
    assert reconcile(store, lambda ids: {"run-alive": "STARTED"}) == []


def test_a_run_that_stopped_renewing_is_interrupted(store: Store) -> None:
    """A run Dagster never heard end (a CLI run killed with SIGKILL) is over once its claim
    expired; without any claim it is over too."""
    expired = running(store, "Its owner died without a word.", "cli-run", lease_seconds=0.1)
    unclaimed = running(store, "Left RUNNING with no claim at all.", "old-run", lease_seconds=None)
    time.sleep(0.2)

    out = reconcile(store, lambda ids: {})

    assert {i.document_id for i in out} == {expired, unclaimed}
    assert all("stopped holding it" in i.reason for i in out)


def test_a_document_taken_over_meanwhile_is_not_interrupted(store: Store) -> None:
    """If another run took the document between the read and the write, nothing is changed."""
    doc_id = running(store, "Taken over by a new run.", "run-old", lease_seconds=None)

    def status(run_ids: object) -> dict[str, str]:
        # The new run takes the document over while the reconciler looks at Dagster.
        store.documents.transition(doc_id, State.QUEUED)
        store.documents.transition(doc_id, State.RUNNING, run_id="run-new")
        return {"run-old": "FAILURE"}

    assert reconcile(store, status) == []
    doc = store.documents.get(doc_id)
    assert doc is not None and (doc.state, doc.run_id) == (State.RUNNING, "run-new")


def registered(store: Store, text: str) -> str:
    doc = parse_document(text.encode("utf-8"), f"inbox/{len(text)}.txt")
    store.documents.register(doc)
    return doc.document_id


def test_documents_an_ended_run_never_started_are_failed_retryably(store: Store) -> None:
    """The PENDING and QUEUED documents of an ended run: FAILED, RUN_INTERRUPTED (no attempt
    counted: nothing was tried), a failure event each; one started or settled by another run
    is left as it is."""
    pending = registered(store, "Never reached by its run.")
    queued = registered(store, "Queued for a run that died.")
    store.documents.transition(queued, State.QUEUED)
    elsewhere = running(store, "Taken by another run meanwhile.", "run-other")

    out = fail_unstarted(store, "run-dead", [pending, queued, elsewhere])

    assert sorted(i.document_id for i in out) == sorted([pending, queued])
    for document_id in (pending, queued):
        doc = store.documents.get(document_id)
        assert doc is not None
        assert (doc.state, doc.category, doc.attempts, doc.run_id) == (
            State.FAILED,
            Category.RUN_INTERRUPTED,
            0,
            "run-dead",
        )
        assert "ended before starting it" in (doc.last_error or "")
        assert [e.category for e in store.events.failures(document_id)] == [
            Category.RUN_INTERRUPTED
        ]
    other = store.documents.get(elsewhere)
    assert other is not None and (other.state, other.run_id) == (State.RUNNING, "run-other")
    assert fail_unstarted(store, "run-dead", [pending, queued]) == []


def test_claims_wait_for_the_holder_then_take_or_leave(store: Store) -> None:
    """A claim held by another run is waited for; released, it is taken; still held after the
    wait, it is left to its holder (no exception, the holder named)."""
    store.leases.claim("t1", "d1", "run-a", 60)
    fake = FakeTime()
    claims = Claims(
        store, "run-b", wait_seconds=5, poll_seconds=1, sleep=fake.sleep, clock=fake.clock
    )
    log = RecordingLog()

    assert asyncio.run(claims.take("t1", "d1", log)) == "run-a"
    assert fake.sleeps == [1, 1, 1, 1, 1]
    assert "in progress in run run-a" in log.infos[0]
    assert "left to it" in log.warnings[0]

    async def released_after_two_polls() -> str | None:
        async def release_soon() -> None:
            await asyncio.sleep(0)
            store.leases.release("t1", "run-a")

        real = Claims(store, "run-b", wait_seconds=5, poll_seconds=0.05)
        asyncio.ensure_future(release_soon())
        return await real.take("t1", "d1", log)

    assert asyncio.run(released_after_two_polls()) is None
    lease = store.leases.holder("t1")
    assert lease is not None and lease.owner == "run-b"


def test_a_claim_whose_owner_is_known_dead_is_taken_over_at_once(store: Store) -> None:
    """A live claim held by a process that has ended on this machine, or by a run Dagster says
    is over, is taken over without a single wait; one held by a live process of a live run is
    waited for as before."""
    me = current()
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    ended = ProcessRef(me.space, child.pid, 0)
    store.leases.claim("t1", "d1", "run-killed", 600, ended)
    store.leases.claim("t2", "d2", "run-over", 600, ProcessRef("another-machine", 1, 1))
    store.leases.claim("t3", "d3", "run-alive", 600, me)
    fake = FakeTime()
    claims = Claims(
        store,
        "run-b",
        wait_seconds=3,
        poll_seconds=1,
        sleep=fake.sleep,
        clock=fake.clock,
        owner_over=lambda owner: owner == "run-over",
    )
    log = RecordingLog()

    assert asyncio.run(claims.take("t1", "d1", log)) is None
    assert asyncio.run(claims.take("t2", "d2", log)) is None
    assert fake.sleeps == []
    assert [line for line in log.infos if "taken over" in line] == [
        "taken over from run run-killed: its process has ended",
        "taken over from run run-over: its run is over",
    ]
    for task in ("t1", "t2"):
        lease = store.leases.holder(task)
        assert lease is not None and (lease.owner, lease.process) == ("run-b", me)
    assert asyncio.run(claims.take("t3", "d3", log)) == "run-alive"
    assert fake.sleeps == [1, 1, 1]


def test_a_document_whose_process_ended_is_interrupted_before_its_claim_expires(
    store: Store,
) -> None:
    """RUNNING under a live claim whose process has ended on this machine (a CLI run killed with
    SIGKILL): interrupted at once, not a lease later."""
    me = current()
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    killed = running(
        store, "Its process was killed a moment ago.", "cli-killed", lease_seconds=None
    )
    alive = running(store, "Its process still runs.", "cli-alive", lease_seconds=None)
    store.leases.claim(
        f"{killed}-analyse", killed, "cli-killed", 600, ProcessRef(me.space, child.pid, 0)
    )
    store.leases.claim(f"{alive}-analyse", alive, "cli-alive", 600, me)

    out = reconcile(store, lambda ids: {})

    assert [i.document_id for i in out] == [killed]
    assert "its process ended" in out[0].reason


def test_claims_are_renewed_while_held(store: Store) -> None:
    """keep_renewing pushes the expiry of every held claim a third of a lease apart."""
    claims = Claims(store, "run-a", lease_seconds=0.3)
    log = RecordingLog()

    async def hold_for(seconds: float) -> None:
        assert await claims.take("t1", "d1", log) is None
        renewer = asyncio.ensure_future(claims.keep_renewing(log))
        await asyncio.sleep(seconds)
        renewer.cancel()

    asyncio.run(hold_for(1.0))
    assert store.leases.claim("t1", "d1", "run-b", 60) is False, "still live: it was renewed"
    claims.release("t1")
    assert store.leases.claim("t1", "d1", "run-b", 60) is True
    assert not log.warnings


def test_a_run_that_returned_in_this_process_is_over_whatever_dagster_recorded(
    store: Store,
) -> None:
    """After an in-process run returned, its documents are reconciled even when Dagster still
    says STARTED (its storage was away when the run ended) or cannot be asked at all."""
    from ai_pipeline.defs.launch import returned

    mine = running(store, "A document of the run that just returned.", "run-mine")
    other = running(store, "A document of another live run.", "run-other")

    def unreachable(ids: object) -> dict[str, str]:
        raise ConnectionError("the instance's database is away")

    out = reconcile(store, returned("run-mine", lambda ids: {i: "STARTED" for i in ids}))
    assert [i.document_id for i in out] == [mine]
    again = running(store, "Another document of a run that returned.", "run-gone")
    assert [i.document_id for i in reconcile(store, returned("run-gone", unreachable))] == [again]
    still = store.documents.get(other)
    assert still is not None and still.state == State.RUNNING
