"""The LLM client under the global cap (``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY``): each HTTP attempt
holds a slot of the results database, and no wait between attempts does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ai_pipeline.llm_access import GlobalCap
from ai_pipeline.processes import ProcessRef
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.store import Store
from ai_pipeline.store.slots import CallSlots
from ai_pipeline_tests.support import FakeTime
from ai_pipeline_tests.test_llm import MESSAGES, assert_valid_reply, make_client, run_with, task_id


class RecordedSlots:
    """The store's slots, with every take that got one, every release and every retry wait
    recorded in one sequence."""

    def __init__(self, slots: CallSlots, fake: FakeTime):
        self.slots = slots
        self.order: list[str] = []
        self._sleep = fake.sleep
        fake.sleep = self.sleep  # type: ignore[method-assign]

    def take(
        self, size: int, holder: str, seconds: float, process: ProcessRef | None = None
    ) -> int | None:
        slot = self.slots.take(size, holder, seconds, process)
        if slot is not None:
            self.order.append("take")
        return slot

    def renew(self, slot: int, holder: str, seconds: float) -> bool:
        return self.slots.renew(slot, holder, seconds)

    def release(self, slot: int, holder: str) -> bool:
        self.order.append("release")
        return self.slots.release(slot, holder)

    async def sleep(self, seconds: float) -> None:
        self.order.append("retry wait")
        await self._sleep(seconds)


def test_each_attempt_holds_a_slot_and_gives_it_back_before_the_retry_wait(
    simulator: SimulatorServer, tmp_path: Path
) -> None:
    """Two 503s and then an answer: three attempts, each holding the one slot only while its
    request is out — the retry waits hold none — and the slot is free afterwards."""
    store = Store(f"sqlite:///{tmp_path / 'results.sqlite'}")
    tid = task_id("cap")
    simulator.set_faults([{"kind": "status", "status": 503, "match": tid, "times": 2}])
    fake = FakeTime()
    slots = RecordedSlots(store.call_slots, fake)

    def client() -> Any:
        return make_client(simulator, fake, global_cap=GlobalCap(slots, 1, lease_seconds=30))

    reply = run_with(client, lambda c: c.analyse(tid, MESSAGES))

    assert_valid_reply(reply)
    assert simulator.requests_for(tid) == 3
    assert slots.order == ["take", "release", "retry wait"] * 2 + ["take", "release"]
    assert [s.holder for s in store.call_slots.of(1)] == [None]
    store.db.dispose()
