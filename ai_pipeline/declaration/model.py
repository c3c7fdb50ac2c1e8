"""What a team declares about its analysis, and what is refused before any document is read.

An analysis is data: a name, a version, instructions, a pydantic output model, which of its fields
the checks read (a confidence, fields that must be grounded in the source), extra refusal phrases,
the model and its parameters, and how long documents are handled (whole, or cut into sections
whose outputs are then reduced by a function or by a second LLM call). The same declaration comes
from Python or from a component's ``defs.yaml``; the machinery (the engine, the checks, the
results table, the requests) reads nothing else, and names no field of any one analysis.

A declaration that cannot work is refused when it is built (``DeclarationError``, naming the
field): a confidence field that is not a number of the output model, a grounded field that is not
a string or a list of strings, an import path that does not resolve.
"""

from __future__ import annotations

import functools
import hashlib
import json
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ImportString, ValidationError, model_validator

from ai_pipeline.declaration.checks import DEFAULT_MIN_CONFIDENCE, Evaluation, check_names, evaluate
from ai_pipeline.declaration.output_schema import strict_json_schema
from ai_pipeline.declaration.sections import DEFAULT_SECTION_CHARS, Section, split_sections

DOCUMENT_START = "<<<DOCUMENT"
DOCUMENT_END = "DOCUMENT>>>"
# The name and version become part of task ids (``<document>-<step>-<tag>-<model>``): no ``-``.
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
VERSION_PATTERN = r"^[A-Za-z0-9_.]{1,16}$"
# What the results table records of every analysis beside its output's fields.
RESERVED_FIELDS = frozenset(
    {
        "id",
        "document_id",
        "sections",
        "task_id",
        "model",
        "prompt_version",
        "sources",
        "prompt_tokens",
        "completion_tokens",
        "created_at",
        "updated_at",
        "replaced_at",
        "replaced_by_task",
    }
)


class DeclarationError(ValueError):
    """A declaration that cannot work; the message names the field and why."""


def _annotation_kinds(annotation: Any) -> set[str]:
    """What a field's annotation admits, coarsely: "str", "number", "list[str]", "other"."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation_kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        kinds: set[str] = set()
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                kinds |= _annotation_kinds(arg)
        return kinds
    if origin is Literal:
        values = typing.get_args(annotation)
        return {"str"} if all(isinstance(v, str) for v in values) else {"other"}
    if annotation is str:
        return {"str"}
    if annotation in (int, float) and annotation is not bool:
        return {"number"}
    if origin in (list, tuple, Sequence, set, frozenset):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if args and all(_annotation_kinds(a) == {"str"} for a in args):
            return {"list[str]"}
    return {"other"}


def _field_kinds(model: type[BaseModel], name: str) -> set[str] | None:
    field = model.model_fields.get(name)
    return None if field is None else _annotation_kinds(field.annotation)


class OutputChecks(BaseModel):
    """Which fields of one output model the checks read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    confidence_field: str | None = Field(
        default=None,
        description="A number field of the output model from 0 to 1; below the threshold the "
        "document goes to review (LOW_CONFIDENCE). None: no confidence check.",
    )
    min_confidence: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="The threshold; None: the pipeline's setting (AI_PIPELINE_MIN_CONFIDENCE).",
    )
    grounded_fields: tuple[str, ...] = Field(
        default=(),
        description="String or list-of-string fields whose every value must occur in the source "
        "text (else MODEL_HALLUCINATION: the output is quarantined).",
    )

    @property
    def check_names(self) -> tuple[str, ...]:
        return check_names(self.confidence_field, self.grounded_fields)

    def validate_against(self, model: type[BaseModel], where: str) -> None:
        if self.confidence_field is not None:
            kinds = _field_kinds(model, self.confidence_field)
            if kinds is None:
                raise DeclarationError(
                    f"{where}confidence_field: {model.__name__} has no field "
                    f"{self.confidence_field!r}"
                )
            if kinds != {"number"}:
                raise DeclarationError(
                    f"{where}confidence_field: {model.__name__}.{self.confidence_field} is not "
                    "a number"
                )
        for name in self.grounded_fields:
            kinds = _field_kinds(model, name)
            if kinds is None:
                raise DeclarationError(
                    f"{where}grounded_fields: {model.__name__} has no field {name!r}"
                )
            if not kinds or not kinds <= {"str", "list[str]"}:
                raise DeclarationError(
                    f"{where}grounded_fields: {model.__name__}.{name} is not a string or a list "
                    "of strings"
                )


class Reduce(OutputChecks):
    """How the outputs of a document's sections become the document's output: a function
    (``merge``), or a second LLM call over the sections' outputs (``instructions`` and
    ``output_model``), whose reply is checked like any other."""

    merge: ImportString[Callable[..., Any]] | None = Field(
        default=None,
        description="Import path of a function (list of (Section, output)) -> output, in section "
        "order; the document's output model is then the analysis's.",
    )
    instructions: str | None = Field(
        default=None, description="Instructions of the reduce call over the sections' outputs."
    )
    output_model: ImportString[type[BaseModel]] | None = Field(
        default=None, description="The reduce call's output model (the document's output)."
    )

    @model_validator(mode="after")
    def _one_way(self) -> Reduce:
        if (self.merge is None) == (self.instructions is None):
            raise ValueError("give either 'merge' or 'instructions' (with 'output_model')")
        if self.instructions is not None and self.output_model is None:
            raise ValueError("a reduce call needs its 'output_model'")
        if self.merge is not None and self.output_model is not None:
            raise ValueError("'output_model' belongs to a reduce call, not to 'merge'")
        if self.output_model is not None and not (
            isinstance(self.output_model, type) and issubclass(self.output_model, BaseModel)
        ):
            raise ValueError("'output_model' must be a pydantic model class")
        return self

    @property
    def is_call(self) -> bool:
        return self.instructions is not None


class Sections(BaseModel):
    """How a long document is cut, and how its sections' outputs are reduced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cut: Literal["budget", "clauses"] = Field(
        default="budget",
        description="'budget': only a document over max_chars is cut, at its headings and "
        "numbered clauses, pieces joined back up to the budget; 'clauses': every numbered clause "
        "is a section of its own.",
    )
    max_chars: int | None = Field(
        default=None,
        ge=200,
        description="Characters per section; None: the pipeline's setting "
        "(AI_PIPELINE_SECTION_CHARS).",
    )
    label: str = Field(
        default="section", description="What a section is called in progress ('clause 3/12')."
    )
    reduce: Reduce


class ModelSettings(BaseModel):
    """The model an analysis asks for and what it sends with each request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None, description="The model; None: the endpoint's setting (AI_PIPELINE_MODEL)."
    )
    temperature: float | None = Field(default=0.0, ge=0.0, le=2.0)
    response_format: Literal["json_schema", "json_object"] = Field(
        default="json_schema",
        description="'json_schema': Structured Outputs, the output model's schema enforced "
        "by the endpoint (OpenAI, llama.cpp, vLLM, Ollama); 'json_object': JSON mode, for an "
        "endpoint without them.",
    )
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The reply's token limit (reasoning included, for a reasoning model); None: "
        "the default of the model's family (ai_pipeline.endpoints).",
    )
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        default=None, description="Sent to a reasoning model; None: the endpoint's default."
    )
    # Overrides of the table of model families, for an endpoint it does not know.
    limit_parameter: Literal["max_tokens", "max_completion_tokens"] | None = None
    send_temperature: bool | None = None


class Declaration(OutputChecks):
    """One analysis, as a team declares it."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Lower-case letters, digits and _; names its assets."
    )
    version: str = Field(default="v1", pattern=VERSION_PATTERN)
    description: str = ""
    instructions: str = Field(min_length=1, description="The system message of every call.")
    output_model: ImportString[type[BaseModel]]
    summary_field: str | None = Field(
        default=None, description="A short text field shown in listings (status, the report)."
    )
    refusal_phrases: tuple[str, ...] = Field(
        default=(), description="Phrases that mark a refusal, beside the built-in library."
    )
    model: ModelSettings = ModelSettings()
    sections: Sections | None = None
    fingerprint: bool = Field(
        default=True,
        description="Task ids carry a fingerprint of the declaration (instructions, output "
        "schema, model parameters, sections): any change makes exactly this analysis's documents "
        "stale. False: only 'version' does; bump it with every change.",
    )

    @model_validator(mode="after")
    def _fields_exist(self) -> Declaration:
        model = self.output_model
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ValueError("output_model must be a pydantic model class")
        self.validate_against(model, "")
        clash = RESERVED_FIELDS & set(self.document_model.model_fields)
        if clash:
            raise ValueError(
                f"output_model: {', '.join(sorted(clash))} name results columns every analysis "
                "has; rename the field"
            )
        if self.summary_field is not None:
            kinds = _field_kinds(self.document_model, self.summary_field)
            fields = ", ".join(self.document_model.model_fields)
            if kinds is None:
                raise ValueError(
                    f"summary_field: {self.document_model.__name__} has no field "
                    f"{self.summary_field!r} (its fields: {fields})"
                )
            if kinds != {"str"}:
                raise ValueError(
                    f"summary_field: {self.document_model.__name__}.{self.summary_field} is not "
                    "a string field"
                )
        if self.sections is not None and self.sections.reduce.output_model is not None:
            self.sections.reduce.validate_against(self.sections.reduce.output_model, "reduce.")
        strict_json_schema(model)  # a model the request cannot describe is refused now
        return self

    @classmethod
    def build(cls, **values: Any) -> Declaration:
        """A declaration from keyword values, or ``DeclarationError`` naming each bad field."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise DeclarationError(explain(e, values.get("name"))) from None
        except DeclarationError as e:
            raise DeclarationError(f"analysis {values.get('name')!r}: {e}") from None

    # What the machinery reads.

    @property
    def document_model(self) -> type[BaseModel]:
        """The model of a document's output as stored: the reduce call's when there is one."""
        reduce = self.reduce
        if reduce is not None and reduce.output_model is not None:
            return reduce.output_model  # type: ignore[no-any-return]
        return self.output_model  # type: ignore[no-any-return]

    def messages(self, text: str, instructions: str | None = None) -> list[dict[str, str]]:
        """The chat messages of one call: the instructions, then the text between markers any
        server can tell from the instructions."""
        return [
            {"role": "system", "content": instructions or self.instructions},
            {"role": "user", "content": f"{DOCUMENT_START}\n{text}\n{DOCUMENT_END}"},
        ]

    @property
    def reduce(self) -> Reduce | None:
        return self.sections.reduce if self.sections is not None else None

    @property
    def all_check_names(self) -> tuple[str, ...]:
        """Every check any reply of this analysis may go through (the sections' and the reduce
        call's), in order: the asset checks of its documents."""
        names = set(self.check_names)
        if self.reduce is not None and self.reduce.is_call:
            names |= set(self.reduce.check_names)
        return tuple(n for n in ("refusal", "schema", "confidence", "grounding") if n in names)

    def cut(self, text: str, default_chars: int = DEFAULT_SECTION_CHARS) -> list[Section]:
        """The sections of a document's text (one, the whole text, when it is not cut)."""
        if self.sections is None:
            return split_sections(text, max(len(text), 1))
        return split_sections(text, self.sections.max_chars or default_chars, self.sections.cut)

    def evaluate(
        self,
        reply: str,
        source_text: str,
        *,
        finish_reason: str | None = "stop",
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        reduce: bool = False,
        refusal: str | None = None,
    ) -> Evaluation:
        """The checks of a reply: of a call over (a section of) the text, or of the reduce
        call; the declaration's own threshold, when it has one, before ``min_confidence``."""
        spec: OutputChecks = self
        model = self.output_model
        if reduce:
            assert self.reduce is not None and self.reduce.output_model is not None
            spec, model = self.reduce, self.reduce.output_model
        return evaluate(
            reply,
            source_text,
            model=model,
            confidence_field=spec.confidence_field,
            grounded_fields=spec.grounded_fields,
            min_confidence=spec.min_confidence
            if spec.min_confidence is not None
            else min_confidence,
            refusals=self.refusal_phrases,
            finish_reason=finish_reason,
            refusal=refusal,
        )

    def response_format(self, *, reduce: bool = False) -> dict[str, Any]:
        """The ``response_format`` of a call: the output model's (or the reduce call's) strict
        schema, or JSON mode, as the model settings say."""
        return _response_format(self, reduce)

    def tag(self, *, reduce: bool = True) -> str:
        """The version part of this analysis's task ids: the version alone, or name, version and a
        fingerprint of what shapes the replies (with the reduce, or of the per-section calls)."""
        return _tag(self, reduce)


# Both are asked for every call and every document: made once per declaration (a frozen model,
# hashed by its values, so a changed copy is another key).


@functools.lru_cache(maxsize=256)
def _response_format(declaration: Declaration, reduce: bool) -> dict[str, Any]:
    if declaration.model.response_format == "json_object":
        return {"type": "json_object"}
    model = declaration.output_model
    name = declaration.name
    if reduce:
        assert declaration.reduce is not None and declaration.reduce.output_model is not None
        model, name = declaration.reduce.output_model, f"{declaration.name}_reduce"
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": strict_json_schema(model), "strict": True},
    }


@functools.lru_cache(maxsize=256)
def _tag(declaration: Declaration, reduce: bool) -> str:
    if not declaration.fingerprint:
        return declaration.version
    shape: dict[str, Any] = {
        "instructions": declaration.instructions,
        "schema": strict_json_schema(declaration.output_model),
        "model": declaration.model.model_dump(),
        "cut": None
        if declaration.sections is None
        else [declaration.sections.cut, declaration.sections.max_chars],
    }
    if reduce and declaration.reduce is not None:
        r = declaration.reduce
        shape["reduce"] = (
            [r.instructions, strict_json_schema(r.output_model)]
            if r.output_model is not None
            else f"{r.merge.__module__}.{r.merge.__qualname__}"  # type: ignore[union-attr]
        )
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]
    return f"{declaration.name}.{declaration.version}.{digest}"


def explain(error: ValidationError, name: object = None) -> str:
    """A validation error as one line per field: ``analysis 'x': output_model: cannot import …``."""
    lines = []
    for err in error.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        # A check across fields names its field itself (``summary_field: …``).
        lines.append(f"{where}: {message}" if where else message)
    head = f"analysis {name!r}: " if isinstance(name, str) else ""
    return head + "; ".join(lines)
