"""What each model accepts in a chat completion request, written down once.

Models differ in what they refuse with HTTP 400: OpenAI's reasoning models (the o-series, the
gpt-5 family except ``gpt-5-chat``) accept no ``temperature`` but the default and no
``max_tokens`` (``max_completion_tokens`` instead, which counts their reasoning too); older servers
know only ``max_tokens``. A request is built from this table by the model's name, never from what
our own simulator tolerates; an analysis overrides it for an endpoint the table does not know.

=======================  ===========  =======================  ================  =============
model names              temperature  output limit parameter   reasoning_effort  default limit
=======================  ===========  =======================  ================  =============
``gpt-5-chat*``          sent         max_completion_tokens    not sent          4,096
``o1* o3* o4* gpt-5*``   not sent     max_completion_tokens    sent when set     16,384
``gpt-4* gpt-3.5*``      sent         max_completion_tokens    not sent          4,096
anything else            sent         max_tokens               sent when set     4,096
=======================  ===========  =======================  ================  =============

Every request carries an output limit, so a model that loops stops at a bounded cost.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Literal

LimitParameter = Literal["max_tokens", "max_completion_tokens"]


@dataclass(frozen=True)
class Family:
    """What the models whose names match ``patterns`` accept."""

    name: str
    patterns: tuple[str, ...]
    temperature: bool
    limit_parameter: LimitParameter
    reasoning: bool
    default_limit: int

    def matches(self, model: str) -> bool:
        base = model.rsplit("/", 1)[-1].lower()  # "openai/gpt-5-mini" as served by a router
        return any(fnmatch.fnmatchcase(base, p) for p in self.patterns)


FAMILIES = (
    Family("openai-chat-5", ("gpt-5-chat*",), True, "max_completion_tokens", False, 4096),
    Family(
        "openai-reasoning",
        ("o1*", "o3*", "o4*", "gpt-5*"),
        False,
        "max_completion_tokens",
        True,
        16384,
    ),
    Family("openai-chat", ("gpt-4*", "gpt-3.5*"), True, "max_completion_tokens", False, 4096),
)
OTHER = Family("other", ("*",), True, "max_tokens", True, 4096)


def family_of(model: str) -> Family:
    """The family of a model name (``OTHER`` for a name the table does not know)."""
    return next((f for f in FAMILIES if f.matches(model)), OTHER)


def request_parameters(
    model: str,
    *,
    temperature: float | None,
    max_output_tokens: int | None,
    reasoning_effort: str | None = None,
    limit_parameter: LimitParameter | None = None,
    send_temperature: bool | None = None,
) -> dict[str, Any]:
    """The parameters of a request beside its messages and format: the temperature when the
    model takes one, the output limit under the name it knows, the reasoning effort when it
    reasons. The keyword overrides win over the table."""
    family = family_of(model)
    parameters: dict[str, Any] = {}
    takes_temperature = family.temperature if send_temperature is None else send_temperature
    if temperature is not None and takes_temperature:
        parameters["temperature"] = temperature
    limit = max_output_tokens if max_output_tokens is not None else family.default_limit
    parameters[limit_parameter or family.limit_parameter] = limit
    if reasoning_effort is not None and family.reasoning:
        parameters["reasoning_effort"] = reasoning_effort
    return parameters
