"""Resources: the results database, the LLM endpoint and the pipeline's settings.

Each field left unset falls back to the environment when a run or tick starts (see
``ai_pipeline.settings``); the API key comes only through ``dg.EnvVar("OPENAI_API_KEY")``.
"""

from typing import Any

import dagster as dg
import pandas as pd

from ai_pipeline.llm import Credentials, LLMClient
from ai_pipeline.settings import Settings
from ai_pipeline.store import Store, get_store
from ai_pipeline.store import results as results_table


class PipelineSettings(dg.ConfigurableResource):
    """Knobs of the pipeline; None means "from the environment, else the default"."""

    inbox: str | None = None
    documents_per_run: int | None = None
    max_document_bytes: int | None = None
    min_confidence: float | None = None
    settle_seconds: float | None = None
    webhook_url: str | None = None
    retry_budget: int | None = None

    def resolve(self) -> Settings:
        return Settings.load(
            inbox=self.inbox,
            documents_per_run=self.documents_per_run,
            max_document_bytes=self.max_document_bytes,
            min_confidence=self.min_confidence,
            settle_seconds=self.settle_seconds,
            webhook_url=self.webhook_url,
            retry_budget=self.retry_budget,
        )


class ResultsStore(dg.ConfigurableResource):
    """The results database (``AI_PIPELINE_DATABASE_URL``, else SQLite under DAGSTER_HOME)."""

    database_url: str | None = None

    def get(self) -> Store:
        return get_store(Settings.load(database_url=self.database_url).database_url)


class LLMResource(dg.ConfigurableResource):
    """An OpenAI-compatible chat completions endpoint."""

    api_key: str
    base_url: str | None = None
    model: str | None = None
    timeout_seconds: float | None = None
    max_concurrency: int | None = None
    requests_per_minute: int | None = None
    api_key_file: str | None = None
    api_key_command: str | None = None

    def client(self, **kwargs: Any) -> LLMClient:
        s = Settings.load(
            base_url=self.base_url,
            model=self.model,
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
            model=s.model,
            timeout_seconds=s.llm_timeout_seconds,
            max_concurrency=s.llm_concurrency,
            requests_per_minute=s.llm_requests_per_minute or None,
            **kwargs,
        )


class ResultsIOManager(dg.ConfigurableIOManager):
    """Upserts analysis results, one row per document, and loads them as a DataFrame.

    The analysis step cannot hand Dagster one ``Output`` per document of a range, so it writes each
    validated document through ``upsert`` — the same code path ``handle_output`` uses.
    """

    database_url: str | None = None

    def _store(self) -> Store:
        return get_store(Settings.load(database_url=self.database_url).database_url)

    def upsert(self, rows: Any) -> int:
        return self._store().upsert_results(list(rows))

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        rows = obj.to_dict("records") if isinstance(obj, pd.DataFrame) else list(obj)
        context.add_output_metadata({"rows_upserted": self.upsert(rows)})

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        document_ids = list(context.asset_partition_keys) if context.has_asset_partitions else None
        # A downstream of every document (the report) asks for all of them: one query, no IN list.
        if document_ids is not None and len(document_ids) > 500:
            wanted = set(document_ids)
            rows = [r for r in self._store().get_results() if r["document_id"] in wanted]
        else:
            rows = self._store().get_results(document_ids)
        return pd.DataFrame(rows, columns=[c.name for c in results_table.columns])
