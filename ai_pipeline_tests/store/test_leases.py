"""Leases: one owner per task in one atomic statement, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

from ai_pipeline.processes import ProcessRef
from ai_pipeline.store import Store


def test_a_live_lease_has_one_owner(store: Store) -> None:
    """The first claim wins; another owner is refused; the owner may claim again (renew)."""
    leases = store.leases
    assert leases.claim("t1", "d1", "run-a", 60) is True
    assert leases.claim("t1", "d1", "run-b", 60) is False
    assert leases.claim("t1", "d1", "run-a", 60) is True
    lease = leases.holder("t1")
    assert lease is not None and (lease.owner, lease.document_id) == ("run-a", "d1")
    assert lease.live()


def test_an_expired_lease_is_taken_over(store: Store) -> None:
    """Once its owner stops renewing it, a lease expires and the next claim takes it."""
    leases = store.leases
    assert leases.claim("t1", "d1", "dead-run", 0.2)
    time.sleep(0.3)
    assert leases.claim("t1", "d1", "run-b", 60) is True
    lease = leases.holder("t1")
    assert lease is not None and lease.owner == "run-b"
    assert leases.claim("t1", "d1", "dead-run", 60) is False, "the old owner lost it"


def test_renew_release_and_release_owner(store: Store) -> None:
    """Renewal keeps only the owner's leases; release is the owner's alone."""
    leases = store.leases
    for task in ("t1", "t2", "t3"):
        assert leases.claim(task, f"d-{task}", "run-a", 0.2)
    assert leases.claim("t4", "d-t4", "run-b", 60)
    assert leases.renew("run-a", ["t1", "t2", "t4"], 60) == 2
    time.sleep(0.3)
    assert leases.claim("t3", "d-t3", "run-c", 60) is True, "t3 was not renewed"
    assert leases.claim("t1", "d-t1", "run-c", 60) is False, "t1 was"
    assert leases.release("t1", "run-b") is False
    assert leases.release("t1", "run-a") is True
    assert leases.holder("t1") is None
    assert leases.release_owner("run-a") == 1  # t2
    assert {
        t: [x.owner for x in ls] for t, ls in leases.of_documents(["d-t3", "d-t4"]).items()
    } == {
        "d-t3": ["run-c"],
        "d-t4": ["run-b"],
    }


def test_concurrent_claims_have_exactly_one_winner(store: Store) -> None:
    """Eight threads claiming one task at the same instant: exactly one gets it."""
    start = threading.Barrier(8)
    won: list[str] = []

    def contend(owner: str) -> None:
        start.wait()
        if store.leases.claim("contested", "d", owner, 60):
            won.append(owner)

    threads = [threading.Thread(target=contend, args=(f"run-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    lease = store.leases.holder("contested")
    assert lease is not None and lease.owner == won[0]


def test_a_lease_names_its_process_and_a_dead_owners_lease_is_taken_over(store: Store) -> None:
    """The owner's process is stored with the lease; ``take_over`` moves a live lease from the
    owner named (known dead) to a new one, and only once: a second taker, or one naming an owner
    that no longer holds it, gets nothing."""
    leases = store.leases
    dead = ProcessRef("space-a", 4242, 99)
    assert leases.claim("t1", "d1", "run-dead", 60, dead)
    lease = leases.holder("t1")
    assert lease is not None and lease.process == dead

    mine = ProcessRef("space-a", 4343, 100)
    assert leases.take_over("t1", "run-b", "run-dead", 60, mine) is True
    assert leases.take_over("t1", "run-c", "run-dead", 60) is False
    lease = leases.holder("t1")
    assert lease is not None and (lease.owner, lease.process) == ("run-b", mine)
    assert leases.claim("t1", "d1", "run-dead", 60) is False, "the dead owner lost it"
    assert leases.take_over("t9", "run-b", "run-dead", 60) is False, "no lease at all"
