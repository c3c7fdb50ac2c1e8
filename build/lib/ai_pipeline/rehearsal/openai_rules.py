"""OpenAI's request rules, for the simulator's OpenAI rules mode: what OpenAI refuses, and how.

With ``SimulatorConfig(openai_rules=True)`` (``simulate-llm --openai-rules``) a request OpenAI
would refuse gets OpenAI's status and error body, checked in this order:

====================================================  ======  ==================================
request                                               status  ``error.code`` (``param``)
====================================================  ======  ==================================
no ``model``                                           400    ``None``
a model not served (:func:`model_error`)               404    ``model_not_found``
``n`` > 1 (one choice per reply, as llama.cpp)         400    ``unsupported_value`` (``n``)
reasoning model: ``temperature`` ≠ 1                   400    ``unsupported_value``
reasoning model: ``max_tokens``                        400    ``unsupported_parameter``
reasoning model: ``top_p`` ≠ 1                         400    ``unsupported_value``
reasoning model: ``logprobs`` (not false)              400    ``unsupported_parameter``
``json_object`` without "json" in any message          400    ``None`` (``messages``)
``json_schema`` without a name                         400    ``missing_required_parameter``
``json_schema``, ``strict``, outside the strict subset 400    ``None`` (``response_format``)
====================================================  ======  ==================================

Reasoning models are ``o1*``, ``o3*``, ``o4*`` and ``gpt-5*`` but ``gpt-5-chat*``. Their replies
think first: :func:`reasoning_tokens` are counted in ``completion_tokens`` and within
``max_completion_tokens``. The strict subset is checked as far as OpenAI's most common refusals
go: the root is an object, and every object lists all its properties in ``required`` and has
``additionalProperties: false``.

:class:`PromptCache` models OpenAI's prompt caching for ``usage.prompt_tokens_details``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ai_pipeline.rehearsal.analysis import estimate_tokens
from ai_pipeline.rehearsal.replies import message_text

# What OpenAI rules mode serves when no list of models is given (with the simulator's own model).
OPENAI_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-5-mini", "o4-mini")

CACHE_MIN_TOKENS = 1024  # OpenAI caches prompts from this length on ...
CACHE_STEP = 128  # ... in increments of this many tokens
MAX_CACHED_PREFIXES = 100_000

_REASONING = re.compile(r"^(?:o1|o3|o4|gpt-5)(?!-chat)")


@dataclass(frozen=True)
class RequestError:
    """A refused request: the HTTP status and OpenAI's error object."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}


def is_reasoning_model(model: str) -> bool:
    """True for OpenAI's reasoning models: o1, o3, o4 and gpt-5, but gpt-5-chat."""
    return _REASONING.match(model) is not None


def serves(model: str, served: tuple[str, ...], suffix: str = "") -> bool:
    """Whether ``model`` is served: one of the names, or one with the dated suffix appended."""
    return model in served or bool(suffix) and model.removesuffix(suffix) in served


def model_error(model: str) -> RequestError:
    return RequestError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
    )


def check_request(body: dict[str, Any], messages: list[dict[str, Any]]) -> RequestError | None:
    """The error OpenAI answers this request with, or None when it accepts it."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return RequestError(400, "you must provide a model parameter")
    n = body.get("n")
    if n is not None and n != 1:
        message = "Only one completion choice is allowed: 'n' must be 1."
        return RequestError(400, message, "n", "unsupported_value")
    if is_reasoning_model(model):
        error = _reasoning_error(body)
        if error is not None:
            return error
    return _response_format_error(body.get("response_format"), messages)


def _reasoning_error(body: dict[str, Any]) -> RequestError | None:
    for name, rule in (
        ("temperature", "value"),
        ("max_tokens", "parameter"),
        ("top_p", "value"),
        ("logprobs", "parameter"),
    ):
        value = body.get(name)
        if rule == "value" and value is not None and value != 1:
            message = (
                f"Unsupported value: '{name}' does not support {json.dumps(value)} with this "
                "model. Only the default (1) value is supported."
            )
            return RequestError(400, message, name, "unsupported_value")
        if rule == "parameter" and value is not None and value is not False:
            message = f"Unsupported parameter: '{name}' is not supported with this model."
            if name == "max_tokens":
                message += " Use 'max_completion_tokens' instead."
            return RequestError(400, message, name, "unsupported_parameter")
    return None


def _response_format_error(
    response_format: Any, messages: list[dict[str, Any]]
) -> RequestError | None:
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        said = " ".join(message_text(m.get("content")) for m in messages)
        if "json" not in said.lower():
            message = (
                "'messages' must contain the word 'json' in some form, to use 'response_format' "
                "of type 'json_object'."
            )
            return RequestError(400, message, "messages")
        return None
    if kind != "json_schema":
        return None
    spec = response_format.get("json_schema")
    spec = spec if isinstance(spec, dict) else {}
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        param = "response_format.json_schema.name"
        message = f"Missing required parameter: '{param}'."
        return RequestError(400, message, param, "missing_required_parameter")
    schema = spec.get("schema")
    if spec.get("strict") is True and isinstance(schema, dict):
        problem = strict_schema_problem(schema)
        if problem is not None:
            message = f"Invalid schema for response_format '{name}': {problem}"
            return RequestError(400, message, "response_format")
    return None


def strict_schema_problem(schema: dict[str, Any]) -> str | None:
    """What makes ``schema`` fall outside OpenAI's strict subset, in OpenAI's words (or None)."""
    kind = schema.get("type")
    if kind != "object" and "$ref" not in schema and "anyOf" not in schema:
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{kind}\"'."
    return _object_problem(schema, ())


def _object_problem(node: Any, context: tuple[str, ...]) -> str | None:
    if not isinstance(node, dict):
        return None
    properties = node.get("properties")
    if node.get("type") == "object" or isinstance(properties, dict):
        keys = list(properties) if isinstance(properties, dict) else []
        required = node.get("required")
        listed = required if isinstance(required, list) else []
        missing = [key for key in keys if key not in listed]
        if missing or not isinstance(required, list):
            return (
                f"In context={context!r}, 'required' is required to be supplied and to be an "
                "array including every key in properties."
                + (f" Missing '{missing[0]}'." if missing else "")
            )
        if node.get("additionalProperties") is not False:
            return (
                f"In context={context!r}, 'additionalProperties' is required to be supplied and "
                "to be false."
            )
    children: list[tuple[tuple[str, ...], Any]] = []
    for group in ("$defs", "definitions", "properties"):
        if isinstance(node.get(group), dict):
            children += [((*context, group, k), v) for k, v in node[group].items()]
    if isinstance(node.get("items"), dict):
        children.append(((*context, "items"), node["items"]))
    for group in ("anyOf", "allOf"):
        if isinstance(node.get(group), list):
            children += [((*context, group, str(i)), v) for i, v in enumerate(node[group])]
    for where, child in children:
        problem = _object_problem(child, where)
        if problem is not None:
            return problem
    return None


def reasoning_tokens(text: str) -> int:
    """The tokens a reasoning model thinks before it answers about ``text``: 64 to 256 by the
    text's hash, plus a tenth of its length (a longer document takes longer thought)."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)
    return 64 * (1 + digest % 4) + estimate_tokens(text) // 10


def _is_cjk(ch: str) -> bool:
    return "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff"


class PromptCache:
    """OpenAI's prompt caching, modelled: which prompt prefixes this simulator has seen.

    A prompt of at least 1,024 tokens (as the simulator counts them) whose first 1,024 + k·128
    tokens, with the same model, began a prompt answered before has that many tokens cached: the
    longest such prefix. Every answered prompt's prefixes are remembered (the newest 100,000) until
    the simulator is reset; OpenAI's expiry after minutes of disuse is not modelled.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def cached_tokens(self, model: str, messages: list[tuple[str, str]]) -> int:
        """The cached tokens of this prompt (role, text per message); then remembers it."""
        prefixes = _prefixes(model, messages)
        with self._lock:
            hit = max((tokens for tokens, digest in prefixes if digest in self._seen), default=0)
            for _, digest in prefixes:
                self._seen[digest] = None
                self._seen.move_to_end(digest)
            while len(self._seen) > MAX_CACHED_PREFIXES:
                self._seen.popitem(last=False)
        return hit


def _prefixes(model: str, messages: list[tuple[str, str]]) -> list[tuple[int, str]]:
    """(tokens, digest) of the prompt's prefixes at 1,024 tokens and every 128 after."""
    if sum(estimate_tokens(text) for _, text in messages) < CACHE_MIN_TOKENS:
        return []
    hasher = hashlib.sha256(model.encode("utf-8"))
    found: list[tuple[int, str]] = []
    before, boundary = 0, CACHE_MIN_TOKENS
    for role, text in messages:
        hasher.update(f"\x1e{role}\x1f".encode())
        cjk = other = hashed = 0
        for i, ch in enumerate(text):
            if _is_cjk(ch):
                cjk += 1
            else:
                other += 1
            if before + cjk + math.ceil(other / 4) >= boundary:
                hasher.update(text[hashed : i + 1].encode("utf-8"))
                hashed = i + 1
                found.append((boundary, hasher.copy().hexdigest()))
                boundary += CACHE_STEP
        hasher.update(text[hashed:].encode("utf-8"))
        before += estimate_tokens(text)
    return found
