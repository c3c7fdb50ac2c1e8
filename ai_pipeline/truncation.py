"""A reply cut off at its token limit (``finish_reason: "length"``) is asked for once more, with
twice the limit: a model that needed a little more room answers then, and the document does not
go to a person for it. What bounds the second call:

- the run's budget: under a budget a call may produce no more than the completion tokens it
  reserved (``ai_pipeline.spend``), so the doubled limit is cut to that, and when it cannot grow
  there is no second call;
- once: a reply cut off again fails SCHEMA_VIOLATION, truncated, and is reviewed with that reason
  (raise the analysis's ``max_output_tokens``).

A reasoning model may spend its whole limit thinking and answer nothing (content ``""``): that is a
truncation too. Nothing here sends a request.
"""

from __future__ import annotations

from ai_pipeline.declaration import ModelSettings
from ai_pipeline.endpoints import family_of


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
