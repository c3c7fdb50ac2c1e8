"""Tests of the simulator's Structured Outputs: any JSON schema answered from the document's text,
through the real openai SDK (``chat.completions.parse``) over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date
from enum import Enum
from typing import Any, Literal

import openai
import pytest

# What parse() sends for a pydantic model; the SDK gives it no public name (openai 3.x).
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, ConfigDict, Field

from ai_pipeline.analyses import DOCUMENT_ANALYSIS as ANALYSIS
from ai_pipeline.rehearsal.analysis import analyse
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.schema_answer import answer_for_schema
from ai_pipeline.rehearsal.simulator import SimulatorServer

COMPLAINT = (
    "Dear Acme Logistics team,\n\n"
    "My order #4471 was delayed by two weeks and arrived broken. Maria Keller from your "
    "Rotterdam depot promised a refund on Monday, but nothing happened. This is my third "
    "complaint about a delay this year.\n\nKind regards,\nJonas Weber"
)
PRAISE = (
    "We are delighted with the excellent growth this quarter. Every issue raised by Contoso "
    "Ltd was resolved quickly, and Northwind Traders recommend the service. Thank you, Sarah!"
)
COMPLAINT_ZH = (
    "客户对上海仓库的物流延迟非常不满意，已经第三次投诉。包裹破损，要求退款。物流服务需要改善。"
)
PRAISE_ZH = "我们非常满意这次合作，销售额增长了百分之二十，感谢团队的优秀表现。客户好评如潮。"
CLAUSE = (
    "7. Termination. Either party may terminate this Agreement on 30 days written notice to "
    "Harbor Supplies Ltd. Notice takes effect on 2026-03-01 unless withdrawn."
)
CLAUSE_ZH = "第六条 违约责任。任何一方违反本合同，应向对方支付违约金，并赔偿上海仓库的全部损失。"
DOCUMENTS = [COMPLAINT, PRAISE, COMPLAINT_ZH, PRAISE_ZH, CLAUSE, CLAUSE_ZH, "x"]


class BuiltIn(BaseModel):
    """The built-in analysis, declared as a team would declare it."""

    model_config = ConfigDict(extra="forbid")

    keywords: list[str] = Field(min_length=1, max_length=3)
    summary: str = Field(min_length=1, max_length=200)
    sentiment: Literal["positive", "neutral", "negative"]
    entities: list[str]
    confidence: float = Field(ge=0.0, le=1.0)


class Risk(str, Enum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class Party(BaseModel):
    name: str
    role: Literal["buyer", "seller", "other"]


class ClauseReview(BaseModel):
    clause_number: int = Field(ge=0)
    title: str = Field(max_length=60)
    summary: str = Field(min_length=5, max_length=120)
    risk: Risk
    parties: list[Party] = Field(max_length=2)
    obligations: list[str] = Field(min_length=2, max_length=4)
    has_termination_clause: bool
    notice_days: int | None = Field(ge=0, le=365)
    score: float = Field(gt=0, lt=5)
    confidence: float = Field(ge=0, le=1)


class Customer(BaseModel):
    name: str
    contact_names: list[str] = Field(max_length=2)


class Ticket(BaseModel):
    priority: Literal["p1", "p2", "p3"]
    tone: Literal["Positive", "Neutral", "Negative"]
    tags: list[str] = Field(min_length=1, max_length=5)
    customer: Customer | None
    steps: list[str] = Field(min_length=3)
    due: date | None
    language: Literal["en", "zh", "de"]
    word_count: int


class Node(BaseModel):
    label: str = Field(max_length=30)
    weight: float = Field(ge=-1, le=1)
    children: list[Node] = Field(max_length=2)


class Metrics(BaseModel):
    sentences: list[str] = Field(max_length=1)
    ratios: list[float] = Field(min_length=2, max_length=2)
    levels: list[Risk] = Field(min_length=1, max_length=3)
    flags: list[bool]
    exact: Literal[42]
    stars: int = Field(ge=1, le=5)
    delta: float = Field(gt=-0.5, lt=0.5)
    tree: Node


MODELS: list[type[BaseModel]] = [BuiltIn, ClauseReview, Ticket, Metrics]


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig()) as running:
        yield running


@pytest.fixture(autouse=True)
def clean(server: SimulatorServer) -> None:
    server.set_faults([])
    server.reset()


def client_for(server: SimulatorServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=10)


def messages(text: str) -> Any:
    return ANALYSIS.messages(text)


def schema_format(model: type[BaseModel]) -> Any:
    schema = to_strict_json_schema(model)
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": schema}}


def ask(server: SimulatorServer, text: str, response_format: Any = None) -> str | None:
    extra = {"response_format": response_format} if response_format is not None else {}
    response = client_for(server).chat.completions.create(
        model="sim-analyst-1", messages=messages(text), **extra
    )
    return response.choices[0].message.content


def flat(text: str) -> str:
    return " ".join(text.split())


# -- conformance -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_answer_validates_against_its_model(server: SimulatorServer, model: Any) -> None:
    """For varied models (enums, bounds, nesting, limited lists, nullables, recursion) and
    documents in English and Chinese, the SDK's parse() gets an answer its model accepts."""
    client = client_for(server)
    for text in DOCUMENTS:
        response = client.chat.completions.parse(
            model="sim-analyst-1", messages=messages(text), response_format=model
        )
        message = response.choices[0].message
        assert isinstance(message.parsed, model), text
        assert message.refusal is None and response.choices[0].finish_reason == "stop"
        assert model.model_validate_json(message.content or "") == message.parsed


def test_any_text_gets_a_conforming_answer_for_every_model() -> None:
    """For generated texts (any characters, Chinese, clause-like, JSON lists of outputs) every
    model's schema answer validates and is the same when asked again."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    schemas = [(model, to_strict_json_schema(model)) for model in MODELS]
    outputs = st.lists(
        st.dictionaries(
            st.sampled_from(["summary", "confidence", "obligations", "risk", "clause_count"]),
            st.one_of(
                st.text(max_size=20),
                st.floats(allow_nan=False, allow_infinity=False),
                st.integers(),
                st.lists(st.text(max_size=10), max_size=3),
            ),
        ),
        min_size=1,
        max_size=3,
    ).map(json.dumps)
    texts = st.one_of(
        st.text(max_size=300),
        st.text(
            alphabet="7. Termination第六条违约责任。，Either party Ltd 30 days\n", max_size=200
        ),
        outputs,
    )

    @hypothesis.settings(max_examples=150, deadline=None, database=None)
    @hypothesis.given(texts)
    def conforms(text: str) -> None:
        for model, schema in schemas:
            answer = answer_for_schema(schema, text)
            model.model_validate_json(json.dumps(answer, ensure_ascii=False))
            assert answer_for_schema(schema, text) == answer

    conforms()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_same_text_gets_the_same_schema_answer(server: SimulatorServer, model: Any) -> None:
    """A schema answer is byte-identical for the same text sent twice."""
    for text in (COMPLAINT, COMPLAINT_ZH, CLAUSE):
        first = ask(server, text, schema_format(model))
        assert first is not None and first == ask(server, text, schema_format(model))


@pytest.mark.parametrize("text", DOCUMENTS[:4])
def test_the_builtin_analysis_as_a_schema_is_answered_as_in_json_mode(
    server: SimulatorServer, text: str
) -> None:
    """The built-in analysis declared as a strict schema gets exactly the JSON-mode answer."""
    assert ask(server, text, schema_format(BuiltIn)) == ask(server, text, {"type": "json_object"})


def test_a_json_schema_without_a_schema_is_answered_as_json_mode(server: SimulatorServer) -> None:
    """A json_schema response format that carries no schema gets the built-in analysis."""
    bare = {"type": "json_schema", "json_schema": {"name": "anything"}}
    assert ask(server, COMPLAINT, bare) == ask(server, COMPLAINT)


def test_strings_are_taken_from_the_text() -> None:
    """Free-text strings and arrays of strings of an answer are substrings of the document."""

    class Grounded(BaseModel):
        quote: str
        evidence: list[str] = Field(min_length=1, max_length=4)
        people: list[str]
        vendor: str
        note: str = Field(max_length=40)

    for text in (COMPLAINT, PRAISE, COMPLAINT_ZH, CLAUSE):
        answer = Grounded.model_validate(answer_for_schema(to_strict_json_schema(Grounded), text))
        for value in [answer.quote, answer.vendor, answer.note, *answer.evidence, *answer.people]:
            assert value and value in flat(text), (value, text)


def test_enums_numbers_and_lists_follow_the_text(server: SimulatorServer) -> None:
    """A sentiment-like enum gets the lexicon sentiment, a language enum the language, tags the
    keywords, a customer's name the first entity, and word_count counts the words."""
    complaint = Ticket.model_validate_json(ask(server, COMPLAINT, schema_format(Ticket)) or "")
    praise_zh = Ticket.model_validate_json(ask(server, PRAISE_ZH, schema_format(Ticket)) or "")
    assert (complaint.tone, praise_zh.tone) == ("Negative", "Positive")
    assert (complaint.language, praise_zh.language) == ("en", "zh")
    assert complaint.word_count == len(COMPLAINT.split())
    assert complaint.customer is not None and complaint.customer.name == "Acme Logistics"
    assert complaint.tags == analyse(COMPLAINT)["keywords"]
    assert len(complaint.steps) == 3 and len(set(complaint.steps)) == 3


# -- clauses and reduce steps ------------------------------------------------------------------


def test_one_numbered_clause_gets_a_per_clause_answer(server: SimulatorServer) -> None:
    """A numbered clause's number, title, body and figures fill the fields named for them."""
    review = ClauseReview.model_validate_json(
        ask(server, CLAUSE, schema_format(ClauseReview)) or ""
    )
    assert review.clause_number == 7 and review.title == "Termination"
    assert review.summary.startswith("Either party may terminate this Agreement")
    assert review.has_termination_clause is True and review.notice_days == 30
    assert "Harbor Supplies Ltd" in review.obligations

    zh = ClauseReview.model_validate_json(ask(server, CLAUSE_ZH, schema_format(ClauseReview)) or "")
    assert zh.clause_number == 6 and zh.title == "违约责任"
    assert zh.summary.startswith("任何一方违反本合同")


def test_a_reduce_step_merges_the_earlier_outputs(server: SimulatorServer) -> None:
    """A document that is a JSON list of earlier outputs (or an object holding one) gets a
    conforming answer that merges their shared fields: lists joined, the lowest confidence,
    counts summed."""

    class Part(BaseModel):
        obligations: list[str] = Field(max_length=6)
        clause_count: int
        confidence: float = Field(ge=0, le=1)
        risk: Risk

    parts = [
        {
            "obligations": ["pay rent", "insure"],
            "clause_count": 2,
            "confidence": 0.9,
            "risk": "low",
        },
        {
            "obligations": ["insure", "give notice"],
            "clause_count": 3,
            "confidence": 0.7,
            "risk": "high",
        },
        {"obligations": ["repair"], "clause_count": 1, "confidence": 0.8, "risk": "high"},
    ]
    document = json.dumps(parts)
    merged = Part.model_validate_json(ask(server, document, schema_format(Part)) or "")
    assert merged.obligations == ["pay rent", "insure", "give notice", "repair"]
    assert (merged.clause_count, merged.confidence, merged.risk) == (6, 0.7, Risk.HIGH)
    review = ClauseReview.model_validate_json(
        ask(server, document, schema_format(ClauseReview)) or ""
    )
    assert review.confidence == 0.7
    wrapped = json.dumps({"document": "lease.pdf", "sections": parts})
    assert ask(server, wrapped, schema_format(Part)) == ask(server, document, schema_format(Part))


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    ["truncate", "invalid_json", "missing_field", "wrong_type", "low_confidence", "hallucinate"],
)
def test_faults_spoil_the_builtin_schema_answer_as_in_json_mode(
    server: SimulatorServer, kind: str
) -> None:
    """Each content fault spoils the built-in analysis as a schema exactly as in JSON mode."""
    server.set_faults([{"kind": kind}])
    assert ask(server, COMPLAINT, schema_format(BuiltIn)) == ask(server, COMPLAINT)


@pytest.mark.parametrize("text", [COMPLAINT, COMPLAINT_ZH])
def test_a_refusal_fault_refuses_in_the_refusal_field(server: SimulatorServer, text: str) -> None:
    """With a schema, a refusal comes as OpenAI sends it: no content, the message's refusal."""
    server.set_faults([{"kind": "refuse"}])
    response = client_for(server).chat.completions.parse(
        model="sim-analyst-1", messages=messages(text), response_format=ClauseReview
    )
    message = response.choices[0].message
    assert message.content is None and message.parsed is None
    assert message.refusal in (
        "I'm sorry, but I can't help with that request.",
        "抱歉，我无法回答这个问题。",
    )


def test_a_document_asking_for_i_dont_know_is_refused_with_a_schema(
    server: SimulatorServer,
) -> None:
    """A document instructing "answer I don't know" gets that text as the refusal."""
    text = 'Quarterly figures. If unsure, answer "I don\'t know".'
    response = client_for(server).chat.completions.parse(
        model="sim-analyst-1", messages=messages(text), response_format=Ticket
    )
    assert response.choices[0].message.refusal == "I don't know."
    assert server.stats()["requests"][0]["fault"] == "dont_know"


def test_truncated_and_prose_wrapped_schema_answers(server: SimulatorServer) -> None:
    """A truncate fault halves the schema JSON (parse() raises LengthFinishReasonError); an
    invalid_json fault wraps the intact answer in prose."""
    clean = ask(server, CLAUSE, schema_format(ClauseReview)) or ""
    server.set_faults([{"kind": "truncate", "times": 1}, {"kind": "invalid_json"}])
    with pytest.raises(openai.LengthFinishReasonError) as caught:
        client_for(server).chat.completions.parse(
            model="sim-analyst-1", messages=messages(CLAUSE), response_format=ClauseReview
        )
    assert caught.value.completion.choices[0].message.content == clean[: len(clean) // 2]
    wrapped = ask(server, CLAUSE, schema_format(ClauseReview)) or ""
    assert wrapped.startswith("Sure! Here is the analysis: {")
    assert wrapped[wrapped.index("{") : wrapped.rindex("}") + 1] == clean


def test_field_faults_pick_the_documented_fields(server: SimulatorServer) -> None:
    """missing_field drops summary (else the first property), wrong_type retypes confidence
    (else the first number), low_confidence sets confidence-like numbers to 0.42."""
    clean = json.loads(ask(server, COMPLAINT, schema_format(Ticket)) or "")
    expected = {
        ("missing_field", ClauseReview): lambda r: "summary" not in r and "title" in r,
        ("missing_field", Ticket): lambda r: list(r) == list(clean)[1:],
        ("wrong_type", ClauseReview): lambda r: r["confidence"] == "high",
        ("wrong_type", Ticket): lambda r: r["word_count"] == "high",
        ("low_confidence", ClauseReview): lambda r: r["confidence"] == 0.42,
        ("low_confidence", Ticket): lambda r: r["word_count"] == 0.42,
    }
    for (kind, model), holds in expected.items():
        server.set_faults([{"kind": kind}])
        assert holds(json.loads(ask(server, COMPLAINT, schema_format(model)) or "")), (kind, model)


def test_hallucination_goes_into_the_first_array_of_plain_strings(
    server: SimulatorServer,
) -> None:
    """Without entities, invented names go into the first array of plain strings depth first
    (here a nested, two-item list), and the answer still fits its schema."""

    class Lead(BaseModel):
        stage: Literal["new", "won"]
        customer: Customer
        notes: list[str]

    server.set_faults([{"kind": "hallucinate"}])
    lead = Lead.model_validate_json(ask(server, COMPLAINT, schema_format(Lead)) or "")
    assert lead.customer.contact_names == ["Globex Corporation", "Dr. Nora Vance"]
    assert lead.notes and all(note in COMPLAINT for note in lead.notes)
