"""The LLM's output: the pydantic model it must match and the checks every output goes through.

Four checks, each with its category when it fails (seed 002 §3.3):

- ``refusal``: the reply is a refusal ("I don't know", "我无法回答", …; the phrase library is data in
  ``data/refusal_phrases.txt``) → MODEL_REFUSAL;
- ``schema``: strict JSON of exactly the ``Analysis`` fields, nothing around it, not truncated
  → SCHEMA_VIOLATION;
- ``confidence``: ``confidence`` at or above the threshold (0.75 by default) → LOW_CONFIDENCE;
- ``grounding``: every entity occurs in the source text after normalisation → MODEL_HALLUCINATION.

Nothing here calls a model or knows Dagster; ``evaluate`` takes a reply and the source text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ai_pipeline.failures import Category

DEFAULT_MIN_CONFIDENCE = 0.75
CHECK_NAMES = ("refusal", "schema", "confidence", "grounding")


class Analysis(BaseModel):
    """The analysis of one document, exactly as the prompt asks for it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    keywords: list[str] = Field(min_length=1, max_length=3)
    summary: str = Field(min_length=1, max_length=200)
    sentiment: Literal["positive", "neutral", "negative"]
    entities: list[str]
    confidence: float = Field(ge=0.0, le=1.0)


def fold(text: str) -> str:
    """Fold text for matching: full/half width (NFKC), case, and runs of white space."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    return re.sub(r"\s+", " ", text).strip()


@functools.cache
def refusal_phrases() -> tuple[str, ...]:
    raw = resources.files("ai_pipeline").joinpath("data/refusal_phrases.txt").read_text("utf-8")
    phrases = [line.strip() for line in raw.splitlines()]
    return tuple(fold(p) for p in phrases if p and not p.startswith("#"))


def find_refusal(reply: str, source_text: str = "") -> str | None:
    """The refusal phrase in ``reply``, unless the document itself says it (then it is a quote)."""
    folded_reply, folded_source = fold(reply), fold(source_text)
    for phrase in refusal_phrases():
        if phrase in folded_reply and phrase not in folded_source:
            return phrase
    return None


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    message: str
    category: Category | None = None


@dataclass
class Evaluation:
    """All check outcomes for one reply; ``analysis`` is set when the reply parsed."""

    outcomes: list[CheckOutcome] = field(default_factory=list)
    analysis: Analysis | None = None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def failure(self) -> CheckOutcome | None:
        """The failed check that decides the category; an ungrounded output is quarantined even
        when its confidence is low too."""
        failed = [o for o in self.outcomes if not o.passed]
        hallucination = [o for o in failed if o.category == Category.MODEL_HALLUCINATION]
        if hallucination:
            return hallucination[0]
        return failed[0] if failed else None


def _schema_error(e: ValidationError) -> str:
    problems = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(reply)"
        problems.append(f"{where}: {err['msg']}")
    return "; ".join(problems)


def evaluate(
    reply: str,
    source_text: str,
    *,
    finish_reason: str | None = "stop",
    min_confidence: float = DEFAULT_MIN_CONFIDENCE,
) -> Evaluation:
    """Run the checks in order; a check that cannot run because an earlier one failed is omitted."""
    ev = Evaluation()
    # A reply that is not JSON and holds a refusal phrase is a refusal even if the document says
    # the same words (a document may ask the model to answer "I don't know").
    phrase = find_refusal(reply)
    try:
        parsed = Analysis.model_validate_json(reply)
    except ValidationError as e:
        parsed, schema_problem = None, _schema_error(e)
    # A reply that parses is an analysis even if its summary quotes a refusal phrase; only the
    # summary is looked at then, since keywords and entities come from the document.
    if parsed is not None:
        phrase = find_refusal(parsed.summary, source_text)
    if phrase:
        ev.outcomes.append(
            CheckOutcome("refusal", False, f"the reply refuses: {phrase!r}", Category.MODEL_REFUSAL)
        )
        return ev
    ev.outcomes.append(CheckOutcome("refusal", True, "no refusal phrase"))

    if finish_reason == "length":
        ev.outcomes.append(
            CheckOutcome(
                "schema",
                False,
                "the reply was cut off at the token limit (finish_reason=length)",
                Category.SCHEMA_VIOLATION,
            )
        )
        return ev
    if parsed is None:
        ev.outcomes.append(
            CheckOutcome(
                "schema",
                False,
                f"not the expected JSON: {schema_problem}",
                Category.SCHEMA_VIOLATION,
            )
        )
        return ev
    ev.analysis = parsed
    ev.outcomes.append(CheckOutcome("schema", True, "valid JSON with every field"))

    if parsed.confidence < min_confidence:
        ev.outcomes.append(
            CheckOutcome(
                "confidence",
                False,
                f"confidence {parsed.confidence:.2f} is below {min_confidence:.2f}",
                Category.LOW_CONFIDENCE,
            )
        )
    else:
        ev.outcomes.append(CheckOutcome("confidence", True, f"confidence {parsed.confidence:.2f}"))

    folded_source = fold(source_text)
    ungrounded = [e for e in parsed.entities if fold(e) not in folded_source]
    if ungrounded:
        ev.outcomes.append(
            CheckOutcome(
                "grounding",
                False,
                f"entities not in the document: {', '.join(ungrounded[:10])}",
                Category.MODEL_HALLUCINATION,
            )
        )
    else:
        ev.outcomes.append(
            CheckOutcome("grounding", True, f"all {len(parsed.entities)} entities in the document")
        )
    return ev
