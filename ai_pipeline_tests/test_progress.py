"""The progress line (done / failed / pending, rate, ETA) and how the command line shows it."""

from __future__ import annotations

import io

from ai_pipeline.cli.common import Console
from ai_pipeline.progress import Pace, Progress
from ai_pipeline.states import State


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_counts_done_failed_pending_with_rate_and_eta() -> None:
    """The rate counts only what ended since the start (documents done before do not inflate
    it); the ETA is what is pending at that rate."""
    clock = Clock()
    progress = Progress(1000, clock=clock)
    assert progress.line({State.COMPLETED: 100}) == "100/1000 done, 0 failed, 900 pending"
    clock.now += 10
    line = progress.line({State.COMPLETED: 290, State.FAILED: 5, State.DEAD_LETTER: 5})
    assert line == "290/1000 done, 10 failed, 700 pending · 20.0 docs/s · ETA 35s"
    clock.now += 90
    line = progress.line({State.COMPLETED: 990, State.FAILED: 10})
    assert line == "990/1000 done, 10 failed, 0 pending · 9.0 docs/s"


def test_a_wait_looks_every_second_until_the_end_nears_then_more_often() -> None:
    """No rate yet: the longest wait. Then a quarter of the time left at the rate seen, never
    below the shortest: 800 left at 20 docs/s is 40 s away (1 s), 20 left is 1 s away (0.25 s),
    2 left is 0.1 s away (0.2 s)."""
    clock = Clock()
    pace = Pace(1000, clock=clock)
    assert pace.next_wait() == 1.0
    pace.saw({State.RUNNING: 16})
    assert pace.next_wait() == 1.0, "nothing ended yet: no rate"
    clock.now += 10
    pace.saw({State.COMPLETED: 190, State.FAILED: 10})
    assert pace.next_wait() == 1.0
    clock.now += 39
    pace.saw({State.COMPLETED: 970, State.DEAD_LETTER: 10})
    assert pace.next_wait() == 0.25
    clock.now += 0.9
    pace.saw({State.COMPLETED: 988, State.CANCELLED: 10})
    assert pace.next_wait() == 0.2


def test_long_etas_read_in_minutes_and_hours() -> None:
    clock = Clock()
    progress = Progress(100_000, clock=clock)
    progress.line({})
    clock.now += 10
    assert progress.line({State.COMPLETED: 30}).endswith("· 3.0 docs/s · ETA 9h15m")
    minutes = Progress(10_000, clock=clock)
    minutes.line({})
    clock.now += 60
    assert minutes.line({State.COMPLETED: 600}).endswith("· 10.0 docs/s · ETA 15m40s")


class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_terminal_gets_the_line_rewritten_in_place_and_cleared_before_a_message() -> None:
    stream = Stream(tty=True)
    console = Console(stream)
    console.live("1/3 done")
    console.live("2/3 done")
    console.say("run 1/1: succeeded")
    assert stream.getvalue() == ("\r\x1b[K1/3 done\r\x1b[K2/3 done\r\x1b[Krun 1/1: succeeded\n")


def test_a_log_file_gets_a_plain_line_now_and_then() -> None:
    """Not a terminal: no control characters, and at most one live line per interval."""
    stream = Stream(tty=False)
    console = Console(stream, every=3600)
    for i in range(100):
        console.live(f"{i}/100 done")
    console.say("done")
    assert stream.getvalue() == "0/100 done\ndone\n"
