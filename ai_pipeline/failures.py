"""The failure taxonomy: every failure of a document's work lands in exactly one category.

A category fixes what happens next; nothing else in the code decides that. ``RULES``
below is the one table of category → layer, retryable?, disposition, action and typical
cause; docs/failures.md is rendered from it (``ai_pipeline.cli.reference``).

A STOPPED disposition is the run's, not the document's: a setting is wrong (the model name, a
parameter the model does not take, the endpoint's address), so every document would fail the same
way. The run stops sending at the first such reply; its documents are neither failed nor reviewed,
and no attempt counts against their retry budget: the next run, with the setting fixed, takes them
as if this one had not happened.

``retryable`` means a later run (a backfill) can fix it without a person; it does not mean "retry
now". Only NETWORK_TIMEOUT is retried within the run, and RATE_LIMIT_EXCEEDED waits once. The
runtime layer is the pipeline's own ground: the Dagster run that held a document (killed,
terminated from the UI, a worker that died: ``ai_pipeline.reconcile``) and the results database
(retried for a while by ``ai_pipeline.store.database`` before it counts).

HTTP statuses (``category_for_status``), for the LLM endpoint and for downstream receivers:

=========  ===========================  =====================================================
status     LLM endpoint                 downstream receiver (a notification webhook)
=========  ===========================  =====================================================
401, 403   AUTH_FAILED                  BUSINESS_REJECTED
404        CONFIGURATION (no such model BUSINESS_REJECTED
           or path)
408        NETWORK_TIMEOUT              NETWORK_TIMEOUT
409        NETWORK_TIMEOUT (our key is  DUPLICATE_EXECUTION (it already has our key: done)
           still in flight there)
429        RATE_LIMIT_EXCEEDED          RATE_LIMIT_EXCEEDED
other 4xx  INPUT_QUALITY_ISSUE          BUSINESS_REJECTED
5xx        NETWORK_TIMEOUT              NETWORK_TIMEOUT
=========  ===========================  =====================================================

An LLM endpoint's 400 that names a request setting in its ``param`` (``temperature``,
``max_tokens``, ``response_format``, ``model``, …: ``SETTING_PARAMETERS``), or whose ``code`` is
``model_not_found``, is CONFIGURATION too (``category_for_reply``): OpenAI answers a parameter the
model refuses with 400 ``unsupported_value``/``unsupported_parameter``. A 400 about the messages
(``context_length_exceeded``, ``param`` = ``messages``) stays INPUT_QUALITY_ISSUE: it is the
document's (the engine first cuts such a document into sections when its analysis has them:
``ai_pipeline.truncation``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Layer(str, enum.Enum):
    NETWORK = "network"
    PROTOCOL = "protocol"
    MODEL = "model"
    BUSINESS = "business"
    RUNTIME = "runtime"
    INTERNAL = "internal"
    SETTINGS = "settings"


class Disposition(str, enum.Enum):
    DONE = "done"
    RETRY = "retry"
    REVIEW = "review"
    QUARANTINED = "quarantined"
    FAILED = "failed"
    # The run stops; its documents stay as they were, for the next run.
    STOPPED = "stopped"


class Category(str, enum.Enum):
    NETWORK_TIMEOUT = "NETWORK_TIMEOUT"
    RATE_LIMIT_EXCEEDED = "RATE_LIMIT_EXCEEDED"
    AUTH_FAILED = "AUTH_FAILED"
    CONFIGURATION = "CONFIGURATION"
    INPUT_QUALITY_ISSUE = "INPUT_QUALITY_ISSUE"
    SCHEMA_VIOLATION = "SCHEMA_VIOLATION"
    LOW_CONFIDENCE = "LOW_CONFIDENCE"
    MODEL_REFUSAL = "MODEL_REFUSAL"
    MODEL_HALLUCINATION = "MODEL_HALLUCINATION"
    DUPLICATE_EXECUTION = "DUPLICATE_EXECUTION"
    BUSINESS_REJECTED = "BUSINESS_REJECTED"
    RUN_INTERRUPTED = "RUN_INTERRUPTED"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    BUDGET_REACHED = "BUDGET_REACHED"
    INTERNAL_ERROR = "INTERNAL_ERROR"

    @property
    def rule(self) -> Rule:
        return RULES[self]

    @property
    def retryable(self) -> bool:
        return RULES[self].retryable

    @property
    def needs_person(self) -> bool:
        return RULES[self].disposition in (Disposition.REVIEW, Disposition.QUARANTINED)

    @property
    def stops_run(self) -> bool:
        """A fault of the run's settings: the run stops, its documents are left as they were."""
        return RULES[self].disposition == Disposition.STOPPED


# The failures of a run, not of its documents (its end, its database): ``run`` gives their
# documents another wave, and another ``run`` finishes them.
RUN_FAULTS = frozenset({Category.RUN_INTERRUPTED, Category.DATABASE_UNAVAILABLE})


@dataclass(frozen=True)
class Rule:
    layer: Layer
    retryable: bool
    disposition: Disposition
    action: str
    # What usually lands a document here, as an operator meets it.
    cause: str


RULES: dict[Category, Rule] = {
    Category.NETWORK_TIMEOUT: Rule(
        Layer.NETWORK,
        True,
        Disposition.RETRY,
        "retried twice in the run (1 s, 2 s, capped at 5 s; same task id), then retryable by a "
        "backfill",
        cause="timeout, connection reset, 5xx",
    ),
    Category.RATE_LIMIT_EXCEEDED: Rule(
        Layer.PROTOCOL,
        True,
        Disposition.RETRY,
        "waits Retry-After once per task per minute, then retryable by a backfill",
        cause="429",
    ),
    Category.AUTH_FAILED: Rule(
        Layer.PROTOCOL,
        False,
        Disposition.FAILED,
        "credentials re-read once and the task resubmitted; then the run stops calling (circuit "
        "open): only the documents whose request was refused fail, those not sent wait as "
        "CONFIGURATION, and run/submit --wait/backfill --wait exit 2 naming the key's source",
        cause="401/403",
    ),
    Category.CONFIGURATION: Rule(
        Layer.SETTINGS,
        False,
        Disposition.STOPPED,
        "fix the setting; the documents stay as they were: the run stops sending at the first "
        "such reply, nothing goes to review, no attempt is counted, and run/submit --wait/"
        "backfill --wait exit 2 with the one message that says what to change",
        cause="404 (no such model or path), a 400 naming a request setting (temperature, "
        "max_tokens, response_format, model, …), nothing listening at OPENAI_BASE_URL; a key "
        "refused after its refresh, for the documents not yet sent",
    ),
    Category.INPUT_QUALITY_ISSUE: Rule(
        Layer.PROTOCOL,
        False,
        Disposition.REVIEW,
        "no retry; review queue, with an input snapshot",
        cause="400/422 about the document, an unreadable file; a document too long for the "
        "model's context (400 context_length_exceeded) when its analysis has no sections (with "
        "sections it is cut in halves and analysed from them)",
    ),
    Category.SCHEMA_VIOLATION: Rule(
        Layer.MODEL,
        False,
        Disposition.REVIEW,
        "no retry; review queue (a prompt fix, or a larger max_output_tokens)",
        cause="not the JSON asked for; a reply cut off at the token limit (or empty after "
        "reasoning) again when asked once more with twice the limit (within the budget), its "
        "reason starting 'truncated:'. A JSON object in a code fence or after a short preface is "
        "taken from its outermost braces, not a violation (the schema check and the llm_analysis "
        "metadata reply_unwrapped say so)",
    ),
    Category.LOW_CONFIDENCE: Rule(
        Layer.MODEL,
        False,
        Disposition.REVIEW,
        "no retry; review queue (a prompt fix)",
        cause="confidence below the threshold, or outside the range its output model allows",
    ),
    Category.MODEL_REFUSAL: Rule(
        Layer.MODEL,
        False,
        Disposition.REVIEW,
        "no retry; review queue (a prompt fix)",
        cause='"I don\'t know", "我无法回答", … (42 phrasings)',
    ),
    Category.MODEL_HALLUCINATION: Rule(
        Layer.MODEL,
        False,
        Disposition.QUARANTINED,
        "output quarantined, never stored; review queue (audit)",
        cause="an entity not in the document",
    ),
    Category.DUPLICATE_EXECUTION: Rule(
        Layer.BUSINESS,
        False,
        Disposition.DONE,
        "the downstream already has it: treated as done",
        cause="the webhook answers 409 for our key",
    ),
    Category.BUSINESS_REJECTED: Rule(
        Layer.BUSINESS,
        False,
        Disposition.REVIEW,
        "no retry; review queue",
        cause="the webhook answers another 4xx",
    ),
    Category.RUN_INTERRUPTED: Rule(
        Layer.RUNTIME,
        True,
        Disposition.RETRY,
        "the run ended before the document did: the next launch or a backfill reruns it",
        cause="the run holding the document ended first (worker killed, run terminated)",
    ),
    Category.DATABASE_UNAVAILABLE: Rule(
        Layer.RUNTIME,
        True,
        Disposition.RETRY,
        "rerun it (the next launch or a backfill)",
        cause="the results database stayed unreachable past the retries",
    ),
    Category.BUDGET_REACHED: Rule(
        Layer.RUNTIME,
        True,
        Disposition.RETRY,
        "the call was not sent and is not counted as an attempt; a later launch with budget "
        "continues it",
        cause="the next call would exceed a budget",
    ),
    Category.INTERNAL_ERROR: Rule(
        Layer.INTERNAL,
        False,
        Disposition.FAILED,
        "an unexpected error; see the run log",
        cause="a bug",
    ),
}


class ClassifiedError(Exception):
    """A failure with its category; the message is safe to show (no secrets)."""

    def __init__(self, category: Category, message: str):
        super().__init__(f"{category.value}: {message}")
        self.category = category
        self.message = message


def category_for_status(status: int, *, downstream: bool = False) -> Category:
    """The category of an HTTP error status (400-599), from the LLM endpoint or a downstream."""
    if not 400 <= status <= 599:
        raise ValueError(f"{status} is not an HTTP error status")
    if status >= 500 or status == 408:
        return Category.NETWORK_TIMEOUT
    if status == 429:
        return Category.RATE_LIMIT_EXCEEDED
    if status == 409:
        return Category.DUPLICATE_EXECUTION if downstream else Category.NETWORK_TIMEOUT
    if status in (401, 403) and not downstream:
        return Category.AUTH_FAILED
    if status == 404 and not downstream:
        return Category.CONFIGURATION
    return Category.BUSINESS_REJECTED if downstream else Category.INPUT_QUALITY_ISSUE


# Request fields that are settings of the run (the model, its parameters, the reply's format), not
# the document's content: an endpoint that refuses one refuses it for every document.
SETTING_PARAMETERS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "reasoning_effort",
        "response_format",
        "seed",
        "n",
        "stop",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "service_tier",
        "verbosity",
    }
)


def category_for_reply(
    status: int, *, code: str | None = None, param: str | None = None
) -> Category:
    """The category of an LLM endpoint's error reply: its status, made precise by the ``code``
    and ``param`` of OpenAI's error object (a setting the endpoint refuses is CONFIGURATION)."""
    # A nested field names its setting first: ``response_format.json_schema.name``.
    setting = re.split(r"[.\[]", param, maxsplit=1)[0] if param else None
    if code == "model_not_found" or (status == 400 and setting in SETTING_PARAMETERS):
        return Category.CONFIGURATION
    return category_for_status(status)
