"""What a failed request of the openai SDK means: its category, a description without headers or
keys, and what it means to the one retry policy (``ai_pipeline.retry``).

Every exception the SDK can raise has a category here (``classify``); a reply's status, ``code``
and ``param`` are read by the failure taxonomy's table (``ai_pipeline.failures``). Making the
requests, and what to do about a failure beyond retrying it, is the client's (``ai_pipeline.llm``).
"""

from __future__ import annotations

from ai_pipeline.failures import Category, ClassifiedError, category_for_reply
from ai_pipeline.redaction import redact
from ai_pipeline.retry import AttemptFailure, parse_retry_after


def classify(error: BaseException) -> Category:
    """The category of an exception raised by the openai SDK."""
    import openai  # the SDK is imported where it is used: most processes never call the LLM

    if isinstance(error, ClassifiedError):
        return error.category
    if isinstance(error, openai.APIStatusError):
        status = getattr(error, "status_code", None)
        if isinstance(status, int) and 400 <= status <= 599:
            return category_for_reply(
                status, code=_text(error, "code"), param=_text(error, "param")
            )
        return Category.INTERNAL_ERROR
    # APITimeoutError is a subclass of APIConnectionError: both are the network layer.
    if isinstance(error, (openai.APIConnectionError, TimeoutError, ConnectionError)):
        return Category.NETWORK_TIMEOUT
    if isinstance(
        error,
        (
            openai.LengthFinishReasonError,
            openai.ContentFilterFinishReasonError,
            openai.APIResponseValidationError,
        ),
    ):
        return Category.SCHEMA_VIOLATION
    return Category.INTERNAL_ERROR


def _text(error: BaseException, name: str) -> str | None:
    """A field of the error object the endpoint sent (``code``, ``param``), when it is text."""
    value = getattr(error, name, None)
    return value if isinstance(value, str) else None


def describe(error: BaseException) -> str:
    """A one-line description of an SDK error, without request headers or keys."""
    import openai

    if isinstance(error, ClassifiedError):
        return redact(error.message)[:500]
    if isinstance(error, openai.APIStatusError):
        message = error.message if isinstance(error.message, str) else str(error.message)
        text = f"HTTP {error.status_code}: {message}"
    elif isinstance(error, openai.APITimeoutError):
        text = "APITimeoutError: the request timed out"
    else:
        text = f"{type(error).__name__}: {error}"
    return redact(text)[:500]


def attempt_failure(error: BaseException) -> AttemptFailure:
    """What one failed request of the SDK means to the retry policy: category, message, wait."""
    response = getattr(error, "response", None)
    return AttemptFailure(
        classify(error),
        describe(error),
        retry_after=parse_retry_after(getattr(response, "headers", None)),
        cause=error,
    )
