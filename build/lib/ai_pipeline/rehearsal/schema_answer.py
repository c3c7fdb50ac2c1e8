"""Answers to any JSON schema: what a model with OpenAI Structured Outputs says about a document.

:func:`answer_for_schema` walks the schema a request sends as ``response_format: {"type":
"json_schema", ...}`` and builds a conforming value from the document's text alone, the same for
the same text every time:

* a property named like one of the built-in analysis fields (``keywords``, ``summary``,
  ``sentiment``, ``entities``, ``confidence``) gets the value :func:`.analysis.analyse` gives it
  when the type fits, so the built-in analysis declared as a schema is answered byte for byte as
  in JSON mode (but for the one-clause documents below);
* otherwise a value by type, guided by the property's name: strings are taken from the text
  (sentences, names, the first line; cut within ``maxLength``, extended with more of the text to
  ``minLength``), enum values are the one the name's value matches (a sentiment-like enum gets
  the lexicon sentiment) or one picked by a hash of the text, numbers and integers lie within
  their bounds (a confidence-like number gets :func:`.analysis.confidence_for`, ``notice_days``
  the number before "days" in the text, ``word_count`` the words), a boolean named
  ``has_termination_clause`` is whether "termination" occurs in the text, arrays of
  strings are the text's names and keywords, arrays keep to ``minItems``/``maxItems``, objects,
  ``$ref``/``$defs`` and nullable ``anyOf`` are followed recursively.

Two kinds of documents get answers shaped for them:

* one numbered clause ("7. Termination. Either party may …", "Section 4: …", "第六条 …"): a
  property named like a title gets the clause's title ("Termination"), one named like a number
  its number, and strings and the ``summary`` come from the clause's body (the built-in summary
  of such a text would be the bare "7.");
* a JSON list of objects, or an object holding one (the earlier outputs of a map step, sent to
  a reduce step): a property they share is merged from them (lists joined without duplicates, a
  confidence-like number the lowest, counts summed, other values the most frequent), and
  everything else comes from the text of their string values.

What it does not do: ``pattern`` is not honoured, ``multipleOf`` only for integers, and ``allOf``
is merged shallowly. Nothing here speaks HTTP; the fault helpers at the end say where a spoilt
answer puts its defect.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

from ai_pipeline.rehearsal.analysis import MAX_SUMMARY_CHARS
from ai_pipeline.rehearsal.schema_source import (
    CONFIDENCE_WORDS,
    COUNT_WORDS,
    KEYWORD_WORDS,
    LANGUAGE_WORDS,
    MISSING,
    NAME_WORDS,
    NUMBER_WORDS,
    SENTIMENT_WORDS,
    SUMMARY_WORDS,
    TITLE_WORDS,
    Source,
    cut,
    name_words,
    number_value,
    stable_number,
)

MAX_DEPTH = 6  # recursive schemas: deeper than this, arrays keep to minItems and nullables are null
DEFAULT_ITEMS = 3  # items of an array of objects when the text offers no better count

_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_YEAR = re.compile(r"\b(1[89]\d\d|2\d\d\d)\b")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"https?://[^\s\"'<>)]+")
_UNIT_WORDS = {"days", "weeks", "months", "years", "hours", "minutes", "percent", "day", "month"}
_BOOLEAN_FILLERS = {
    *("is", "has", "have", "contains", "includes", "mentions", "was", "are", "any", "can"),
    *("does", "do", "should", "must", "a", "an", "the", "of", "with", "flag", "present"),
    *("clause", "section", "document", "text", "contract", "agreement", "term", "terms"),
}


def answer_for_schema(schema: dict[str, Any], text: str) -> Any:
    """A value conforming to ``schema`` (OpenAI's strict subset), derived from ``text``."""
    return _Builder(schema, Source(text)).value(schema, "", (), None, 0)


class _Builder:
    """Walks one schema for one source; ``path`` names where a value is, ``index`` which item."""

    def __init__(self, root: dict[str, Any], source: Source) -> None:
        self.root = root
        self.source = source

    def resolve(self, node: Any) -> dict[str, Any]:
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and seen < 32:
            target: Any = self.root
            for part in node["$ref"].removeprefix("#").strip("/").split("/"):
                if part:
                    target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            seen += 1
        if isinstance(node, dict) and isinstance(node.get("allOf"), list):
            merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
            for part in node["allOf"]:
                merged = {**self.resolve(part), **merged}
            node = merged
        return node if isinstance(node, dict) else {}

    def hash(self, path: tuple[str, ...], index: int | None) -> int:
        return stable_number(self.source.text, *path, str(index))

    def value(
        self, node: Any, name: str, path: tuple[str, ...], index: int | None, depth: int
    ) -> Any:
        node = self.resolve(node)
        if "const" in node:
            return node["const"]
        variants = node.get("anyOf") or node.get("oneOf")
        if isinstance(variants, list) and variants:
            options = [self.resolve(v) for v in variants]
            non_null = [o for o in options if o.get("type") != "null"]
            if not non_null or (depth >= MAX_DEPTH and len(non_null) < len(options)):
                return None
            return self.value(non_null[0], name, path, index, depth)
        reduce_field = self.source.outputs is not None and len(path) == 1
        candidate = self.source.merged(name) if reduce_field else MISSING
        if candidate is MISSING:
            candidate = self.named(node, name)
        if isinstance(node.get("enum"), list) and node["enum"]:
            return self.choose(node["enum"], candidate, path, index)
        kind = node.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            kind = kinds[0] if kinds else "null"
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else "string"
        if kind == "object":
            properties = node.get("properties") or {}
            # An object inside an array passes its item's index on: item i's "name" is name i.
            return {
                key: self.value(sub, key, (*path, key), index, depth + 1)
                for key, sub in properties.items()
            }
        if kind == "array":
            return self.array(node, name, path, candidate, depth)
        if kind == "string":
            return self.string(node, name, path, index, candidate)
        if kind in ("number", "integer"):
            return self.number(node, kind == "integer", path, index, candidate)
        if kind == "boolean":
            return candidate if isinstance(candidate, bool) else self.boolean(name, path, index)
        return None

    def named(self, node: dict[str, Any], name: str) -> Any:
        """What the property's name alone suggests (``MISSING`` when it suggests nothing)."""
        source, lowered, words = self.source, name.lower(), name_words(name)
        if lowered == "keywords" or (words & KEYWORD_WORDS and node.get("type") == "array"):
            return source.keywords
        if lowered in ("entities", "names") or (words & NAME_WORDS and node.get("type") == "array"):
            return source.entities
        if words & SUMMARY_WORDS:
            return source.summary(int(node.get("maxLength", MAX_SUMMARY_CHARS)))
        if words & SENTIMENT_WORDS:
            return source.sentiment
        if words & CONFIDENCE_WORDS:
            return source.confidence
        if words & LANGUAGE_WORDS:
            return "zh" if source.chinese else "en"
        if source.clause is not None and words & NUMBER_WORDS and not words & TITLE_WORDS:
            number = source.clause.number
            return number_value(number) if node.get("type") == "integer" else number
        if words & TITLE_WORDS:
            return source.title
        return MISSING

    def choose(self, options: list[Any], candidate: Any, path: tuple[str, ...], index: Any) -> Any:
        """The enum value the candidate names (case aside), the sentiment, or one by hash."""
        lowered = {str(o).lower(): o for o in options}
        for wanted in (candidate, self.source.sentiment):
            if isinstance(wanted, str) and wanted.lower() in lowered:
                return lowered[wanted.lower()]
        return options[self.hash(path, index) % len(options)]

    def array(
        self,
        node: dict[str, Any],
        name: str,
        path: tuple[str, ...],
        candidate: Any,
        depth: int,
    ) -> list[Any]:
        low = int(node.get("minItems", 0))
        high = int(node.get("maxItems", max(low, 10)))
        items = self.resolve(node.get("items", {}))
        if isinstance(node.get("prefixItems"), list):
            prefix = node["prefixItems"]
            return [
                self.value(s, name, (*path, str(i)), i, depth + 1) for i, s in enumerate(prefix)
            ]
        if depth >= MAX_DEPTH:
            high = low
        if "enum" in items or "const" in items:
            options = items.get("enum") or [items.get("const")]
            count = max(low, min(1, high))
            start = self.hash(path, None)
            return [options[(start + i) % len(options)] for i in range(count)]
        if items.get("type") == "string" and not items.get("format"):
            if isinstance(candidate, list):
                strings = [s for s in candidate if isinstance(s, str)]
            else:  # an array of strings the name says nothing about: the text's names
                strings = self.source.names[:DEFAULT_ITEMS]
            fitted = [self.fit_string(items, s) for s in strings][:high]
            extra = [s for s in self.source.names if s not in fitted] or ["document"]
            while len(fitted) < low:
                fitted.append(self.fit_string(items, extra[len(fitted) % len(extra)]))
            return fitted
        if isinstance(candidate, list) and candidate:
            count = len(candidate)
        else:
            count = min(len(self.source.sentences), DEFAULT_ITEMS) or 1
        count = max(low, min(count, high))
        return [self.value(items, name, (*path, str(i)), i, depth + 1) for i in range(count)]

    def string(
        self,
        node: dict[str, Any],
        name: str,
        path: tuple[str, ...],
        index: int | None,
        candidate: Any,
    ) -> str:
        fmt = node.get("format")
        if fmt:
            return self.formatted(fmt, path)
        source = self.source
        if not isinstance(candidate, str):
            words = name_words(name)
            if words & NAME_WORDS:
                names = source.entities or source.keywords
                candidate = names[(index or 0) % len(names)]
            elif index is not None and words & KEYWORD_WORDS:
                candidate = source.keywords[index % len(source.keywords)]
            elif source.sentences:
                # Items of one array take consecutive sentences, from one the field's name picks.
                where = tuple(p for p in path if not p.isdigit())
                pick = self.hash(where, None) + (index or 0)
                candidate = source.sentences[pick % len(source.sentences)]
            else:
                candidate = source.keywords[0]
        return self.fit_string(node, candidate)

    def fit_string(self, node: dict[str, Any], text: str) -> str:
        """``text`` cut to ``maxLength``, or extended with more of the document to ``minLength``."""
        low, high = int(node.get("minLength", 0)), node.get("maxLength")
        filler = " ".join(self.source.subject.split()) or " ".join(self.source.keywords)
        while len(text) < low:
            text = f"{text} {filler}".strip()
        return cut(text, int(high)) if high is not None and len(text) > int(high) else text

    def formatted(self, fmt: str, path: tuple[str, ...]) -> str:
        text = self.source.text
        date = _DATE.search(text)
        if fmt == "date":
            return date.group(0) if date else "1970-01-01"
        if fmt == "date-time":
            return f"{date.group(0) if date else '1970-01-01'}T00:00:00Z"
        if fmt == "email":
            email = _EMAIL.search(text)
            return email.group(0) if email else "unknown@example.com"
        if fmt in ("uri", "url"):
            url = _URL.search(text)
            return url.group(0) if url else "https://example.com/"
        if fmt == "uuid":
            return str(uuid.uuid5(uuid.NAMESPACE_URL, "\x1f".join((text, *path))))
        defaults = {"time": "00:00:00", "duration": "P0D", "ipv4": "127.0.0.1", "ipv6": "::1"}
        return defaults.get(fmt, "example.com" if fmt == "hostname" else self.source.keywords[0])

    def number(
        self,
        node: dict[str, Any],
        integer: bool,
        path: tuple[str, ...],
        index: int | None,
        candidate: Any,
    ) -> int | float:
        words = name_words(path[-1] if path else "")
        if not isinstance(candidate, int | float) or isinstance(candidate, bool):
            candidate = self.integer_hint(words)
        if candidate is not None and self.within(node, candidate, integer):
            return int(candidate) if integer else candidate
        low = _bound(node, "minimum", "exclusiveMinimum", integer, up=True)
        high = _bound(node, "maximum", "exclusiveMaximum", integer, up=False)
        if low is None:
            low = min(0, high - (1 if integer else 1.0)) if high is not None else 0
        if high is None:
            high = low + (10 if integer else 1.0 if words & CONFIDENCE_WORDS else 100.0)
        if integer:
            whole = int(low) + self.hash(path, index) % (max(int(high) - int(low), 0) + 1)
            step = node.get("multipleOf")
            if isinstance(step, int) and step > 0:
                whole = next((v for v in range(whole, int(high) + 1) if v % step == 0), whole)
            return whole
        fraction = 0.1 + 0.8 * (self.hash(path, index) % 1000) / 1000
        value = round(low + (high - low) * fraction, 4)
        return value if self.within(node, value, False) else (low + high) / 2

    def integer_hint(self, words: set[str]) -> int | None:
        source = self.source
        if words & COUNT_WORDS or "num" in words:
            if "word" in words or "words" in words:
                return len(source.subject.split())
            if words & NAME_WORDS:
                return len(source.entities)
            if words & KEYWORD_WORDS:
                return len(source.keywords)
            return len(source.sentences)
        if "year" in words:
            year = _YEAR.search(source.text)
            return int(year.group(0)) if year else None
        for word in sorted(words & _UNIT_WORDS):  # "notice_days" is 30 in "on 30 days notice"
            found = re.search(rf"(\d+)\s*{word.removesuffix('s')}", source.subject, re.IGNORECASE)
            if found:
                return int(found.group(1))
        return None

    @staticmethod
    def within(node: dict[str, Any], value: float, integer: bool) -> bool:
        if integer and value != int(value):
            return False
        checks = (
            ("minimum", lambda b: value >= b),
            ("maximum", lambda b: value <= b),
            ("exclusiveMinimum", lambda b: value > b),
            ("exclusiveMaximum", lambda b: value < b),
        )
        return all(node.get(key) is None or ok(node[key]) for key, ok in checks)

    def boolean(self, name: str, path: tuple[str, ...], index: int | None) -> bool:
        """Whether the name's words occur in the text ("has_termination_clause"), else a hash."""
        words = name_words(name) - _BOOLEAN_FILLERS
        if words:
            lowered = self.source.text.lower()
            return any(word in lowered for word in words)
        return self.hash(path, index) % 2 == 1


def _bound(
    node: dict[str, Any], inclusive: str, exclusive: str, integer: bool, up: bool
) -> int | float | None:
    """The lowest (``up``) or highest value the schema allows, None when unbounded."""
    value, strict = node.get(inclusive), node.get(exclusive)
    if integer:
        candidates = [
            *([math.ceil(value) if up else math.floor(value)] if value is not None else []),
            *(
                [math.floor(strict) + 1 if up else math.ceil(strict) - 1]
                if strict is not None
                else []
            ),
        ]
        return (max if up else min)(candidates) if candidates else None
    if value is not None:
        return float(value)
    return None if strict is None else float(strict)


# -- where a spoilt answer puts its defect ---------------------------------------------------------


def string_list_slot(schema: dict[str, Any], answer: Any) -> tuple[dict[str, Any], str, int] | None:
    """Where an invented name goes: (the object, its key, maxItems) of an array of plain strings.

    ``entities`` at the top level when the answer has it, else the first array of strings without
    enum or format met depth first in property order (nested objects and arrays of objects
    included); None when the schema has none.
    """
    builder = _Builder(schema, Source(""))
    found: list[tuple[dict[str, Any], str, int]] = []

    def walk(node: Any, value: Any) -> None:
        node = builder.resolve(node)
        variants = node.get("anyOf") or node.get("oneOf")
        if isinstance(variants, list):
            for variant in variants:
                walk(variant, value)
            return
        if isinstance(value, dict):
            for key, sub in (node.get("properties") or {}).items():
                if key not in value:
                    continue
                resolved = builder.resolve(sub)
                items = builder.resolve(resolved.get("items", {}))
                plain = items.get("type") == "string" and not (
                    {"enum", "const", "format"} & set(items)
                )
                if isinstance(value[key], list) and plain:
                    found.append((value, key, int(resolved.get("maxItems", 10**6))))
                walk(sub, value[key])
        elif isinstance(value, list):
            for item in value:
                walk(node.get("items", {}), item)

    walk(schema, answer)
    top = [slot for slot in found if slot[0] is answer and slot[1] == "entities"]
    return (top or found)[0] if found else None
