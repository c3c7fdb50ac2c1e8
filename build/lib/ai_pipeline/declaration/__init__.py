"""Declared analyses: what a team states about its analysis, and the machinery it drives.

The public API a declaration is written against (the built-ins in ``ai_pipeline.analyses`` use
nothing else):

- :class:`Declaration` (with :class:`Sections`, :class:`Reduce`, :class:`ModelSettings`): the
  declaration itself, validated when it is built;
- :func:`strict_json_schema`: the output model as Structured Outputs send it;
- :class:`Section`: a piece of a long document, as a ``Reduce.merge`` function receives it.

Inside: ``model`` (the declaration), ``output_schema`` (the JSON schema sent), ``checks`` (refusal,
schema, confidence, grounding), ``sections`` (where a long document is cut).
"""

from ai_pipeline.declaration.checks import (
    DEFAULT_MIN_CONFIDENCE,
    CheckOutcome,
    Evaluation,
    check_names,
)
from ai_pipeline.declaration.model import (
    Declaration,
    DeclarationError,
    ModelSettings,
    OutputChecks,
    Reduce,
    Sections,
)
from ai_pipeline.declaration.output_schema import strict_json_schema
from ai_pipeline.declaration.sections import DEFAULT_SECTION_CHARS, Section, split_sections

__all__ = [
    "DEFAULT_MIN_CONFIDENCE",
    "DEFAULT_SECTION_CHARS",
    "CheckOutcome",
    "Declaration",
    "DeclarationError",
    "Evaluation",
    "ModelSettings",
    "OutputChecks",
    "Reduce",
    "Section",
    "Sections",
    "check_names",
    "split_sections",
    "strict_json_schema",
]
