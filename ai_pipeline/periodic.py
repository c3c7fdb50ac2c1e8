"""An action repeated in a thread of its own while a block runs: a run's sign of life, the
progress line of a command."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def every(seconds: float, action: Callable[[], None], *, name: str) -> Iterator[None]:
    """Call ``action`` every ``seconds`` while the block runs (first after ``seconds``); the
    thread is stopped and joined when the block ends, however it ends. ``action`` keeps its own
    errors: one that escapes ends the repetition, not the block."""
    stop = threading.Event()

    def repeat() -> None:
        while not stop.wait(seconds):
            action()

    thread = threading.Thread(target=repeat, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
