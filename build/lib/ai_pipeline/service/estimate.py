"""How long a submitted task will take, as the submission answers it (``estimated_seconds``).

From what the results database already knows, with two cheap queries: the LLM time of the newest
analysis calls (their checkpoints hold each call's latency), and the documents queued or running
ahead of this one. The new document's calls (one per section) join those in waves of the per-run
LLM concurrency, after the time a submission takes to become a run. It errs long: several runs at
once share the queue faster than one.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.tasks import ANALYSE_STEP

# The submissions sensor's interval (5 s) plus a run's process start and code import.
START_SECONDS = 10
# A call's time before any has been measured.
DEFAULT_CALL_SECONDS = 5.0
LATENCY_SAMPLE = 50
AHEAD = (State.QUEUED, State.RUNNING)


@dataclass
class Estimator:
    store: Store
    concurrency: int
    section_chars: int
    # The measured call time is read again at most this often (a submission stays a few ms).
    refresh_seconds: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _call_seconds: float | None = field(default=None, init=False)
    _read_at: float = field(default=-math.inf, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def call_seconds(self) -> float:
        with self._lock:
            now = self.clock()
            if self._call_seconds is None or now - self._read_at >= self.refresh_seconds:
                latencies = self.store.checkpoints.recent_latencies_ms(ANALYSE_STEP, LATENCY_SAMPLE)
                self._call_seconds = (
                    statistics.median(latencies) / 1000 if latencies else DEFAULT_CALL_SECONDS
                )
                self._read_at = now
            return self._call_seconds

    def seconds(self, text: str) -> int:
        calls = len(self.store.analysis.cut(text, self.section_chars))
        ahead = self.store.documents.count_in(AHEAD)
        waves = math.ceil((ahead + calls) / max(1, self.concurrency))
        return math.ceil(START_SECONDS + waves * self.call_seconds())
