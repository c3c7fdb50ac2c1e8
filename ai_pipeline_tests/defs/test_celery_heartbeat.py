"""A run's heartbeat on a worker host (``ai_pipeline.defs.celery_worker``), which the launcher's
health check reads when the run's worker answers no ping (``ai_pipeline.defs.celery_launcher``).
The whole path, with a worker drained mid-run, is ``test_scale_out.py``'s."""

from __future__ import annotations

import threading
import time

from ai_pipeline.defs import celery_worker
from ai_pipeline.defs.celery_worker import (
    HEARTBEAT_STALE_SECONDS,
    beating,
    heartbeat_key,
    last_heartbeat,
)


class Backend:
    """The two calls of a Celery key-value result backend the heartbeat uses."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.writes = 0

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.writes += 1
        self.values[key] = value


def test_a_run_beats_while_it_runs_and_is_stale_three_beats_after_its_last() -> None:
    backend = Backend()
    stop = threading.Event()
    beat = threading.Thread(target=celery_worker._beat, args=(backend, "r1", "w@h", stop))
    beat.start()
    try:
        deadline = time.monotonic() + 5
        while backend.writes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        last = last_heartbeat(backend, "r1")
        assert last is not None and last["worker"] == "w@h"
        assert beating(backend, "r1")
        assert not beating(backend, "r2"), "another run: no heartbeat"
    finally:
        stop.set()
        beat.join(timeout=5)
    assert not beat.is_alive(), "the run's end stops its heartbeat"
    at = float(last["at"])
    assert beating(backend, "r1", now=at + HEARTBEAT_STALE_SECONDS - 1)
    assert not beating(backend, "r1", now=at + HEARTBEAT_STALE_SECONDS + 1)
    assert heartbeat_key("r1") in backend.values
