"""Where a run's lines go: what a person must see to the event log, the rest to the compute log.

Every line written with ``context.log`` is an event-log entry, one synchronous database write. So
the per-document progress lines of an analysis run (``[TASK:<id>] calling …``, ``completed``, ``LLM
checkpoint found``) go to the logger ``ai_pipeline.run``, which writes to the step's stderr:
Dagster captures it as the run's compute log (the UI's stdout/stderr tab, still searchable by
``[TASK:<id>]``). Warnings and errors — a failure, a document left to another run — stay in the
event log, where the run page shows them.

Dagster mirrors a step's stderr to the terminal of the process that runs it, so a command that
runs the job in its own process (``ai-pipeline run``) tags its runs ``ai_pipeline/task_lines:
events``: their lines stay in the event log, and the terminal shows only the command's own output.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import datetime, timezone

from ai_pipeline.failures import Category
from ai_pipeline.retry import Log
from ai_pipeline.tasks import document_of

PROGRESS_LOGGER = "ai_pipeline.run"
TASK_LINES_TAG = "ai_pipeline/task_lines"


def run_log(
    events: Log,
    tags: Mapping[str, str],
    *,
    run_id: str | None = None,
    json_path: str | None = None,
) -> Log:
    """The log of an analysis run: ``RunLog`` unless the run's tags keep every line in the event
    log; every line also as JSON to ``json_path`` (AI_PIPELINE_JSON_LOG) when it is set."""
    log: Log = events if tags.get(TASK_LINES_TAG) == "events" else RunLog(events)
    return JsonLinesLog(log, json_path, run_id) if json_path else log


_TASK = re.compile(r"\[(?:[A-Z ]+ for )?TASK:([^\]\s]+)\]")
# The retry policy's lines name their category by their prefix.
_PREFIXES = {
    "[RETRY #": Category.NETWORK_TIMEOUT,
    "[RATE LIMIT for": Category.RATE_LIMIT_EXCEEDED,
    "[AUTH for": Category.AUTH_FAILED,
}
_CATEGORY = re.compile(r"\b(" + "|".join(c.value for c in Category) + r")\b")


class JsonLinesLog:
    """Every line of a run also as one JSON object per line, appended to a file shared by every
    run (each line one ``write`` on an O_APPEND file): timestamp, level, task_id, document_id,
    run_id, layer, category (of a line about a failure), message."""

    def __init__(self, inner: Log, path: str, run_id: str | None):
        self.inner, self.path, self.run_id = inner, path, run_id

    def info(self, msg: str) -> None:
        self._write("INFO", msg)
        self.inner.info(msg)

    def warning(self, msg: str) -> None:
        self._write("WARNING", msg)
        self.inner.warning(msg)

    def error(self, msg: str) -> None:
        self._write("ERROR", msg)
        self.inner.error(msg)

    def _write(self, level: str, msg: str) -> None:
        task = _TASK.search(msg)
        named = _CATEGORY.search(msg)
        category = next((c for p, c in _PREFIXES.items() if p in msg), None) or (
            Category(named.group(1)) if named else None
        )
        line = {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "level": level,
            "task_id": task.group(1) if task else None,
            "document_id": document_of(task.group(1)) if task else None,
            "run_id": self.run_id,
            "layer": category.rule.layer.value if category else None,
            "category": category.value if category else None,
            "message": msg,
        }
        data = (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:  # a log file that cannot be written must not fail the run
            self.inner.warning(f"AI_PIPELINE_JSON_LOG {self.path}: {e.strerror or e}")


def progress_logger() -> logging.Logger:
    logger = logging.getLogger(PROGRESS_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger


class RunLog:
    """A ``Log`` for the analysis step: info lines to the compute log, the rest to the event log."""

    def __init__(self, events: Log, progress: logging.Logger | None = None):
        self.events = events
        self.progress = progress or progress_logger()

    def info(self, msg: str) -> None:
        self.progress.info(msg)

    def warning(self, msg: str) -> None:
        self.events.warning(msg)

    def error(self, msg: str) -> None:
        self.events.error(msg)
