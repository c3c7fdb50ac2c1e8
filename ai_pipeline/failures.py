"""The failure taxonomy: every failure of a document's work lands in exactly one category.

A category fixes what happens next; nothing else in the code decides that. The table
(seed 002 §4, DESIGN.md):

=====================  ========  =========  ==========================================  ===========
category               layer     retryable  action                                      disposition
=====================  ========  =========  ==========================================  ===========
NETWORK_TIMEOUT        network   yes        retry ≤ 2 (1 s, 2 s; cap 5 s), same task id  retry
RATE_LIMIT_EXCEEDED    protocol  yes        wait Retry-After, at most once a minute     retry
AUTH_FAILED            protocol  no         refresh credentials once, resubmit          failed
CONFIGURATION          settings  no         fix the setting; the documents stay as      stopped
                                            they were (the run stops sending)
INPUT_QUALITY_ISSUE    protocol  no         snapshot the input, human review queue      review
SCHEMA_VIOLATION       model     no         human review, prompt fix                    review
LOW_CONFIDENCE         model     no         human review, prompt fix                    review
MODEL_REFUSAL          model     no         human review, prompt fix                    review
MODEL_HALLUCINATION    model     no         quarantine the output, audit                quarantined
DUPLICATE_EXECUTION    business  no         the downstream already has it: done         done
BUSINESS_REJECTED      business  no         human review queue                          review
RUN_INTERRUPTED        runtime   yes        its run ended first: rerun the document     retry
DATABASE_UNAVAILABLE   runtime   yes        the results database stayed unreachable     retry
BUDGET_REACHED         runtime   yes        not sent: over budget; a launch with budget  retry
                                            continues it (not counted as an attempt)
INTERNAL_ERROR         internal  no         a bug or an unexpected error: look at it    failed
=====================  ========  =========  ==========================================  ===========

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


@dataclass(frozen=True)
class Rule:
    layer: Layer
    retryable: bool
    disposition: Disposition
    action: str


RULES: dict[Category, Rule] = {
    Category.NETWORK_TIMEOUT: Rule(
        Layer.NETWORK, True, Disposition.RETRY, "retry at most twice (1 s, 2 s), same task id"
    ),
    Category.RATE_LIMIT_EXCEEDED: Rule(
        Layer.PROTOCOL, True, Disposition.RETRY, "wait Retry-After once per minute, then later"
    ),
    Category.AUTH_FAILED: Rule(
        Layer.PROTOCOL, False, Disposition.FAILED, "refresh credentials once; then stop the run"
    ),
    Category.CONFIGURATION: Rule(
        Layer.SETTINGS,
        False,
        Disposition.STOPPED,
        "fix the setting; the documents stay as they were",
    ),
    Category.INPUT_QUALITY_ISSUE: Rule(
        Layer.PROTOCOL, False, Disposition.REVIEW, "no retry; input snapshot to the review queue"
    ),
    Category.SCHEMA_VIOLATION: Rule(
        Layer.MODEL, False, Disposition.REVIEW, "no retry; review and fix the prompt"
    ),
    Category.LOW_CONFIDENCE: Rule(
        Layer.MODEL, False, Disposition.REVIEW, "no retry; review and fix the prompt"
    ),
    Category.MODEL_REFUSAL: Rule(
        Layer.MODEL, False, Disposition.REVIEW, "no retry; review and fix the prompt"
    ),
    Category.MODEL_HALLUCINATION: Rule(
        Layer.MODEL, False, Disposition.QUARANTINED, "quarantine the output; audit"
    ),
    Category.DUPLICATE_EXECUTION: Rule(
        Layer.BUSINESS, False, Disposition.DONE, "the downstream already has it; treat as done"
    ),
    Category.BUSINESS_REJECTED: Rule(
        Layer.BUSINESS, False, Disposition.REVIEW, "no retry; human review queue"
    ),
    Category.RUN_INTERRUPTED: Rule(
        Layer.RUNTIME, True, Disposition.RETRY, "the run ended before the document did; rerun it"
    ),
    Category.DATABASE_UNAVAILABLE: Rule(
        Layer.RUNTIME, True, Disposition.RETRY, "the results database was unreachable; rerun it"
    ),
    Category.BUDGET_REACHED: Rule(
        Layer.RUNTIME,
        True,
        Disposition.RETRY,
        "the call was not sent (over budget); a later launch with budget continues it",
    ),
    Category.INTERNAL_ERROR: Rule(
        Layer.INTERNAL, False, Disposition.FAILED, "an unexpected error; see the run log"
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
