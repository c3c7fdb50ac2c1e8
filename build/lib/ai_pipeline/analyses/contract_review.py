"""Contract review: every numbered clause reviewed for risk, then one report over all clauses.

A declaration on the public API of ``ai_pipeline.declaration`` alone. A contract is cut at every
top-level numbered clause (the preamble goes with the first); each clause gets its own call and
checkpoint — its risk level, what the risk is, the change to ask for, the parties it binds
(grounded in the clause) — and then one more call reads the clauses' reviews and writes the
report: the overall risk and a summary. The results row holds the report, and the clauses'
reviews beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ai_pipeline.declaration import Declaration, Reduce, Sections

Risk = Literal["high", "medium", "low"]

CLAUSE_INSTRUCTIONS = (
    "You are a contract lawyer reviewing one clause of a contract for risk. Answer with a single "
    "JSON object and nothing else, with exactly these fields: "
    '"risk_level": one of "high", "medium", "low"; '
    '"description": at most 300 characters saying what the risk is, in the language of the '
    "clause; "
    '"suggestion": at most 300 characters saying what change to ask for (or that none is '
    "needed); "
    '"parties": the parties this clause binds, exactly as the clause names them (an empty list '
    "when it names none); "
    '"confidence": a number from 0 to 1 saying how sure you are of this review. '
    "Never name a party that the clause does not name."
)

REPORT_INSTRUCTIONS = (
    "You write the review report of a contract from the reviews of its clauses, given as a JSON "
    "list in order. Answer with a single JSON object and nothing else, with exactly these "
    'fields: "overall_risk": one of "high", "medium", "low" (the contract is as risky as its '
    'riskiest clauses); "summary": at most 500 characters, the risks that matter and what to '
    'change first; "confidence": a number from 0 to 1 saying how sure you are of this report.'
)


class ClauseReview(BaseModel):
    """The review of one clause."""

    model_config = ConfigDict(extra="forbid")

    risk_level: Risk
    description: str = Field(min_length=1, max_length=300)
    suggestion: str = Field(min_length=1, max_length=300)
    parties: list[str]
    confidence: float = Field(ge=0.0, le=1.0)


class ContractReport(BaseModel):
    """The report over all clauses of a contract."""

    model_config = ConfigDict(extra="forbid")

    overall_risk: Risk
    summary: str = Field(min_length=1, max_length=500)
    confidence: float = Field(ge=0.0, le=1.0)


CONTRACT_REVIEW = Declaration(
    name="contract_review",
    version="v1",
    description="Each numbered clause's risk, description and suggested change; one report.",
    instructions=CLAUSE_INSTRUCTIONS,
    output_model=ClauseReview,
    confidence_field="confidence",
    grounded_fields=("parties",),
    sections=Sections(
        cut="clauses",
        label="clause",
        reduce=Reduce(
            instructions=REPORT_INSTRUCTIONS,
            output_model=ContractReport,
            confidence_field="confidence",
        ),
    ),
    summary_field="summary",
)
