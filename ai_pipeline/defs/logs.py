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

import logging
import sys
from collections.abc import Mapping

from ai_pipeline.retry import Log

PROGRESS_LOGGER = "ai_pipeline.run"
TASK_LINES_TAG = "ai_pipeline/task_lines"


def run_log(events: Log, tags: Mapping[str, str]) -> Log:
    """The log of an analysis run: ``RunLog`` unless the run's tags keep every line in the event
    log."""
    return events if tags.get(TASK_LINES_TAG) == "events" else RunLog(events)


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
