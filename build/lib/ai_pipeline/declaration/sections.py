"""Long documents in sections: where to cut.

Two ways, as an analysis declares (``Sections.cut``):

- ``budget``: a document over the section budget is cut where its author cut it — markdown headings, numbered
clauses ("1.", "2.3", "Article 4", "Section 5", "第六条") at the start of a line — and pieces are
joined back up to the budget, so a clause list does not become a hundred tiny calls; without such
marks (or for a piece still over the budget) it is cut into windows of whole paragraphs, and a
paragraph over the budget into windows of whole sentences (a single sentence over it, at the
budget). Every cut is deterministic: the same text gives the same sections on any machine, so
each section's task id (and checkpoint) is stable across reruns.
- ``clauses``: every top-level numbered clause ("1.", "Article 4", "第六条") is a section of its
  own, whatever its length (one over the budget is cut into windows); what comes before the first
  clause (the title, the parties) goes with it. A text with fewer than two clauses is one section.

How the sections' outputs become the document's is the analysis's ``Reduce``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# Characters per section; ~4 characters per token for English, so ~1,500 tokens.
DEFAULT_SECTION_CHARS = 6000

_MARK = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]+\S"  # a markdown heading
    r"|(?:\d+(?:\.\d+)*[.)])[ \t]+\S"  # 1. / 2.3 / 4)
    r"|(?:Article|Section|Clause|ARTICLE|SECTION|CLAUSE)[ \t]+[\dIVXLC]+\b"
    r"|第[一二三四五六七八九十百千\d]+[条章节])",
    re.MULTILINE,
)
# Clauses of the top level, by the family of marks a contract numbers them with, the highest
# first: "第七条"; "Article 7" / "Section 7" / "Clause 7"; "7." / "7)" (not "7.2"), also as a
# markdown heading ("## 7. Termination"). Where a higher family occurs, a lower one numbers the
# items inside its clauses; where a family's marks are headings, its marks on plain lines do.
_CLAUSES = (
    re.compile(r"^[ \t]*(?:#{1,6}[ \t]+)?第[一二三四五六七八九十百千\d]+条", re.MULTILINE),
    re.compile(
        r"^[ \t]*(?:#{1,6}[ \t]+)?(?:Article|Section|Clause|ARTICLE|SECTION|CLAUSE)[ \t]+"
        r"[\dIVXLC]+\b",
        re.MULTILINE,
    ),
    re.compile(r"^[ \t]*(?:#{1,6}[ \t]+)?\d+[.)][ \t]+\S", re.MULTILINE),
)
_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")


@dataclass(frozen=True)
class Section:
    index: int  # 1-based
    title: str  # its first line, shortened
    text: str


def split_sections(
    text: str,
    max_chars: int = DEFAULT_SECTION_CHARS,
    cut: Literal["budget", "clauses"] = "budget",
) -> list[Section]:
    """The document's sections, cut as the module says."""
    if max_chars < 1:
        raise ValueError("max_chars must be ≥ 1")
    text = text.strip()
    if cut == "clauses":
        return _clauses(text, max_chars)
    if len(text) <= max_chars:
        return [Section(1, _title(text), text)]
    starts = sorted({0, *(m.start() for m in _MARK.finditer(text))})
    marked = [text[a:b].strip() for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    pieces: list[str] = []
    for piece in (p for p in marked if p):
        pieces.extend([piece] if len(piece) <= max_chars else _windows(piece, max_chars))
    return [Section(i, _title(t), t) for i, t in enumerate(_join(pieces, max_chars), start=1)]


def _clauses(text: str, max_chars: int) -> list[Section]:
    starts: list[int] = []
    for marks in _CLAUSES:
        found = list(marks.finditer(text))
        # Marks that are headings number the clauses; the same marks on plain lines, their items.
        headings = [m for m in found if m.group().lstrip().startswith("#")]
        starts = [m.start() for m in (headings if len(headings) >= 2 else found)]
        if len(starts) >= 2:
            break
    else:
        return split_sections(text, max_chars)
    # The preamble (title, parties) belongs to the first clause.
    bounds = zip([0, *starts[1:]], [*starts[1:], len(text)], strict=True)
    pieces: list[str] = []
    for a, b in bounds:
        piece = text[a:b].strip()
        pieces.extend([piece] if len(piece) <= max_chars else _windows(piece, max_chars))
    return [Section(i, _title(t), t) for i, t in enumerate(pieces, start=1)]


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
