"""Declared analyses: what a declaration is refused for, the task ids and the schema it gives,
and how its checks and sections follow what it declares."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from ai_pipeline import analyses
from ai_pipeline.analyses import CONTRACT_REVIEW, DOCUMENT_ANALYSIS
from ai_pipeline.declaration import (
    Declaration,
    DeclarationError,
    Reduce,
    Sections,
    strict_json_schema,
)
from ai_pipeline.failures import Category
from ai_pipeline.tasks import ANALYSE_STEP, task_id


class Ticket(BaseModel):
    """A ticket-triage output, as a team would declare it."""

    model_config = ConfigDict(extra="forbid")

    queue: Literal["billing", "shipping", "other"]
    reason: str = Field(max_length=200)
    customer: str | None
    products: list[str]
    urgency: int = Field(ge=1, le=5)
    certainty: float = Field(ge=0, le=1)


class Nested(BaseModel):
    ticket: Ticket
    notes: list[Ticket] = []


def _ticket(**changes: object) -> Declaration:
    values: dict[str, object] = {
        "name": "ticket_triage",
        "instructions": "Triage the ticket. Answer in JSON.",
        "output_model": Ticket,
        "confidence_field": "certainty",
        "grounded_fields": ("customer", "products"),
        "summary_field": "reason",
    }
    values.update(changes)
    return Declaration.build(**values)


def test_the_built_in_analysis_keeps_the_task_ids_it_always_had() -> None:
    """document_analysis task ids are ``<document>-analyse-v1-<sha256(model)[:8]>``, as before
    analyses were declared: the checkpoints of existing deployments stay valid."""
    model_tag = hashlib.sha256(b"gpt-4o-mini").hexdigest()[:8]
    assert DOCUMENT_ANALYSIS.tag() == "v1"
    assert task_id("ab12", ANALYSE_STEP, DOCUMENT_ANALYSIS.tag(), "gpt-4o-mini") == (
        f"ab12-analyse-v1-{model_tag}"
    )
    assert DOCUMENT_ANALYSIS.tag(reduce=False) == "v1"


def test_a_change_to_what_shapes_the_replies_changes_the_task_ids() -> None:
    """The fingerprint follows the instructions, the output schema and the model's parameters;
    a check's threshold does not make a new task."""
    base = _ticket()
    assert base.tag().startswith("ticket_triage.v1.")
    assert _ticket().tag() == base.tag()
    assert _ticket(instructions="Triage it. JSON.").tag() != base.tag()
    assert _ticket(model={"temperature": 0.5}).tag() != base.tag()
    assert _ticket(min_confidence=0.9).tag() == base.tag()

    class Wider(Ticket):
        language: str

    assert _ticket(output_model=Wider).tag() != base.tag()


def test_a_new_reduce_makes_only_the_document_task_new_not_the_sections() -> None:
    """The per-section calls are keyed without the reduce: a changed report instructions re-pays
    one call per document, not every clause."""
    changed = CONTRACT_REVIEW.model_copy(
        update={
            "sections": CONTRACT_REVIEW.sections.model_copy(  # type: ignore[union-attr]
                update={"reduce": Reduce(**{**_reduce_values(), "instructions": "Shorter."})}
            )
        }
    )
    assert changed.tag(reduce=False) == CONTRACT_REVIEW.tag(reduce=False)
    assert changed.tag() != CONTRACT_REVIEW.tag()


def _reduce_values() -> dict[str, object]:
    reduce = CONTRACT_REVIEW.reduce
    assert reduce is not None
    return {
        "instructions": reduce.instructions,
        "output_model": reduce.output_model,
        "confidence_field": reduce.confidence_field,
    }


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"confidence_field": "queue"}, "confidence_field: Ticket.queue is not a number"),
        ({"confidence_field": "sure"}, "confidence_field: Ticket has no field 'sure'"),
        ({"grounded_fields": ("urgency",)}, "Ticket.urgency is not a string or a list"),
        ({"summary_field": "products"}, "summary_field: Ticket.products is not a string"),
        ({"summary_field": "reasn"}, "summary_field: Ticket has no field 'reasn' (its fields:"),
        ({"output_model": "ai_pipeline.nowhere:Ticket"}, "output_model: Invalid python path"),
        ({"name": "Ticket-Triage"}, "name: String should match pattern"),
        ({"instructons": "typo"}, "instructons: Extra inputs are not permitted"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_naming_the_field(
    changes: dict[str, object], fragment: str
) -> None:
    """Each impossible declaration is refused when built, with the analysis and field named."""
    with pytest.raises(DeclarationError) as refused:
        _ticket(**changes)
    assert fragment in str(refused.value)
    assert str(refused.value).startswith("analysis ")


def test_an_output_field_named_like_a_results_column_is_refused() -> None:
    """A field called ``task_id`` (or another column every results row has) is refused."""

    class Clash(BaseModel):
        task_id: str

    with pytest.raises(DeclarationError, match="task_id name results columns"):
        _ticket(output_model=Clash, confidence_field=None, grounded_fields=(), summary_field=None)


def test_a_reduce_is_either_a_function_or_a_call() -> None:
    """A reduce with both a merge function and instructions, or with neither, is refused."""
    with pytest.raises(ValueError, match="either 'merge' or 'instructions'"):
        Reduce()
    with pytest.raises(ValueError, match="needs its 'output_model'"):
        Reduce(instructions="Report.")


def test_the_schema_sent_is_closed_and_requires_every_field() -> None:
    """Every object of the schema (nested ones too) lists every property as required and
    allows no other: what strict Structured Outputs accept."""
    schema = strict_json_schema(Nested)

    def objects(node: object) -> list[dict]:
        found = []
        if isinstance(node, dict):
            if "properties" in node:
                found.append(node)
            for value in node.values():
                found += objects(value)
        elif isinstance(node, list):
            for value in node:
                found += objects(value)
        return found

    closed = objects(schema)
    assert len(closed) == 2  # Nested and Ticket (in $defs)
    for node in closed:
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])
    assert "default" not in json.dumps(schema)


def test_the_checks_follow_what_the_analysis_declares() -> None:
    """A team's fields drive confidence and grounding; an undeclared check does not run."""
    text = "Order 7 from Dana Whitfield: the Kettle Pro arrived broken."
    reply = {
        "queue": "shipping",
        "reason": "Broken on arrival.",
        "customer": "Dana Whitfield",
        "products": ["Kettle Pro"],
        "urgency": 4,
        "certainty": 0.9,
    }
    ok = _ticket().evaluate(json.dumps(reply), text)
    assert [o.name for o in ok.outcomes] == ["refusal", "schema", "confidence", "grounding"]
    assert ok.passed and ok.output is not None and ok.output.model_dump()["urgency"] == 4

    invented = _ticket().evaluate(json.dumps({**reply, "products": ["Toaster X"]}), text)
    assert invented.failure is not None
    assert invented.failure.category is Category.MODEL_HALLUCINATION
    assert invented.failure.message == "products not in the document: Toaster X"

    unsure = _ticket().evaluate(json.dumps({**reply, "certainty": 0.2}), text)
    assert unsure.failure is not None and unsure.failure.category is Category.LOW_CONFIDENCE

    bare = _ticket(confidence_field=None, grounded_fields=())
    assert bare.check_names == ("refusal", "schema")
    outcome = bare.evaluate(json.dumps({**reply, "certainty": 0.2}), text)
    assert outcome.passed and [o.name for o in outcome.outcomes] == ["refusal", "schema"]


def test_a_refusal_written_in_a_free_text_field_is_a_refusal() -> None:
    """Inside a valid reply, the model's own words (not the grounded fields) are looked at for
    refusal phrases, the analysis's own phrases included."""
    text = "Order 7 from Dana Whitfield."
    reply = {
        "queue": "other",
        "reason": "Cannot triage: ticket unclear",
        "customer": None,
        "products": [],
        "urgency": 1,
        "certainty": 0.9,
    }
    plain = _ticket().evaluate(json.dumps(reply), text)
    assert plain.passed
    own = _ticket(refusal_phrases=("cannot triage",)).evaluate(json.dumps(reply), text)
    assert own.failure is not None and own.failure.category is Category.MODEL_REFUSAL


def _contract(clauses: int) -> str:
    lines = ["SERVICE AGREEMENT between Northwind Traders and Harbor Supplies Ltd.", ""]
    for i in range(1, clauses + 1):
        lines.append(f"{i}. Clause {i}. Northwind Traders shall do thing {i} within {i} days.")
        lines.append(f"{i}.1 Detail of clause {i}.")
    return "\n".join(lines)


def test_a_contract_is_cut_at_every_numbered_clause_whatever_its_length() -> None:
    """contract_review cuts a short 12-clause contract into 12 sections, the preamble with the
    first clause and sub-clauses with theirs; the built-in analysis leaves it whole."""
    text = _contract(12)
    sections = CONTRACT_REVIEW.cut(text)
    assert len(sections) == 12
    assert sections[0].text.startswith("SERVICE AGREEMENT")
    assert [s.title.split(" ", 1)[0] for s in sections[1:]] == [f"{i}." for i in range(2, 13)]
    assert all(f"{s.index}.1 Detail" in s.text for s in sections)
    assert len(DOCUMENT_ANALYSIS.cut(text)) == 1
    assert len(CONTRACT_REVIEW.cut("No clauses here, only a note.")) == 1


def test_a_contract_report_is_checked_as_the_reduce_declares() -> None:
    """The reduce call's reply is checked against the report model with its own confidence."""
    report = {"overall_risk": "high", "summary": "Clause 3 is one-sided.", "confidence": 0.5}
    verdict = CONTRACT_REVIEW.evaluate(json.dumps(report), "text", reduce=True)
    assert [o.name for o in verdict.outcomes] == ["refusal", "schema", "confidence"]
    assert verdict.failure is not None and verdict.failure.category is Category.LOW_CONFIDENCE
    assert CONTRACT_REVIEW.all_check_names == ("refusal", "schema", "confidence", "grounding")


def test_an_analysis_is_found_by_name_or_by_import_path() -> None:
    """A built-in by its name, a team's declaration by its import path; anything else is one
    clear error listing the built-ins."""
    assert analyses.resolve("contract_review") is CONTRACT_REVIEW
    assert analyses.resolve("ai_pipeline.analyses:DOCUMENT_ANALYSIS") is DOCUMENT_ANALYSIS
    with pytest.raises(DeclarationError, match="the built-ins are document_analysis"):
        analyses.resolve("contract_reveiw")
    with pytest.raises(DeclarationError, match="not a Declaration"):
        analyses.resolve("ai_pipeline.analyses:BUILTINS")


def test_sections_may_keep_their_own_budget() -> None:
    """A declared section budget wins over the pipeline's setting."""
    declared = _ticket(sections=Sections(max_chars=200, reduce=Reduce(merge=lambda parts: None)))
    text = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(6))
    assert len(declared.cut(text, default_chars=100_000)) > 1


def test_clauses_are_cut_at_the_highest_family_of_marks_a_contract_uses() -> None:
    """第N条 contracts are cut at their articles, not at the numbered items inside them; markdown
    headings that number clauses count as clauses."""
    zh = (
        "租赁合同\n\n第一条 租赁物业\n甲方出租。\n\n第二条 租金\n1. 每月一万元。\n2. 按季支付。\n\n"
        "第三条 押金\n两个月租金。"
    )
    assert [s.title for s in CONTRACT_REVIEW.cut(zh)] == ["租赁合同", "第二条 租金", "第三条 押金"]
    md = "# Agreement\n\nBetween A and B.\n\n## 1. Services\nDesign.\n\n## 2. Fees\n1) Net 30.\n"
    assert [s.title for s in CONTRACT_REVIEW.cut(md)] == ["Agreement", "2. Fees"]


def test_the_confidence_checks_description_shows_the_threshold_in_force() -> None:
    """A declared threshold is the one the check's description shows; without one, the
    setting that decides it."""
    from ai_pipeline.defs.checks import check_specs
    from ai_pipeline.defs.site import Site

    declared = _ticket(name="ticket_threshold", min_confidence=0.6)
    analyses.register(declared)
    by_name = {s.name: s.description for s in check_specs(Site(analysis=declared.name))}
    assert by_name["confidence"] == "The model's confidence is at or above 0.6 (min_confidence)."
    default = {s.name: s.description for s in check_specs(Site())}
    assert "AI_PIPELINE_MIN_CONFIDENCE" in (default["confidence"] or "")
