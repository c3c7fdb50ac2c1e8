"""The analysis as a Dagster component: a team adds it to its own ``dg`` project, declares its
analysis in a ``defs.yaml`` (instructions, a pydantic output model, what the checks read, the model),
and gets the product's assets, per-document checks, jobs, sensors and schedule for it.

    dg scaffold defs ai_pipeline.component.Analysis ticket_triage

writes ``defs/ticket_triage/defs.yaml`` and a starter output model beside it. Each instance lives
under its own key prefix (the analysis's name unless ``key_prefix`` says otherwise), so several
coexist in one project; those naming the same ``partitions`` share their documents.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from pydantic import Field

from ai_pipeline import analyses, project_setup
from ai_pipeline.declaration import Declaration, DeclarationError
from ai_pipeline.defs.factory import AtLoad, site_definitions
from ai_pipeline.defs.site import DEFAULT_PARTITIONS, Site
from ai_pipeline.settings import Settings


class AnalysisScaffolder(dg.Scaffolder):
    """Writes a ``defs.yaml`` that declares an analysis and a starter output model for it."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        folder = request.target_path
        folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^a-z0-9_]", "_", folder.name.lower()).strip("_") or "analysis"
        if not name[0].isalpha():
            name = f"a_{name}"
        (folder / "models.py").write_text(STARTER_MODEL, encoding="utf-8")
        attributes = {
            "name": name,
            "instructions": STARTER_INSTRUCTIONS,
            "output_model": f"{_module_of(folder, request.project_root)}.models:Output",
            "confidence_field": "confidence",
            "grounded_fields": ["quotes"],
            # The model is the declaration's: dg dev, the daemon and every command then agree on
            # which results are current (AI_PIPELINE_MODEL is read only where none is declared).
            "llm": {"name": Settings.load().model},
        }
        (folder / "defs.yaml").write_text(
            yaml.safe_dump(
                {"type": request.type_name, "attributes": attributes},
                sort_keys=False,
                allow_unicode=True,
                width=100,
            ),
            encoding="utf-8",
        )
        if request.project_root is not None:
            for written in project_setup.prepare(request.project_root):
                print(f"ai-pipeline: wrote {written}")


# A declaration's ``model`` is the component's ``llm`` attribute.
_MODEL_PATH = re.compile(r"(?<![\w.])model\.")


def as_written(message: str, defs_yaml: Path) -> str:
    """A declaration's error as the team wrote it: attributes under their names in the file
    (``llm.…``, not ``model.…``), the file, and the line of the first attribute it names."""
    message = _MODEL_PATH.sub("llm.", message)
    line = None
    try:
        lines = defs_yaml.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for key in re.findall(r"(?:^|[:;] )([a-z_][\w.]*): ", message)[:1]:
        for part in reversed(key.split(".")):
            found = [i for i, text in enumerate(lines, 1) if re.search(rf"\b{part}\s*:", text)]
            if found:
                line = found[0]
                break
    return f"{defs_yaml}{f':{line}' if line else ''}: {message}"


def _module_of(folder: Path, project_root: Path | None) -> str:
    """The import path of a folder of the project (``src/`` layout or not)."""
    folder = folder.resolve()
    for root in ([project_root / "src", project_root] if project_root else []) + [Path.cwd()]:
        try:
            return ".".join(folder.relative_to(root.resolve()).parts)
        except ValueError:
            continue
    return folder.name


STARTER_INSTRUCTIONS = (
    "Read the document and answer with one JSON object of the requested fields. Quote the "
    "passages you rely on exactly as they are written."
)

STARTER_MODEL = textwrap.dedent(
    '''\
    """The output of one document's analysis: edit the fields, then `dg check defs`.

    Bound every string and list: a constrained model stops at the bound, not at its limit."""

    from typing import Annotated

    from pydantic import BaseModel, Field


    class Output(BaseModel):
        summary: str = Field(
            max_length=400, description="What the document says, in one or two sentences."
        )
        quotes: list[Annotated[str, Field(max_length=300)]] = Field(
            max_length=5, description="Passages of the document, exactly as written."
        )
        confidence: float = Field(ge=0, le=1, description="How sure the analysis is, 0 to 1.")
    '''
)


@dg.scaffold_with(AnalysisScaffolder)
class Analysis(dg.Component, dg.Model, dg.Resolvable):
    """An LLM analysis of documents, idempotent and safe to retry: one paid call per document and
    declaration, per-document checks, failed-only backfills, upserted results."""

    analysis: str | None = Field(
        default=None,
        description="A built-in analysis (document_analysis, contract_review) or a Declaration's "
        "import path (package.module:NAME); or leave it out and declare one with the fields "
        "below.",
    )
    name: str | None = Field(
        default=None, description="Lower-case letters, digits and _: names the analysis."
    )
    version: str = "v1"
    description: str = ""
    instructions: str | None = Field(default=None, description="The system message of a call.")
    instructions_file: str | None = Field(
        default=None, description="A file holding the instructions, relative to this defs.yaml."
    )
    output_model: str | None = Field(
        default=None, description="Import path of the pydantic output model (package.module:Class)."
    )
    summary_field: str | None = None
    confidence_field: str | None = None
    min_confidence: float | None = None
    grounded_fields: list[str] = Field(default_factory=list)
    refusal_phrases: list[str] = Field(default_factory=list)
    llm: dict[str, Any] | None = Field(
        default=None,
        description="The model and what each request sends (name, temperature, response_format, "
        "max_output_tokens, reasoning_effort).",
    )
    sections: dict[str, Any] | None = Field(
        default=None,
        description="How a long document is cut and its sections' outputs reduced (cut, "
        "max_chars, label, reduce).",
    )
    fingerprint: bool = True
    key_prefix: str | None = Field(
        default=None, description="The prefix of its asset keys and names; default: its name."
    )
    partitions: str = Field(
        default=DEFAULT_PARTITIONS,
        description="The dynamic partitions its documents are; analyses naming the same share "
        "them.",
    )
    database_url: str | None = Field(
        default=None,
        description="Its results database (SQLAlchemy URL); default: AI_PIPELINE_DATABASE_URL, "
        "else a SQLite file of its own under DAGSTER_HOME.",
    )
    inbox: str | None = Field(default=None, description="The folder its inbox sensor watches.")

    def declaration(self, here: Path | None = None) -> Declaration:
        """What this instance declares (``here``: the folder of its defs.yaml)."""
        if self.analysis is not None:
            return analyses.resolve(self.analysis)
        instructions = self.instructions
        if self.instructions_file is not None:
            path = (here or Path.cwd()) / self.instructions_file
            try:
                instructions = path.read_text(encoding="utf-8")
            except OSError as e:
                raise DeclarationError(f"instructions_file: cannot read {path}: {e}") from None
        values: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "instructions": instructions,
            "output_model": self.output_model,
            "summary_field": self.summary_field,
            "confidence_field": self.confidence_field,
            "min_confidence": self.min_confidence,
            "grounded_fields": tuple(self.grounded_fields),
            "refusal_phrases": tuple(self.refusal_phrases),
            "fingerprint": self.fingerprint,
        }
        if self.llm is not None:
            values["model"] = self.llm
        if self.sections is not None:
            values["sections"] = self.sections
        return Declaration.build(**{k: v for k, v in values.items() if v is not None})

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        try:
            declaration = self.declaration(context.path)
        except DeclarationError as e:
            raise DeclarationError(as_written(str(e), context.path / "defs.yaml")) from None
        analyses.register(declaration)
        site = Site(
            analysis=declaration.name,
            prefix=self.key_prefix or declaration.name,
            partitions=self.partitions,
            database_url=self.database_url,
            inbox=self.inbox,
        )
        return site_definitions(site, AtLoad.from_settings(Settings.load()))
