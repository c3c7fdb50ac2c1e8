"""A reply cut off at its token limit (``finish_reason: "length"``) is asked for once more, with
twice the limit: a model that needed a little more room answers then, and the document does not
go to a person for it. What bounds the second call:

- the run's budget: under a budget a call may produce no more than the completion tokens it
  reserved (``ai_pipeline.spend``), so the doubled limit is cut to that, and when it cannot grow
  there is no second call;
- once: a reply cut off again fails SCHEMA_VIOLATION, truncated, and is reviewed with that reason
  (raise the analysis's ``max_output_tokens``).

A reasoning model may spend its whole limit thinking and answer nothing (content ``""``): that is a
truncation too.

The other way round, a document too long for the model's context (400
``context_length_exceeded``) is cut into sections when its analysis has them (``recut``), each
half the document's length at most; without sections it stays INPUT_QUALITY_ISSUE. Nothing here
sends a request.
"""

from __future__ import annotations

from ai_pipeline.declaration import Declaration, ModelSettings, Section, split_sections
from ai_pipeline.endpoints import family_of


def too_long(error: BaseException | None) -> bool:
    """Whether the endpoint refused a request as longer than the model's context: somewhere in
    the chain of causes is the SDK's error with code ``context_length_exceeded``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "code", None) == "context_length_exceeded":
            return True
        error = error.__cause__
    return False


def recut(analysis: Declaration, text: str, error: BaseException) -> list[Section] | None:
    """The sections of a document that ``error`` says is too long for the model, when its
    analysis is cut into sections and reduced; None when it is not (or the error is another)."""
    if analysis.sections is None or analysis.reduce is None or not too_long(error):
        return None
    sections = split_sections(text, max(len(text.strip()) // 2, 1), analysis.sections.cut)
    return sections if len(sections) > 1 else None


def output_limit(model: str, settings: ModelSettings, reserved: int | None) -> int:
    """The completion limit a call of ``model`` under ``settings`` carries (as the client sets it:
    the settings' limit or the family's default, within what the budget reserved)."""
    limit = settings.max_output_tokens
    if limit is None:
        limit = family_of(model).default_limit
    return limit if reserved is None else min(limit, reserved)


def larger_limit(model: str, settings: ModelSettings, reserved: int | None) -> ModelSettings | None:
    """The settings of the second call after a truncated reply: twice the limit, within the budget's
    reservation; None when the limit cannot grow."""
    before = output_limit(model, settings, reserved)
    after = 2 * before if reserved is None else min(2 * before, reserved)
    if after <= before:
        return None
    return settings.model_copy(update={"max_output_tokens": after})
