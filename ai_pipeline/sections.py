"""Long documents in sections (seed 004): where to cut, and how the sections' analyses merge.

A document over the section budget is cut where its author cut it — markdown headings, numbered
clauses ("1.", "2.3", "Article 4", "Section 5", "第六条") at the start of a line — and pieces are
joined back up to the budget, so a clause list does not become a hundred tiny calls; without such
marks (or for a piece still over the budget) it is cut into windows of whole paragraphs, and a
paragraph over the budget into windows of whole sentences (a single sentence over it, at the
budget). Every cut is deterministic: the same text gives the same sections on any machine, so
each section's task id (and checkpoint) is stable across reruns.

``merge`` turns the sections' analyses into the document's: keywords and entities by how often
and how early they occur, the summaries joined in order (within the schema's 200 characters), the
sentiment that weighs most by section length, and the lowest confidence (a document is as sure as
its least sure part).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ai_pipeline.schema import Analysis

# Characters per section; ~4 characters per token for English, so ~1,500 tokens.
DEFAULT_SECTION_CHARS = 6000
SUMMARY_CHARS = 200

_MARK = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]+\S"  # a markdown heading
    r"|(?:\d+(?:\.\d+)*[.)])[ \t]+\S"  # 1. / 2.3 / 4)
    r"|(?:Article|Section|Clause|ARTICLE|SECTION|CLAUSE)[ \t]+[\dIVXLC]+\b"
    r"|第[一二三四五六七八九十百千\d]+[条章节])",
    re.MULTILINE,
)
_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")


@dataclass(frozen=True)
class Section:
    index: int  # 1-based
    title: str  # its first line, shortened
    text: str


def split_sections(text: str, max_chars: int = DEFAULT_SECTION_CHARS) -> list[Section]:
    """The document's sections: one when it fits the budget, else cut as the module says."""
    if max_chars < 1:
        raise ValueError("max_chars must be ≥ 1")
    text = text.strip()
    if len(text) <= max_chars:
        return [Section(1, _title(text), text)]
    starts = sorted({0, *(m.start() for m in _MARK.finditer(text))})
    marked = [text[a:b].strip() for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    pieces: list[str] = []
    for piece in (p for p in marked if p):
        pieces.extend([piece] if len(piece) <= max_chars else _windows(piece, max_chars))
    return [Section(i, _title(t), t) for i, t in enumerate(_join(pieces, max_chars), start=1)]


def _windows(text: str, max_chars: int) -> list[str]:
    """Whole paragraphs up to the budget; a paragraph over it as whole sentences; a sentence
    over it cut at the budget."""
    units: list[str] = []
    for paragraph in (p.strip() for p in _PARAGRAPH.split(text)):
        if not paragraph:
            continue
        if len(paragraph) <= max_chars:
            units.append(paragraph)
            continue
        for sentence in (s for s in _SENTENCE.split(paragraph) if s):
            units.extend(sentence[i : i + max_chars] for i in range(0, len(sentence), max_chars))
    return _join(units, max_chars)


def _join(pieces: list[str], max_chars: int) -> list[str]:
    """Consecutive pieces joined (a blank line between) while they fit the budget."""
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + 2 + len(piece) <= max_chars:
            out[-1] = f"{out[-1]}\n\n{piece}"
        else:
            out.append(piece)
    return out


def _title(text: str) -> str:
    first = text.split("\n", 1)[0].strip().lstrip("#").strip()
    return first[:80]


def merge(parts: list[tuple[Section, Analysis]]) -> Analysis:
    """The document's analysis from its sections' (in section order)."""
    if not parts:
        raise ValueError("nothing to merge")
    if len(parts) == 1:
        return parts[0][1]
    weight = Counter[str]()
    for section, analysis in parts:
        weight[analysis.sentiment] += len(section.text)
    sentiment = max(("negative", "neutral", "positive"), key=lambda s: (weight[s], s == "neutral"))
    return Analysis(
        keywords=_most_common([a.keywords for _, a in parts], 3),
        summary=_summary([a.summary for _, a in parts]),
        sentiment=sentiment,  # type: ignore[arg-type]
        entities=_most_common([a.entities for _, a in parts], None),
        confidence=min(a.confidence for _, a in parts),
    )


def _most_common(lists: list[list[str]], limit: int | None) -> list[str]:
    """Items by how many sections name them, then by where they first occur (case folded)."""
    count: Counter[str] = Counter()
    first: dict[str, tuple[int, str]] = {}
    for i, items in enumerate(lists):
        for item in dict.fromkeys(items):
            key = item.casefold()
            count[key] += 1
            first.setdefault(key, (i, item))
    ranked = sorted(count, key=lambda k: (-count[k], first[k][0]))
    return [first[k][1] for k in ranked[:limit]]


def _summary(summaries: list[str]) -> str:
    joined = " ".join(s.strip() for s in summaries if s.strip())
    if len(joined) <= SUMMARY_CHARS:
        return joined
    return joined[: SUMMARY_CHARS - 1].rsplit(" ", 1)[0] + "…"
