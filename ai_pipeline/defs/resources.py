"""Resources: the results database, the LLM endpoint and the pipeline's settings.

Each field left unset falls back to the environment when a run or tick starts (see
``ai_pipeline.settings``); the API key comes only through ``dg.EnvVar("OPENAI_API_KEY")``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from ai_pipeline.llm import LLMClient
from ai_pipeline.llm_access import CallSlots, Credentials, GlobalCap
from ai_pipeline.settings import Settings, SettingsError
from ai_pipeline.store import Store, open_store

# The folder ``dg dev`` and ``dagster dev`` make their instance in when DAGSTER_HOME is unset.
TEMPORARY_INSTANCE_PREFIX = ".tmp_dagster_home_"


class PipelineSettings(dg.ConfigurableResource):
    """Knobs of the pipeline; None means "from the environment, else the default"."""

    # The analysis these settings are for (``ai_pipeline.defs.site``): a built-in's or a
    # registered declaration's name, or an import path; None: AI_PIPELINE_ANALYSIS.
    analysis: str | None = None
    inbox: str | None = None
    documents_per_run: int | None = None
    max_document_bytes: int | None = None
    min_confidence: float | None = None
    settle_seconds: float | None = None
    webhook_url: str | None = None
    retry_budget: int | None = None
    sensor_max_files: int | None = None

    def resolve(self) -> Settings:
        return Settings.load(
            analysis=self.analysis,
            inbox=self.inbox,
            documents_per_run=self.documents_per_run,
            max_document_bytes=self.max_document_bytes,
            min_confidence=self.min_confidence,
            settle_seconds=self.settle_seconds,
            webhook_url=self.webhook_url,
            retry_budget=self.retry_budget,
            sensor_max_files=self.sensor_max_files,
        )


class ResultsStore(dg.ConfigurableResource):
    """The results database (``AI_PIPELINE_DATABASE_URL``, else SQLite under DAGSTER_HOME)."""

    database_url: str | None = None
    # Whose results (each analysis has its own tables); None: AI_PIPELINE_ANALYSIS.
    analysis: str | None = None
    _store: Store | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if context.instance is not None:
            refuse_a_temporary_instance(context.instance, self.database_url)
        # Resolved once per run or tick, not at every call.
        self._store = self._open()

    def get(self) -> Store:
        return self._store if self._store is not None else self._open()

    def _open(self) -> Store:
        return open_store(Settings.load(database_url=self.database_url, analysis=self.analysis))


def refuse_a_temporary_instance(instance: dg.DagsterInstance, database_url: str | None) -> None:
    """``dg dev`` with no ``DAGSTER_HOME`` runs on a temporary instance, removed when it exits:
    the results database would land in the project's folder and, next time, the same documents
    would be registered and paid for again. Refused, unless a database is named."""
    if database_url or os.environ.get("AI_PIPELINE_DATABASE_URL"):
        return
    if Path(instance.root_directory).name.startswith(TEMPORARY_INSTANCE_PREFIX):
        raise SettingsError(
            "Dagster runs on a temporary instance (DAGSTER_HOME is not set): set DAGSTER_HOME "
            "to a folder of its own (the analysis's scaffold writes it into the project's .env), "
            "or name a database_url"
        )


class LLMResource(dg.ConfigurableResource):
    """An OpenAI-compatible chat completions endpoint."""

    api_key: str
    base_url: str | None = None
    # The analysis whose calls this endpoint answers: its declaration names the model, else
    # AI_PIPELINE_MODEL does (every consumer of a task id reads the model from there too).
    analysis: str | None = None
    timeout_seconds: float | None = None
    max_concurrency: int | None = None
    requests_per_minute: int | None = None
    api_key_file: str | None = None
    api_key_command: str | None = None

    def client(self, *, call_slots: CallSlots | None = None, **kwargs: Any) -> LLMClient:
        """The run's client; with ``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY`` set, its requests also
        hold a slot of ``call_slots`` (the results database's) each."""
        s = Settings.load(
            base_url=self.base_url,
            analysis=self.analysis,
            llm_timeout_seconds=self.timeout_seconds,
            llm_concurrency=self.max_concurrency,
            llm_requests_per_minute=self.requests_per_minute,
            api_key_file=self.api_key_file,
            api_key_command=self.api_key_command,
        )
        return LLMClient(
            base_url=s.base_url or "https://api.openai.com/v1",
            api_key=Credentials(
                self.api_key, key_file=s.api_key_file, key_command=s.api_key_command
            ),
            model=s.analysis_model,
            timeout_seconds=s.llm_timeout_seconds,
            max_concurrency=s.llm_concurrency,
            requests_per_minute=s.llm_requests_per_minute or None,
            global_cap=(
                GlobalCap(call_slots, s.global_llm_concurrency, lease_seconds=s.lease_seconds)
                if call_slots is not None and s.global_llm_concurrency
                else None
            ),
            **kwargs,
        )
