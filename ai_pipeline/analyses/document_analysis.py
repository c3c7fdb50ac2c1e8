"""The demo's analysis: keywords, a summary, the sentiment and the entities of any document.

A declaration like any a team writes, on the public API of ``ai_pipeline.declaration`` alone. Its
task ids carry only its version (``fingerprint=False``), as they have since its first release, so
the checkpoints of existing deployments stay valid: bump ``version`` with every change of the
instructions or the model.

Every string and list of the output is bounded, so a grammar-constrained endpoint (llama.cpp,
vLLM) ends a reply that loops inside a keyword or an entity list at a bounded length instead of at
the token limit; the bounds are far above what a sound reply holds.

A long document is cut at its headings and clauses up to the section budget; the sections'
analyses merge into the document's without another call: keywords and entities by how often and
how early they occur (at most 20 entities), the summaries joined in order (within the 200 characters), the sentiment
that weighs most by section length, and the lowest confidence (a document is as sure as its least
sure part).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ai_pipeline.declaration import Declaration, Reduce, Section, Sections

SUMMARY_CHARS = 200
MAX_ENTITIES = 20
Keyword = Annotated[str, Field(max_length=60)]
Entity = Annotated[str, Field(max_length=80)]

INSTRUCTIONS = (
    "You analyse one document and answer with a single JSON object and nothing else. "
    "The object has exactly these fields: "
    '"keywords": 1 to 3 short strings that name what the document is about; '
    '"summary": at most 200 characters, in the language of the document; '
    '"sentiment": one of "positive", "neutral", "negative"; '
    '"entities": names of people, organisations and places exactly as written in the '
    "document (an empty list when there are none); "
    '"confidence": a number from 0 to 1 saying how sure you are of this analysis. '
    "Never invent an entity that does not occur in the document."
)


class DocumentAnalysis(BaseModel):
    """The analysis of one document, exactly as the instructions ask for it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    keywords: list[Keyword] = Field(min_length=1, max_length=3)
    summary: str = Field(min_length=1, max_length=SUMMARY_CHARS)
    sentiment: Literal["positive", "neutral", "negative"]
    entities: list[Entity] = Field(max_length=MAX_ENTITIES)
    confidence: float = Field(ge=0.0, le=1.0)


def merge(parts: list[tuple[Section, DocumentAnalysis]]) -> DocumentAnalysis:
    """The document's analysis from its sections' (in section order)."""
    if not parts:
        raise ValueError("nothing to merge")
    if len(parts) == 1:
        return parts[0][1]
    weight = Counter[str]()
    for section, analysis in parts:
        weight[analysis.sentiment] += len(section.text)
    sentiment = max(("negative", "neutral", "positive"), key=lambda s: (weight[s], s == "neutral"))
    return DocumentAnalysis(
        keywords=_most_common([a.keywords for _, a in parts], 3),
        summary=_summary([a.summary for _, a in parts]),
        sentiment=sentiment,  # type: ignore[arg-type]
        entities=_most_common([a.entities for _, a in parts], MAX_ENTITIES),
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


DOCUMENT_ANALYSIS = Declaration(
    name="document_analysis",
    version="v1",
    description="Keywords, summary, sentiment and entities of any document.",
    instructions=INSTRUCTIONS,
    output_model=DocumentAnalysis,
    summary_field="summary",
    confidence_field="confidence",
    grounded_fields=("entities",),
    sections=Sections(cut="budget", reduce=Reduce(merge=merge)),
    fingerprint=False,
)
