"""The global cap's slots (``CallSlots``) on SQLite and PostgreSQL, and waiting for one
(``GlobalCap``): never more holders than slots, and every slot comes back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ai_pipeline.llm_access import GlobalCap
from ai_pipeline.processes import ProcessRef, current
from ai_pipeline.store import Store
from ai_pipeline.store.slots import DEAD_CHECK_SECONDS, CallSlots


def held(slots: CallSlots, size: int) -> dict[int, str]:
    return {s.slot: s.holder for s in slots.of(size) if s.holder is not None}


def dead_process() -> ProcessRef:
    """A process of this machine that is not running: this one's pid with another start time."""
    me = current()
    assert me is not None
    return ProcessRef(me.space, me.pid, me.started + 1)


def test_at_most_size_slots_are_held_and_only_the_holder_gives_one_back(store: Store) -> None:
    """Three slots go to three holders and a fourth gets none; a slot given back by its holder
    (not by another) is taken again."""
    slots = store.call_slots
    taken = [slots.take(3, f"h{i}", 60) for i in range(3)]
    assert sorted(t for t in taken if t is not None) == [0, 1, 2]
    assert slots.take(3, "h3", 60) is None
    assert held(slots, 3) == {taken[i]: f"h{i}" for i in range(3)}  # type: ignore[misc]

    assert slots.release(taken[1], "h0") is False  # type: ignore[arg-type]
    assert slots.release(taken[1], "h1") is True  # type: ignore[arg-type]
    assert slots.take(3, "h3", 60) == taken[1]
    assert slots.take(1, "h4", 60) is None, "a smaller cap uses the first slots only"


def test_concurrent_takers_get_distinct_slots(store: Store) -> None:
    """Eight threads taking one of three slots at the same instant: exactly three get one, each a
    different one."""
    start = threading.Barrier(8)
    won: dict[str, int] = {}

    def contend(holder: str) -> None:
        start.wait()
        slot = store.call_slots.take(3, holder, 60)
        if slot is not None:
            won[holder] = slot

    threads = [threading.Thread(target=contend, args=(f"h{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won.values()) == [0, 1, 2]
    assert held(store.call_slots, 3) == {slot: holder for holder, slot in won.items()}


def test_an_expired_slot_of_a_dead_holder_is_taken_over(store: Store) -> None:
    """A holder that stops renewing loses its slot when the lease expires: the next taker gets it,
    and the old holder can neither renew nor release it."""
    slots = store.call_slots
    assert slots.take(1, "crashed", 0.2) == 0
    assert slots.take(1, "next", 60) is None
    time.sleep(0.3)
    assert slots.take(1, "next", 60) == 0
    assert slots.renew(0, "crashed", 60) is False
    assert slots.release(0, "crashed") is False
    assert held(slots, 1) == {0: "next"}


def test_a_renewed_slot_is_kept(store: Store) -> None:
    """Renewal pushes the expiry: past the first lease the slot is still its holder's."""
    slots = store.call_slots
    assert slots.take(1, "long-call", 0.2) == 0
    assert slots.renew(0, "long-call", 60) is True
    time.sleep(0.3)
    assert slots.take(1, "other", 60) is None


def test_the_slot_of_a_process_known_dead_is_taken_at_once(store: Store) -> None:
    """A slot whose holder's process is gone on this machine is taken before its lease expires,
    one held by a live process is not, and the processes are looked at once per interval."""
    now = [0.0]
    slots = CallSlots(store.db, clock=lambda: now[0])
    assert slots.take(3, "live", 60, current()) is not None
    assert slots.take(3, "dead-1", 60, dead_process()) is not None
    assert slots.take(3, "dead-2", 60, dead_process()) is not None
    assert slots.take(3, "next", 60) is not None
    assert slots.take(3, "again", 60) is None, "looked at the processes a moment ago"
    now[0] += DEAD_CHECK_SECONDS
    assert slots.take(3, "again", 60) is not None
    assert sorted(held(slots, 3).values()) == ["again", "live", "next"]


def run_holders(caps: list[GlobalCap], calls: int, seconds: float) -> int:
    """``calls`` tasks per cap, each holding a slot for ``seconds``; the most held at once."""
    in_flight = peak = 0

    async def call(cap: GlobalCap) -> None:
        nonlocal in_flight, peak
        async with cap.hold():
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(seconds)
            in_flight -= 1

    async def all_calls() -> None:
        await asyncio.gather(*(call(cap) for cap in caps for _ in range(calls)))

    asyncio.run(all_calls())
    return peak


def test_waiters_of_two_caps_on_one_database_never_exceed_it(store: Store) -> None:
    """Two caps of two on the same slots (two runs), twelve calls of 50 ms each: never more than
    two in flight, all of them done, every slot given back."""
    caps = [GlobalCap(store.call_slots, 2, lease_seconds=30) for _ in range(2)]
    assert run_holders(caps, 6, 0.05) == 2
    assert held(store.call_slots, 2) == {}


def test_a_failed_or_cancelled_call_gives_its_slot_back(store: Store) -> None:
    """A call that raises, one cancelled while it holds a slot and one cancelled while it waits
    for one leave no slot held."""
    cap = GlobalCap(store.call_slots, 1, lease_seconds=30)

    async def scenario() -> None:
        with pytest.raises(RuntimeError):
            async with cap.hold():
                raise RuntimeError("the request failed")
        entered = asyncio.Event()

        async def holding() -> None:
            async with cap.hold():
                entered.set()
                await asyncio.sleep(60)

        holder = asyncio.create_task(holding())
        await entered.wait()
        waiter = asyncio.create_task(holding())
        await asyncio.sleep(0.1)
        for task in (waiter, holder):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert held(store.call_slots, 1) == {}


def test_a_slot_is_renewed_while_its_call_lasts(store: Store) -> None:
    """A call longer than the slot's lease keeps its slot: another taker finds none."""
    cap = GlobalCap(store.call_slots, 1, lease_seconds=0.3)

    async def long_call() -> int | None:
        async with cap.hold():
            await asyncio.sleep(0.6)
            return store.call_slots.take(1, "other", 60)

    assert asyncio.run(long_call()) is None
    assert held(store.call_slots, 1) == {}
