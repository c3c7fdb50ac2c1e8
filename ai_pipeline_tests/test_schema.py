"""The four checks every reply of the built-in analysis goes through (``Declaration.evaluate``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.analyses.document_analysis import DocumentAnalysis as Analysis
from ai_pipeline.declaration import DEFAULT_MIN_CONFIDENCE, Evaluation
from ai_pipeline.declaration.checks import find_refusal, fold, refusal_phrases
from ai_pipeline.failures import Category

CHECK_NAMES = DOCUMENT_ANALYSIS.check_names
evaluate = DOCUMENT_ANALYSIS.evaluate

SOURCE = (
    "Service agreement between ＡＣＭＥ Logistics B.V. and Northwind Traders, signed in "
    "Rotterdam on 1 July 2024 by Maria Keller. Delivery within 5 working days."
)


def _analysis(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "keywords": ["logistics", "contract", "delivery"],
        "summary": "A warehousing agreement between ACME Logistics and Northwind Traders.",
        "sentiment": "neutral",
        "entities": ["ACME Logistics", "Northwind Traders", "Rotterdam"],
        "confidence": 0.9,
    }
    base.update(changes)
    return base


def _reply(**changes: Any) -> str:
    return json.dumps(_analysis(**changes), ensure_ascii=False)


def _outcomes(ev: Evaluation) -> list[tuple[str, bool]]:
    return [(o.name, o.passed) for o in ev.outcomes]


def _assert_schema_violation(ev: Evaluation, fragment: str) -> None:
    assert _outcomes(ev) == [("refusal", True), ("schema", False)]
    assert not ev.passed
    assert ev.output is None
    failure = ev.failure
    assert failure is not None and failure.name == "schema"
    assert failure.category is Category.SCHEMA_VIOLATION
    assert fragment in failure.message


def test_valid_reply_passes_all_four_checks() -> None:
    """A valid JSON analysis with grounded entities passes all four checks, in order."""
    ev = evaluate(_reply(), SOURCE)
    assert [o.name for o in ev.outcomes] == list(CHECK_NAMES)
    assert all(o.passed and o.category is None for o in ev.outcomes)
    assert ev.passed and ev.failure is None
    assert ev.output == Analysis(**_analysis())
    assert ev.outcomes[3].message == "all 3 entities in the document"


@pytest.mark.parametrize(
    ("reply", "note"),
    [
        (f"```json\n{_reply()}\n```", "taken out of a code fence"),
        (f"```\n{_reply()}\n```\n", "taken out of a code fence"),
        (f"Here is the analysis:\n{_reply()}", "taken out of 21 characters of prose"),
        (f"Sure.\n{_reply()}\nHope this helps!", "characters of prose"),
    ],
)
def test_json_in_a_code_fence_or_after_a_preface_is_unwrapped(reply: str, note: str) -> None:
    """A JSON object inside a code fence or with prose around it is taken from its outermost
    braces, passes the checks, and the schema outcome and the evaluation say it was unwrapped."""
    ev = evaluate(reply, SOURCE)
    assert ev.passed, ev.outcomes
    assert ev.output == Analysis(**_analysis())
    assert ev.unwrapped is not None and note in ev.unwrapped
    schema = next(o for o in ev.outcomes if o.name == "schema")
    assert note in schema.message


def test_a_bare_json_reply_is_not_marked_unwrapped() -> None:
    """A reply that is the JSON object alone (white space aside) records no unwrapping."""
    ev = evaluate(f"\n  {_reply()}\n", SOURCE)
    assert ev.passed and ev.unwrapped is None
    assert ev.outcomes[1].message == "valid JSON with every field"


@pytest.mark.parametrize(
    "reply",
    [
        "The document is a service agreement between two companies; no JSON today.",
        "Here is the analysis: {summary: a service agreement, confidence: high}",
        f"```json\n{_reply()[:-40]}\n```",
    ],
    ids=["no-braces", "not-json", "cut-inside-fence"],
)
def test_prose_without_a_json_object_stays_a_schema_violation(reply: str) -> None:
    """Prose with no JSON object in it, or with braces around something that is not the
    expected JSON, is still SCHEMA_VIOLATION, reporting the reply as it came."""
    _assert_schema_violation(evaluate(reply, SOURCE), "Invalid JSON")
    assert evaluate(reply, SOURCE).unwrapped is None


def test_an_empty_reply_after_reasoning_is_a_truncated_schema_violation() -> None:
    """A reasoning model that spent its whole limit thinking answers "" with
    finish_reason=length: classified as a truncated SCHEMA_VIOLATION that says it is empty."""
    _assert_schema_violation(
        evaluate("", SOURCE, finish_reason="length"), "truncated: the reply is empty"
    )
    _assert_schema_violation(evaluate("", SOURCE), "Invalid JSON")


def test_missing_summary_is_a_schema_violation() -> None:
    """A reply without the summary field fails the schema check naming the field."""
    data = _analysis()
    del data["summary"]
    _assert_schema_violation(evaluate(json.dumps(data), SOURCE), "summary: Field required")


def test_confidence_as_a_string_is_a_schema_violation() -> None:
    """confidence given as the string "high" (or a numeric string) fails the strict schema."""
    _assert_schema_violation(evaluate(_reply(confidence="high"), SOURCE), "confidence")
    _assert_schema_violation(evaluate(_reply(confidence="0.9"), SOURCE), "confidence")


def test_integer_confidence_is_accepted() -> None:
    """A JSON integer such as 1 is a valid confidence number."""
    ev = evaluate(_reply(confidence=1), SOURCE)
    assert ev.passed
    assert ev.output is not None and ev.output.confidence == 1.0


def test_truncated_reply_with_finish_reason_length_is_a_schema_violation() -> None:
    """A reply cut off at the token limit is a SCHEMA_VIOLATION that says so."""
    reply = _reply()[:60]
    ev = evaluate(reply, SOURCE, finish_reason="length")
    _assert_schema_violation(ev, "cut off at the token limit (finish_reason=length)")


def test_finish_reason_length_fails_even_when_the_json_parses() -> None:
    """finish_reason=length fails the schema check even if the cut happened to leave valid JSON."""
    _assert_schema_violation(evaluate(_reply(), SOURCE, finish_reason="length"), "finish_reason")


def test_truncated_reply_without_finish_reason_is_still_a_schema_violation() -> None:
    """Truncated JSON is a SCHEMA_VIOLATION whatever the finish reason says."""
    _assert_schema_violation(evaluate(_reply()[:60], SOURCE), "Invalid JSON")


def test_extra_field_is_a_schema_violation() -> None:
    """A field the schema does not have is rejected (extra=forbid)."""
    _assert_schema_violation(evaluate(_reply(language="en"), SOURCE), "language: Extra inputs")


@pytest.mark.parametrize("count", [0, 4])
def test_keyword_count_outside_one_to_three_is_a_schema_violation(count: int) -> None:
    """Zero or four keywords fail the schema check."""
    keywords = ["logistics", "contract", "delivery", "warehouse"][:count]
    _assert_schema_violation(evaluate(_reply(keywords=keywords), SOURCE), "keywords")


@pytest.mark.parametrize("count", [1, 3])
def test_keyword_count_at_the_bounds_passes(count: int) -> None:
    """One and three keywords are accepted."""
    keywords = ["logistics", "contract", "delivery"][:count]
    assert evaluate(_reply(keywords=keywords), SOURCE).passed


def test_summary_of_201_characters_is_a_schema_violation() -> None:
    """A 201-character summary is too long; 200 characters is fine."""
    _assert_schema_violation(evaluate(_reply(summary="x" * 201), SOURCE), "summary")
    assert evaluate(_reply(summary="x" * 200), SOURCE).passed


def test_unknown_sentiment_is_a_schema_violation() -> None:
    """A sentiment outside positive/neutral/negative fails the schema check."""
    _assert_schema_violation(evaluate(_reply(sentiment="mixed"), SOURCE), "sentiment")


def test_low_confidence_fails_with_low_confidence() -> None:
    """confidence 0.5 is below the default threshold: LOW_CONFIDENCE, other checks still run."""
    ev = evaluate(_reply(confidence=0.5), SOURCE)
    assert _outcomes(ev) == [
        ("refusal", True),
        ("schema", True),
        ("confidence", False),
        ("grounding", True),
    ]
    assert ev.failure is not None and ev.failure.category is Category.LOW_CONFIDENCE
    assert ev.failure.message == "confidence 0.50 is below 0.75"
    assert ev.output is not None and ev.output.confidence == 0.5


def test_confidence_threshold_is_inclusive_and_configurable() -> None:
    """Exactly the threshold passes; a custom min_confidence is honoured."""
    assert DEFAULT_MIN_CONFIDENCE == 0.75
    assert evaluate(_reply(confidence=0.75), SOURCE).passed
    assert evaluate(_reply(confidence=0.5), SOURCE, min_confidence=0.4).passed
    ev = evaluate(_reply(confidence=0.9), SOURCE, min_confidence=0.95)
    assert ev.failure is not None and ev.failure.category is Category.LOW_CONFIDENCE


@pytest.mark.parametrize("confidence", [1000.0, 1e15, -0.2])
def test_confidence_outside_its_range_is_low_confidence_without_an_output(
    confidence: float,
) -> None:
    """A confidence outside 0..1 (what a grammar-constrained endpoint lets a small model write)
    is no confidence to trust: LOW_CONFIDENCE, and no output to accept or store."""
    ev = evaluate(_reply(confidence=confidence), SOURCE)
    assert _outcomes(ev) == [("refusal", True), ("schema", True), ("confidence", False)]
    assert ev.failure is not None and ev.failure.category is Category.LOW_CONFIDENCE
    assert "outside the range of confidence" in ev.failure.message
    assert ev.output is None


def test_confidence_out_of_range_beside_another_problem_is_a_schema_violation() -> None:
    """When the reply breaks its schema elsewhere too, the schema check decides."""
    ev = evaluate(_reply(confidence=7, sentiment="mixed"), SOURCE)
    _assert_schema_violation(ev, "sentiment")


@pytest.mark.parametrize(
    ("field", "value"),
    [("keywords", ["x" * 61]), ("entities", ["x" * 81]), ("entities", ["ACME Logistics"] * 21)],
)
def test_every_string_and_list_of_the_reply_is_bounded(field: str, value: list[str]) -> None:
    """Keywords, entities and their number have upper bounds, sent in the strict schema, so a
    grammar-constrained endpoint stops a looping reply at them."""
    _assert_schema_violation(evaluate(_reply(**{field: value}), SOURCE), field)
    properties = DOCUMENT_ANALYSIS.response_format()["json_schema"]["schema"]["properties"]
    for name in ("keywords", "entities"):
        assert "maxLength" in properties[name]["items"] and "maxItems" in properties[name]


def test_entity_not_in_source_is_a_hallucination() -> None:
    """An entity that does not occur in the source fails grounding: MODEL_HALLUCINATION."""
    ev = evaluate(_reply(entities=["ACME Logistics", "Globex Corporation"]), SOURCE)
    assert _outcomes(ev)[-1] == ("grounding", False)
    failure = ev.failure
    assert failure is not None and failure.category is Category.MODEL_HALLUCINATION
    assert failure.message == "entities not in the document: Globex Corporation"


@pytest.mark.parametrize(
    "entity",
    [
        "acme logistics",
        "ACME LOGISTICS",
        "ＡＣＭＥ Logistics",
        "Acme  Logistics",
        "northwind TRADERS",
    ],
)
def test_entity_matching_ignores_width_case_and_spacing(entity: str) -> None:
    """Full/half width, case and white-space differences do not make an entity ungrounded."""
    ev = evaluate(_reply(entities=[entity]), SOURCE)
    assert _outcomes(ev)[-1] == ("grounding", True)
    assert ev.passed


def test_fold_normalises_width_case_quotes_and_space() -> None:
    """fold maps full-width to half-width, case-folds, straightens quotes, squeezes space."""
    assert fold("  ＡＣＭＥ\n\tLogistics ") == "acme logistics"
    assert fold("I\u2019m HERE") == "i'm here"


@pytest.mark.parametrize(
    ("reply", "phrase"),
    [
        ("I don't know.", "i don't know"),
        ("I don\u2019t know.", "i don't know"),
        ("抱歉，我无法回答这个问题。", "我无法回答"),
        ("As an AI language model, I cannot...", "as an ai language model"),
        ("我不知道。", "我不知道"),
        ("I'm sorry, but I can't help with that request.", "i'm sorry, but i can't"),
    ],
)
def test_refusal_replies_are_model_refusal(reply: str, phrase: str) -> None:
    """Refusals in English and Chinese fail the first check with MODEL_REFUSAL and nothing else."""
    ev = evaluate(reply, SOURCE)
    assert _outcomes(ev) == [("refusal", False)]
    assert ev.failure is not None and ev.failure.category is Category.MODEL_REFUSAL
    assert ev.failure.message == f"the reply refuses: {phrase!r}"
    assert ev.output is None


def test_refusal_in_parsed_summary_is_a_refusal() -> None:
    """A valid JSON reply whose summary is a refusal is MODEL_REFUSAL."""
    ev = evaluate(_reply(summary="I cannot determine what this document is about."), SOURCE)
    assert ev.failure is not None and ev.failure.category is Category.MODEL_REFUSAL


def test_refusal_phrase_only_in_keywords_of_a_valid_reply_is_not_a_refusal() -> None:
    """Once the reply parses, only the summary is looked at for refusal phrases."""
    source = SOURCE + " Section 4: insufficient information voids the claim."
    ev = evaluate(_reply(keywords=["insufficient information"]), source)
    assert ev.passed


def test_refusal_phrase_quoted_from_the_source_is_not_a_refusal() -> None:
    """A refusal phrase that the source itself contains is a quote, not a refusal."""
    source = 'The customer wrote: "I don\'t know where my parcel is." Acme Logistics replied.'
    summary = "The customer says: I don't know where my parcel is."
    ev = evaluate(_reply(summary=summary, entities=["Acme Logistics"]), source)
    assert ev.passed
    assert find_refusal("I don't know.", source) is None
    # A bare refusal (no JSON) is a refusal even when the document holds the same words: a
    # document may ask the model to answer "I don't know".
    bare = evaluate("I don't know.", source)
    assert _outcomes(bare) == [("refusal", False)]
    assert bare.failure is not None and bare.failure.category is Category.MODEL_REFUSAL


def test_chinese_refusal_phrase_in_the_source_is_not_a_refusal() -> None:
    """A Chinese refusal phrase occurring in the source is not treated as a refusal."""
    source = "客服回复：我不知道包裹在哪里，请稍候。"
    assert find_refusal("客户说我不知道包裹在哪里", source) is None
    assert find_refusal("我不知道", "another document") == "我不知道"


def test_refusal_library_is_large_and_bilingual() -> None:
    """The phrase library has at least 27 folded phrases, in English and Chinese, no comments."""
    phrases = refusal_phrases()
    assert len(phrases) >= 27
    assert len(set(phrases)) == len(phrases)
    assert not any(p.startswith("#") or not p for p in phrases)
    assert all(p == fold(p) for p in phrases)
    chinese = [p for p in phrases if any("\u4e00" <= ch <= "\u9fff" for ch in p)]
    english = [p for p in phrases if p.isascii()]
    assert len(chinese) >= 5 and len(english) >= 5
    assert "i don't know" in phrases and "我无法回答" in phrases


def test_non_refusal_prose_is_a_schema_violation_not_a_refusal() -> None:
    """Plain prose without a refusal phrase passes the refusal check and fails the schema."""
    ev = evaluate("The document is a contract between two companies.", SOURCE)
    assert _outcomes(ev) == [("refusal", True), ("schema", False)]
