"""The JSON schema of an output model, in the subset that strict Structured Outputs accept.

OpenAI's strict mode (and llama.cpp's and vLLM's grammars built from the same schema) wants every
object closed (``additionalProperties: false``) and every property listed in ``required``; a
field with a default is then still sent for, and ``null`` is allowed only where the model says so.
Defaults and titles say nothing to the model and are left out, so the schema (and the fingerprint
of a declaration built from it) changes only when the shape of the output does.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

_DROPPED = ("default", "title")


@functools.cache
def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with every object closed and every property required. Made once
    per model (pydantic takes milliseconds to generate it) and shared: never change it."""
    schema = copy.deepcopy(model.model_json_schema())
    _close(schema)
    return schema


def _close(node: Any) -> None:
    if isinstance(node, dict):
        for key in _DROPPED:
            node.pop(key, None)
        if node.get("type") == "object" or "properties" in node:
            node["required"] = list(node.get("properties", {}))
            node["additionalProperties"] = False
        for key, value in node.items():
            if key in ("properties", "$defs") and isinstance(value, dict):
                # Maps of names: a property called "title" is a property, not a title.
                for child in value.values():
                    _close(child)
            elif key not in ("enum", "const", "required"):
                _close(value)
    elif isinstance(node, list):
        for item in node:
            _close(item)
