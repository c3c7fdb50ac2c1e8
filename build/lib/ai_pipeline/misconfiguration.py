"""What a configuration fault says: which setting the endpoint refused, and what to change.

A CONFIGURATION failure (``ai_pipeline.failures``) stops the run, so its message is the one line a
person reads at the end of it; it names the setting, the value sent, what the endpoint answered,
and where the setting comes from. The LLM client (``ai_pipeline.llm``) builds it from the SDK's
error; nothing here sends a request.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from typing import Any

from ai_pipeline.redaction import redact

# Where each setting a request carries is set, for the message that asks to change it.
_WHERE = {
    "model": "AI_PIPELINE_MODEL",
    "response_format": "the analysis's output schema (its declaration)",
}
_DEFAULT_WHERE = "the analysis's model settings, or the model family in ai_pipeline/endpoints.py"


def refused_message(error: BaseException, status: int, sent: Mapping[str, Any]) -> str:
    """The message of an error reply that refuses a setting: ``sent`` are the request's
    parameters as they went out (``model`` among them)."""
    model = sent.get("model")
    code = getattr(error, "code", None)
    param = getattr(error, "param", None)
    # The SDK's message repeats the status ("Error code: 404 - ..."): the endpoint's words only.
    said = re.sub(r"^Error code: \d+ - ", "", str(getattr(error, "message", None) or error))
    if code == "model_not_found" or (status == 404 and param in (None, "model")):
        if code == "model_not_found" or "model" in str(said).lower():
            return redact(
                f"the endpoint has no model {model!r} ({status} {code or 'not found'}): "
                f"check AI_PIPELINE_MODEL ({said})"
            )[:500]
        return redact(
            f"the endpoint answers {status} (no such path: {said}): check OPENAI_BASE_URL"
        )[:500]
    value = sent.get(param) if isinstance(param, str) else None
    setting = f"{param}={value}" if value is not None else str(param)
    where = _WHERE.get(str(param), _DEFAULT_WHERE)
    return redact(
        f"the model {model} does not accept {setting} ({status} {code or 'invalid_request_error'}"
        f": {said}): change {where}"
    )[:500]


def unreachable_message(base_url: str) -> str:
    return (
        f"nothing answers at {base_url} (connection refused on every attempt, and no call of "
        "this run ever got an answer): check OPENAI_BASE_URL"
    )


def connection_refused(error: BaseException | None) -> bool:
    """Whether the connection was refused (nothing listens there), as opposed to timed out or
    reset: the chain of causes the SDK and httpx raise ends in ECONNREFUSED."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionRefusedError) or (
            isinstance(error, OSError) and error.errno == errno.ECONNREFUSED
        ):
            return True
        if "connection refused" in str(error).lower():
            return True
        error = error.__cause__ or error.__context__
    return False
