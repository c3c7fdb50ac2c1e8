"""What a schema answer draws on: a document read as plain text, as one numbered clause, or as
the earlier outputs a reduce step is sent.

:class:`Source` computes, once and only when asked, the document's keywords, names, sentences,
sentiment, confidence and title (from :mod:`.analysis`); for a clause they come from its body, for
a reduce step from the text of the earlier outputs, whose values a property of the same name
merges (:meth:`Source.merged`). The word lists say which property names mean what.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ai_pipeline.rehearsal.analysis import (
    confidence_for,
    extract_entities,
    extract_keywords,
    is_chinese,
    sentiment_label,
    summarise,
)

_CLAUSE = re.compile(
    r"^\s*(?:(?:Article|Section|Clause|ARTICLE|SECTION|CLAUSE)\s+(?P<a>\d+(?:\.\d+)*|[IVXLC]+)"
    r"[.:)]?\s+|(?P<n>\d+(?:\.\d+)*)[.)]\s+|第(?P<z>[一二三四五六七八九十百\d]+)条\s*)"
    r"(?P<rest>\S.*)$",
    re.DOTALL,
)
_LINE_MARK = re.compile(
    r"\n[ \t]*(?:(?:Article|Section|Clause)\s+\d|\d+(?:\.\d+)*[.)][ \t]|第[一二三四五六七八九十百\d]+条)"
)
_TITLE_END = re.compile(r"[.:](?=\s|$)|[：。]|\s[-–—]\s")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

SUMMARY_WORDS = {"summary", "summarise", "summarize", "abstract", "gist", "overview", "synopsis"}
SENTIMENT_WORDS = {"sentiment", "tone", "mood", "polarity"}
LANGUAGE_WORDS = {"language", "lang", "locale"}
TITLE_WORDS = {"title", "heading", "headline", "caption", "subject", "topic"}
NUMBER_WORDS = {"number", "no", "index", "id", "ref", "reference"}
NAME_WORDS = {
    *("name", "names", "party", "parties", "person", "people", "organization", "organisation"),
    *("organizations", "organisations", "company", "companies", "author", "sender", "vendor"),
    *("customer", "counterparty", "counterparties", "entity", "entities", "who", "signatory"),
}
KEYWORD_WORDS = {"keyword", "keywords", "tag", "tags", "topics", "terms", "themes", "labels"}
CONFIDENCE_WORDS = {"confidence", "certainty", "probability", "likelihood"}
COUNT_WORDS = {"count", "total", "amount_of"}
_ZH_DIGITS = dict(zip("一二三四五六七八九", range(1, 10), strict=True))
_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}


def stable_number(*parts: str) -> int:
    """A number that is the same for the same parts on every machine and every run."""
    joined = "\x1f".join(parts).encode("utf-8")
    return int(hashlib.sha256(joined).hexdigest()[:12], 16)


def name_words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower()) if w}


def cut(text: str, limit: int) -> str:
    """The longest start of ``text`` within ``limit`` characters, at a word boundary if near."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return cut[:space].rstrip(" ,;:") if space >= limit // 2 else cut


def number_value(number: str) -> int:
    if number.isdigit():
        return int(number)
    if number[0] in _ROMAN:
        values = [_ROMAN[ch] for ch in number]
        return sum(-v if v < nxt else v for v, nxt in zip(values, [*values[1:], 0], strict=True))
    if number.replace(".", "").isdigit():
        return int(number.split(".")[0])
    tens, _, units = number.partition("十")
    if "十" not in number:
        return _ZH_DIGITS.get(number, 0)
    return _ZH_DIGITS.get(tens, 1) * 10 + _ZH_DIGITS.get(units, 0)


@dataclass(frozen=True)
class Clause:
    """A document that is one numbered clause, in its parts."""

    number: str
    title: str | None
    body: str


def parse_clause(text: str) -> Clause | None:
    """The parts of a text that is exactly one numbered clause (None for anything else)."""
    match = _CLAUSE.match(text)
    if match is None or _LINE_MARK.search(match["rest"]):
        return None
    number = match["a"] or match["n"] or match["z"]
    rest = match["rest"].strip()
    end = _TITLE_END.search(rest)
    title = rest[: end.start()].strip() if end is not None else ""
    # A title is a few words ("Termination", "违约责任"), not the clause's first sentence.
    short = len(title) <= 16 and "，" not in title if _CJK.search(title) else len(title) <= 80
    if end is not None and title and short and len(title.split()) <= 8:
        body = rest[end.end() :].strip()
        if body:
            return Clause(number, title, body)
    return Clause(number, None, rest)


def earlier_outputs(text: str) -> list[dict[str, Any]] | None:
    """The objects of a document that is a JSON list of objects (a reduce step's input), or an
    object holding one such list (``{"sections": [...]}``)."""
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    candidates = list(value.values()) if isinstance(value, dict) else [value]
    return next(
        (
            c
            for c in candidates
            if isinstance(c, list) and c and all(isinstance(v, dict) for v in c)
        ),
        None,
    )


def _string_leaves(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _string_leaves(v)]
    if isinstance(value, list):
        return [s for v in value for s in _string_leaves(v)]
    return []


class Source:
    """The document and what is derived from it, each computed once and only when asked."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.outputs = earlier_outputs(text)
        self.clause = None if self.outputs is not None else parse_clause(text)
        if self.outputs is not None:
            self.subject = "\n".join(_string_leaves(self.outputs))
        else:
            self.subject = self.clause.body if self.clause is not None else text

    @cached_property
    def chinese(self) -> bool:
        return is_chinese(self.subject)

    @cached_property
    def keywords(self) -> list[str]:
        return extract_keywords(self.subject)

    @cached_property
    def entities(self) -> list[str]:
        return extract_entities(self.subject)

    @cached_property
    def sentiment(self) -> str:
        return sentiment_label(self.subject)

    @cached_property
    def confidence(self) -> float:
        return confidence_for(self.text)

    @cached_property
    def names(self) -> list[str]:
        """Entities, then keywords, then the text's words: strings for arrays of strings."""
        words = [w.strip(".,;:!?()\"'“”") for w in self.subject.split()]
        pool = [*self.entities, *self.keywords, *(w for w in words if len(w) > 2)]
        return list(dict.fromkeys(p for p in pool if p))

    @cached_property
    def sentences(self) -> list[str]:
        flat = " ".join(self.subject.split())
        found = [s.strip() for s in _SENTENCE_END.split(flat) if any(c.isalnum() for c in s)]
        return found or ([flat] if flat else [])

    @cached_property
    def title(self) -> str:
        if self.clause is not None and self.clause.title:
            return self.clause.title
        lines = [line.strip() for line in self.subject.splitlines() if line.strip()]
        return cut(lines[0], 80) if lines else ""

    def summary(self, limit: int) -> str:
        return summarise(self.subject, limit)

    def merged(self, name: str) -> Any:
        """The earlier outputs' values of ``name`` merged into one (``MISSING`` if none)."""
        values = [o[name] for o in self.outputs or [] if name in o]
        if not values:
            return MISSING
        words = name_words(name)
        if all(isinstance(v, list) for v in values):
            joined = [item for v in values for item in v]
            return list({json.dumps(i, sort_keys=True): i for i in joined}.values())
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if numeric and words & CONFIDENCE_WORDS:
            return min(values)
        if numeric and words & COUNT_WORDS:
            return sum(values)
        if all(isinstance(v, bool) for v in values):
            return any(values)
        if all(isinstance(v, str) for v in values) and words & SUMMARY_WORDS:
            return " ".join(values)
        counts = Counter(json.dumps(v, sort_keys=True) for v in values)
        best = max(counts.values())
        return next(v for v in values if counts[json.dumps(v, sort_keys=True)] == best)


class Missing:
    pass


MISSING: Any = Missing()
