"""Task ids and the ``[TASK:<id>]`` log prefix: how one external call is named everywhere.

A task is one external call of a document's work — its LLM analysis, its completion notice. Its id
(``task_id``) is the call's ``Idempotency-Key``, the key of its checkpoint, and the prefix of every
log line about it: a retry is the same task, a new prompt version or model is not.
"""

from __future__ import annotations

import hashlib

from ai_pipeline.redaction import redact
from ai_pipeline.retry import Log

ANALYSE_STEP = "analyse"
# The call that reduces a sectioned document's outputs to the document's, when the analysis
# declares one.
REDUCE_STEP = "reduce"
NOTIFY_STEP = "notify"
# The source of a document submitted over HTTP (``api:<tenant>/<name>``): only such a document can
# be cancelled while a run holds it.
SUBMITTED = "api:"


def task_id(document_id: str, step: str, prompt_version: str, model: str) -> str:
    """The idempotency key of one external call: a retry is the same task, a new prompt is not.

    The model name is hashed (it may hold ``/`` or ``:``, e.g. ``meta-llama/Llama-3:8b``) so that the
    id stays safe in headers, file names and log prefixes.
    """
    return document_id + task_suffix(step, prompt_version, model)


def task_suffix(step: str, prompt_version: str, model: str) -> str:
    """What follows the document id in every task id of this step, prompt version and model
    (``-analyse-v1-1a2b3c4d``): the results store compares it in SQL to tell current analyses
    from stale ones."""
    model_tag = hashlib.sha256(model.encode("utf-8")).hexdigest()[:8]
    return f"-{step}-{prompt_version}-{model_tag}"


SECTION_STEP_PREFIX = f"{ANALYSE_STEP}.s"


def section_step(index: int) -> str:
    """The step of a long document's section ``index`` (1-based): its own task and checkpoint."""
    return f"{SECTION_STEP_PREFIX}{index:03d}"


def document_of(task: str) -> str:
    """The document id a task id was built from (document ids are hex: they hold no ``-``)."""
    return task.split("-", 1)[0]


def step_of(task: str) -> str:
    """The step a task id was built for (``analyse``, ``analyse.s003``, ``notify``)."""
    return task.split("-", 2)[1]


class TaskLog:
    """Prefixes every line about a task with ``[TASK:<task id>]`` and redacts secrets from it."""

    def __init__(self, log: Log, task: str):
        self._log, self.prefix = log, f"[TASK:{task}]"

    def info(self, msg: str) -> None:
        self._log.info(redact(f"{self.prefix} {msg}"))

    def warning(self, msg: str) -> None:
        self._log.warning(redact(f"{self.prefix} {msg}"))

    def error(self, msg: str) -> None:
        self._log.error(redact(f"{self.prefix} {msg}"))
