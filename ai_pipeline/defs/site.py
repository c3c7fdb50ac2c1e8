"""Where one analysis lives in a code location: the declaration it runs, and the names of its
assets, checks, jobs, sensors, schedule and resources there.

The product's own code location holds one analysis under the plain names (``llm_analysis``,
``analyse_documents_job``, ``results_store``…). A project that holds several — each a component
instance — gives each a key prefix: ``ticket_triage/llm_analysis``,
``ticket_triage__analyse_documents_job``, ``ticket_triage__results_store``. Analyses that name the
same partitions share them: the same document analysed two ways, each with its own task ids,
checkpoints and results table.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from ai_pipeline import analyses
from ai_pipeline.declaration import Declaration
from ai_pipeline.stages import STAGES

if TYPE_CHECKING:
    from ai_pipeline.settings import Settings

DEFAULT_PARTITIONS = "documents"
# The tag every run of an analysis job carries: which analysis (and so which results database).
ANALYSIS_TAG = "ai_pipeline/analysis"


@dataclass(frozen=True)
class Site:
    """One analysis in a code location.

    ``analysis`` is a built-in's name, a registered declaration's name, or an import path; None
    is the deployment's setting (``AI_PIPELINE_ANALYSIS``) — the product's own code location.
    Settings left None here come from the environment when a run or tick starts.
    """

    analysis: str | None = None
    prefix: str | None = None
    partitions: str = DEFAULT_PARTITIONS
    database_url: str | None = None
    inbox: str | None = None

    @property
    def declaration(self) -> Declaration:
        from ai_pipeline.settings import Settings

        return Settings.load(analysis=self.analysis).declaration

    def name(self, base: str) -> str:
        """A job, sensor, schedule, op or resource name of this analysis."""
        return f"{self.prefix}__{base}" if self.prefix else base

    def key(self, stage: str) -> dg.AssetKey:
        return dg.AssetKey([self.prefix, stage]) if self.prefix else dg.AssetKey(stage)

    @property
    def keys(self) -> tuple[dg.AssetKey, ...]:
        """The asset keys of the analysis stages, in order."""
        return tuple(self.key(stage) for stage in STAGES)

    @property
    def results_key(self) -> dg.AssetKey:
        return self.key("analysis_results")

    @property
    def checked_key(self) -> dg.AssetKey:
        """The asset the per-document checks are about: the LLM's reply."""
        return self.key("llm_analysis")

    @property
    def group(self) -> str:
        return self.prefix or "document_analysis"

    @property
    def op(self) -> str:
        return self.name("analyse_documents")

    @property
    def job_name(self) -> str:
        return self.name("analyse_documents_job")

    @property
    def report_job_name(self) -> str:
        return self.name("failure_report_job")

    @property
    def partitions_def(self) -> dg.DynamicPartitionsDefinition:
        return _partitions(self.partitions)

    @property
    def settings_overrides(self) -> dict[str, Any]:
        """What this site fixes of the settings (the rest comes from the environment)."""
        return {"analysis": self.analysis, "database_url": self.database_url, "inbox": self.inbox}


@functools.cache
def _partitions(name: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=name)


DEFAULT_SITE = Site()


def sites_of(definitions: dg.Definitions) -> dict[str, Site]:
    """The analyses a ``Definitions`` holds (``ai_pipeline.defs.factory``), by analysis name."""
    found = {}
    for value in (definitions.resources or {}).values():
        if isinstance(value, SiteResource):
            found[value.site.declaration.name] = value.site
    return found


def site_named(definitions: dg.Definitions, name: str | None) -> Site:
    """The site of the analysis ``name`` (a declaration's name); None: the only one, or the first.

    Raises ``analyses.DeclarationError`` naming the analyses there are when there is none such.
    """
    found = sites_of(definitions)
    if not found:
        return Site(analysis=name)
    if name is None:
        return next(iter(found.values()))
    if name in found:
        return found[name]
    raise analyses.DeclarationError(
        f"no analysis {name!r} in this code location: it has {', '.join(sorted(found))}"
    )


def settings_by_analysis(definitions: dg.Definitions) -> dict[str, Settings]:
    """Each analysis of the ``Definitions``, by name in their order, with the settings its runs
    use: what its site fixes, the rest from the environment (what the service needs of each)."""
    from ai_pipeline.settings import Settings

    found = sites_of(definitions) or {Site().declaration.name: Site()}
    return {name: Settings.load(**site.settings_overrides) for name, site in found.items()}


@dataclass(frozen=True)
class SiteResource:
    """The site itself, held in the ``Definitions``' resources so that whoever loads them (the
    CLI, the service) finds every analysis there — and reads each one's declaration from the very
    object its runs use."""

    site: Site

    def describe(self) -> Mapping[str, Any]:
        return {"analysis": self.site.declaration.name, "prefix": self.site.prefix}
