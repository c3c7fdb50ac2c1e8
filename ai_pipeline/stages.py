"""The stages of a document's analysis, named once, and the events that report them.

``Stage`` holds each stage's name and ``STAGES`` their order; every module that names a stage
(the engine, the Dagster assets) takes the name from here. The names are plain strings: they
become parts of Dagster asset keys.

The events are what ``ai_pipeline.engine.Analyser`` reports per document and stage — done,
failed, or left to another run — and what the Dagster step turns into materializations and check
evaluations (``ai_pipeline.defs.assets``), with ``shown``, an output as its event's metadata.
``StageError`` and ``Cancelled`` carry a failure or a cancellation from where it happens (the
engine, its LLM calls in ``ai_pipeline.calls``) to where the events are gathered. How the stages
run lives in the engine, not here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ai_pipeline.declaration import CheckOutcome
from ai_pipeline.failures import Category, ClassifiedError


class Stage:
    """The name of each stage (an asset of each analysis in Dagster)."""

    DOCUMENT_TEXT: Final = "document_text"
    LLM_ANALYSIS: Final = "llm_analysis"
    VALIDATED_ANALYSIS: Final = "validated_analysis"
    ANALYSIS_RESULTS: Final = "analysis_results"
    COMPLETION_NOTICE: Final = "completion_notice"


# The order a document goes through them: each depends on the one before.
STAGES: Final = (
    Stage.DOCUMENT_TEXT,
    Stage.LLM_ANALYSIS,
    Stage.VALIDATED_ANALYSIS,
    Stage.ANALYSIS_RESULTS,
    Stage.COMPLETION_NOTICE,
)


@dataclass(frozen=True)
class StageDone:
    document_id: str
    stage: str
    metadata: dict[str, Any]
    checks: tuple[CheckOutcome, ...] = ()


@dataclass(frozen=True)
class StageFailed:
    document_id: str
    stage: str
    category: Category
    error: str
    task_id: str | None = None


@dataclass(frozen=True)
class StageDeferred:
    """Another live run holds the document: left to it, neither done nor failed here."""

    document_id: str
    task_id: str
    holder: str


Event = StageDone | StageFailed | StageDeferred


def stage_in_progress(events: Sequence[Event]) -> str:
    """The stage a document was in when it failed: the one after the last it finished."""
    done = [e.stage for e in events if isinstance(e, StageDone)]
    after = STAGES.index(done[-1]) + 1 if done else 0
    return STAGES[min(after, len(STAGES) - 1)]


class StageError(ClassifiedError):
    """A failure of the engine's, raised where it happened and caught where the document's events
    are gathered: the stage it happened at, and the call it is about when that is not the
    document's own (a section's)."""

    def __init__(self, stage: str, category: Category, message: str, task: str | None = None):
        super().__init__(category, message)
        self.stage = stage
        self.task = task


class Cancelled(Exception):
    """The document's submitter cancelled it while this run held it."""


def shown(output: dict[str, Any]) -> dict[str, Any]:
    """An output's top-level values as a person reads them in the UI: numbers and short text as
    they are, lists of text joined, anything else as JSON."""
    values: dict[str, Any] = {}
    for name, value in output.items():
        if isinstance(value, bool | int | float) or value is None:
            values[name] = value
        elif isinstance(value, str):
            values[name] = value[:500]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            values[name] = ", ".join(value)[:500]
        else:
            values[name] = json.dumps(value, ensure_ascii=False)[:500]
    return values
