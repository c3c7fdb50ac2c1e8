"""The checks every LLM reply goes through, driven by what its analysis declares.

Up to four, in order, each with its category when it fails:

- ``refusal``: the reply is a refusal ("I don't know", "我无法回答", …; the phrase library is data
  in ``data/refusal_phrases.txt``, plus the analysis's own phrases) → MODEL_REFUSAL;
- ``schema``: strict JSON of exactly the output model, not truncated → SCHEMA_VIOLATION. A JSON
  object inside a code fence or after a short preface, as models write them, is taken from the
  outermost braces (``unwrap``) and the outcome says so; prose with no such object is still a
  violation;
- ``confidence`` (when a confidence field is declared): at or above the threshold (0.75 by
  default) → LOW_CONFIDENCE. A confidence outside the range its output model allows (``1e15`` for
  a number from 0 to 1: a grammar-constrained endpoint such as llama.cpp's bounds strings and
  lists but not numbers) is no confidence to trust: LOW_CONFIDENCE too, when it is the reply's
  only problem, and the reply has no output then;
- ``grounding`` (when grounded fields are declared): every value occurs in the source text after
  normalisation → MODEL_HALLUCINATION.

Nothing here calls a model or knows Dagster, and nothing names a field of any one analysis.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

from pydantic import BaseModel, ValidationError

from ai_pipeline.failures import Category

DEFAULT_MIN_CONFIDENCE = 0.75


def check_names(confidence_field: str | None, grounded_fields: tuple[str, ...]) -> tuple[str, ...]:
    """The checks a reply goes through, in order, given what its output declares."""
    names = ["refusal", "schema"]
    if confidence_field is not None:
        names.append("confidence")
    if grounded_fields:
        names.append("grounding")
    return tuple(names)


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


def find_refusal(reply: str, source_text: str = "", extra: Iterable[str] = ()) -> str | None:
    """The refusal phrase in ``reply``, unless the document itself says it (then it is a quote)."""
    folded_reply, folded_source = fold(reply), fold(source_text)
    for phrase in (*refusal_phrases(), *(fold(p) for p in extra)):
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
    """All check outcomes for one reply; ``output`` is set when the reply parsed."""

    outcomes: list[CheckOutcome] = field(default_factory=list)
    output: BaseModel | None = None
    # How the JSON was taken out of the text around it (a code fence, a preface), when it was.
    unwrapped: str | None = None

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


def unwrap(reply: str) -> tuple[str, str] | None:
    """The JSON object of a reply with text around it — the outermost braces — and a note of
    what was around it; None when there is nothing to unwrap."""
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end < start:
        return None
    before, after = reply[:start].strip(), reply[end + 1 :].strip()
    if not before and not after:
        return None
    fenced = before.startswith("```") or after.endswith("```")
    around = "a code fence" if fenced else f"{len(before) + len(after)} characters of prose"
    return reply[start : end + 1], f"the JSON object was taken out of {around} around it"


def _schema_error(e: ValidationError) -> str:
    problems = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(reply)"
        problems.append(f"{where}: {err['msg']}")
    return "; ".join(problems)


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _out_of_range(e: ValidationError, confidence_field: str | None) -> str | None:
    """The confidence check's message when the one problem of a reply is a confidence outside
    the bounds of its field; else None (the reply breaks its schema)."""
    errors = e.errors()
    if confidence_field is None or len(errors) != 1:
        return None
    (error,) = errors
    if error["loc"] != (confidence_field,) or error["type"] not in _RANGE_ERRORS:
        return None
    return (
        f"confidence {error['input']!r} is outside the range of {confidence_field} "
        f"({error['msg'].lower()}): not a confidence to trust"
    )


def _free_text(output: BaseModel, grounded_fields: tuple[str, ...]) -> list[str]:
    """The top-level string values that are the model's own words (not declared as taken from
    the document): where a refusal would be written inside a valid reply."""
    return [
        value for name, value in output if isinstance(value, str) and name not in grounded_fields
    ]


def _values(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | set | frozenset):
        return [v for v in value if isinstance(v, str)]
    return []


def evaluate(
    reply: str,
    source_text: str,
    *,
    model: type[BaseModel],
    confidence_field: str | None = None,
    grounded_fields: tuple[str, ...] = (),
    min_confidence: float = DEFAULT_MIN_CONFIDENCE,
    refusals: Iterable[str] = (),
    finish_reason: str | None = "stop",
    refusal: str | None = None,
) -> Evaluation:
    """Run the checks in order; a check that cannot run because an earlier one failed is omitted.
    ``refusal`` is what the endpoint reported as a refusal apart from the content."""
    ev = Evaluation()
    if refusal:
        message = f"the model refused: {refusal.strip()[:300]}"
        ev.outcomes.append(CheckOutcome("refusal", False, message, Category.MODEL_REFUSAL))
        return ev
    refusals = tuple(refusals)
    # A reply that is not JSON and holds a refusal phrase is a refusal even if the document says
    # the same words (a document may ask the model to answer "I don't know").
    phrase = find_refusal(reply, extra=refusals)
    out_of_range: str | None = None
    try:
        parsed: BaseModel | None = model.model_validate_json(reply)
    except ValidationError as e:
        parsed, schema_problem = None, _schema_error(e)
        out_of_range = _out_of_range(e, confidence_field)
        inner = unwrap(reply) if finish_reason != "length" else None
        if inner is not None:
            # Else the first problem, of the reply as it came, is the one reported.
            try:
                parsed, ev.unwrapped = model.model_validate_json(inner[0]), inner[1]
            except ValidationError as inner_error:
                out_of_range = out_of_range or _out_of_range(inner_error, confidence_field)
    # A reply that parses is an output even if a field quotes a refusal phrase; only the model's
    # own words are looked at then, and a phrase the document holds is a quote.
    if parsed is not None:
        phrase = next(
            (
                found
                for text in _free_text(parsed, grounded_fields)
                if (found := find_refusal(text, source_text, refusals))
            ),
            None,
        )
    if phrase:
        ev.outcomes.append(
            CheckOutcome("refusal", False, f"the reply refuses: {phrase!r}", Category.MODEL_REFUSAL)
        )
        return ev
    ev.outcomes.append(CheckOutcome("refusal", True, "no refusal phrase"))

    if finish_reason == "length":
        # A reasoning model can spend the whole limit thinking: the content is then empty.
        what = "the reply is empty" if not reply.strip() else "the reply was cut off"
        ev.outcomes.append(
            CheckOutcome(
                "schema",
                False,
                f"truncated: {what} at the token limit (finish_reason=length)",
                Category.SCHEMA_VIOLATION,
            )
        )
        return ev
    if parsed is None and out_of_range is not None:
        ev.outcomes.append(CheckOutcome("schema", True, "valid JSON with every field"))
        ev.outcomes.append(CheckOutcome("confidence", False, out_of_range, Category.LOW_CONFIDENCE))
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
    ev.output = parsed
    note = f" ({ev.unwrapped})" if ev.unwrapped else ""
    ev.outcomes.append(CheckOutcome("schema", True, f"valid JSON with every field{note}"))

    if confidence_field is not None:
        confidence = float(getattr(parsed, confidence_field))
        if confidence < min_confidence:
            ev.outcomes.append(
                CheckOutcome(
                    "confidence",
                    False,
                    f"confidence {confidence:.2f} is below {min_confidence:.2f}",
                    Category.LOW_CONFIDENCE,
                )
            )
        else:
            ev.outcomes.append(CheckOutcome("confidence", True, f"confidence {confidence:.2f}"))

    if grounded_fields:
        ev.outcomes.append(_grounding(parsed, source_text, grounded_fields))
    return ev


def _grounding(output: BaseModel, source_text: str, fields: tuple[str, ...]) -> CheckOutcome:
    folded_source = fold(source_text)
    problems, counts = [], []
    for name in fields:
        values = _values(getattr(output, name))
        counts.append(f"{len(values)} {name}")
        ungrounded = [v for v in values if fold(v) not in folded_source]
        if ungrounded:
            problems.append(f"{name} not in the document: {', '.join(ungrounded[:10])}")
    if problems:
        return CheckOutcome("grounding", False, "; ".join(problems), Category.MODEL_HALLUCINATION)
    return CheckOutcome("grounding", True, f"all {', '.join(counts)} in the document")
