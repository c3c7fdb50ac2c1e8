"""What the libraries under a command log, as a person reads it: one line, no SQL, no links.

Dagster's PostgreSQL storage logs each retry of a lost connection with SQLAlchemy's whole text
(the statement, its parameters, a link to SQLAlchemy's docs), once a second while the database is
away, and Dagster writes a failed event write to stderr the same way. A command shows the first
line of each such text once a minute, redacted.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from ai_pipeline.redaction import redact

# The same line again within this long is left out.
REPEAT_SECONDS = 60.0
_MARKS = ("[SQL:", "[parameters:", "(Background on this error at:")


def plain(text: str) -> str:
    """The first line of a library's error text, without SQLAlchemy's statement and link."""
    cut = min((i for m in _MARKS if (i := text.find(m)) >= 0), default=len(text))
    lines = [line.strip() for line in text[:cut].splitlines() if line.strip()]
    return redact(lines[0]) if lines else ""


class PlainRecords(logging.Filter):
    """Rewrites each record to ``plain`` and drops one said within ``REPEAT_SECONDS``."""

    def __init__(self) -> None:
        super().__init__()
        self._said: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        line = plain(record.getMessage())
        now = time.monotonic()
        if not line or now - self._said.get(line, -REPEAT_SECONDS) < REPEAT_SECONDS:
            return False
        self._said[line] = now
        record.msg, record.args, record.exc_info, record.exc_text = line, None, None, None
        return True


_HANDLER_NAME = "ai-pipeline-plain"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (a command may replace it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def show_plainly() -> None:
    """Libraries' warnings and errors reach the terminal as ``plain`` lines (once a process)."""
    root = logging.getLogger()
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    handler = _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setLevel(logging.WARNING)
    handler.addFilter(PlainRecords())
    handler.setFormatter(logging.Formatter("ai-pipeline: %(name)s: %(message)s"))
    root.addHandler(handler)


class PlainStream:
    """A text stream that writes a library's error text (one with SQLAlchemy's statement or link)
    as its ``plain`` line, once a minute; anything else as it comes."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._said: dict[str, float] = {}

    def write(self, text: str) -> int:
        if not any(m in text for m in _MARKS):
            return self._stream.write(text)
        line = plain(text)
        now = time.monotonic()
        if line and now - self._said.get(line, -REPEAT_SECONDS) >= REPEAT_SECONDS:
            self._said[line] = now
            self._stream.write(line + "\n")
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def plainly() -> Iterator[None]:
    """For the duration: libraries' log records and their texts on stderr, plainly."""
    show_plainly()
    before = sys.stderr
    sys.stderr = PlainStream(before)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stderr = before
