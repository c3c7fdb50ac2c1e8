"""Settings read from the environment, with their defaults, in one table: the one place that
reads the pipeline's environment variables.

Read when a run, a sensor tick or a CLI command starts — never at import time — so a changed
environment takes effect without reloading the code location; the three that shape definitions
(the sensor's interval, the nightly cron, its timezone and its path) are read when the code
location loads.
A value set in Dagster config on a resource wins over the environment. ``OPENAI_API_KEY`` is not
here: it is a secret and goes to the LLM resource through ``dg.EnvVar`` only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ai_pipeline import analyses
from ai_pipeline.declaration import DEFAULT_MIN_CONFIDENCE, Declaration, DeclarationError
from ai_pipeline.documents import DEFAULT_MAX_DOCUMENT_BYTES
from ai_pipeline.errors import InputError

RESULTS_DATABASE_FILE = "ai_pipeline.sqlite"


class SettingsError(InputError, ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class Setting:
    env: str
    default: Any
    help: str
    kind: type | None = None  # when the default (None) does not say it


SETTINGS: dict[str, Setting] = {
    "inbox": Setting("AI_PIPELINE_INBOX", None, "folder the inbox sensor watches"),
    "database_url": Setting(
        "AI_PIPELINE_DATABASE_URL",
        None,
        "results database (SQLAlchemy URL); default: SQLite file $DAGSTER_HOME/ai_pipeline.sqlite",
    ),
    "base_url": Setting(
        "OPENAI_BASE_URL", None, "OpenAI-compatible endpoint; default: the OpenAI API"
    ),
    "analysis": Setting(
        "AI_PIPELINE_ANALYSIS",
        analyses.DEFAULT.name,
        "the analysis runs make: a built-in's name or a Declaration's import path (pkg.mod:NAME)",
    ),
    "definitions": Setting(
        "AI_PIPELINE_DEFINITIONS",
        None,
        "the code location the CLI and the service load (package.module[:attribute]): a project "
        "holding its analyses as components; default: the product's own",
    ),
    "model": Setting(
        "AI_PIPELINE_MODEL", "gpt-4o-mini", "model sent with every call the analysis leaves open"
    ),
    "llm_concurrency": Setting(
        "AI_PIPELINE_LLM_CONCURRENCY", 8, "LLM calls in flight at once within one run"
    ),
    "global_llm_concurrency": Setting(
        "AI_PIPELINE_GLOBAL_LLM_CONCURRENCY",
        None,
        "LLM calls in flight at once across every run, process and host sharing the results "
        "database (slots held there); unset: no cap beyond each run's",
        int,
    ),
    "llm_timeout_seconds": Setting(
        "AI_PIPELINE_LLM_TIMEOUT", 60.0, "seconds before one LLM call times out"
    ),
    "llm_requests_per_minute": Setting(
        "AI_PIPELINE_LLM_RPM", 0, "LLM requests per rolling minute within one run (0: no limit)"
    ),
    "api_key_file": Setting(
        "AI_PIPELINE_API_KEY_FILE", None, "file holding a fresh API key after a 401/403"
    ),
    "api_key_command": Setting(
        "AI_PIPELINE_API_KEY_COMMAND", None, "command printing a fresh API key after a 401/403"
    ),
    "documents_per_run": Setting(
        "AI_PIPELINE_DOCUMENTS_PER_RUN",
        None,
        "documents in one run of a sensor or of `run` (backfills: AI_PIPELINE_BACKFILL_RUN_SIZE); "
        "unset: a sensor tick's documents over the run queue's slots, as a backfill's, and 25 "
        "for `run`",
        int,
    ),
    "max_document_bytes": Setting(
        "AI_PIPELINE_MAX_DOCUMENT_BYTES",
        DEFAULT_MAX_DOCUMENT_BYTES,
        "larger files are rejected as INPUT_QUALITY_ISSUE",
    ),
    "min_confidence": Setting(
        "AI_PIPELINE_MIN_CONFIDENCE", DEFAULT_MIN_CONFIDENCE, "lowest confidence accepted"
    ),
    "webhook_url": Setting(
        "AI_PIPELINE_WEBHOOK_URL", None, "completion notices go here; unset: no notices"
    ),
    "retry_budget": Setting(
        "AI_PIPELINE_RETRY_BUDGET", 3, "retryable failures before a document goes to DEAD_LETTER"
    ),
    "price_per_1k_prompt_tokens": Setting(
        "AI_PIPELINE_PRICE_PER_1K_PROMPT_TOKENS", 0.00015, "for the report's cost estimate"
    ),
    "price_per_1k_completion_tokens": Setting(
        "AI_PIPELINE_PRICE_PER_1K_COMPLETION_TOKENS", 0.0006, "for the report's cost estimate"
    ),
    "settle_seconds": Setting(
        "AI_PIPELINE_SETTLE_SECONDS", 1.0, "a file changed this recently may still be written"
    ),
    "db_retry_seconds": Setting(
        "AI_PIPELINE_DB_RETRY_SECONDS",
        60.0,
        "how long a lost results database is retried before a document fails",
    ),
    "lease_seconds": Setting(
        "AI_PIPELINE_LEASE_SECONDS",
        60.0,
        "how long a run's claim on a document lasts unless renewed (a dead run's, then expires)",
    ),
    "claim_wait_seconds": Setting(
        "AI_PIPELINE_CLAIM_WAIT_SECONDS",
        600.0,
        "how long a run waits for a document another run holds before leaving it to that run",
    ),
    "sensor_interval_seconds": Setting(
        "AI_PIPELINE_SENSOR_INTERVAL", 30, "seconds between inbox sensor ticks (at load)"
    ),
    "batch_api_interval_seconds": Setting(
        "AI_PIPELINE_BATCH_API_INTERVAL",
        120,
        "seconds between ticks of the sensor that follows Batch API jobs (at load)",
    ),
    "backfill_run_size": Setting(
        "AI_PIPELINE_BACKFILL_RUN_SIZE",
        None,
        "documents per run of a backfill the daemon runs (each run is a process start); unset: "
        "the batch over the run queue's slots, so that its runs start in one wave",
        int,
    ),
    "backfill_documents": Setting(
        "AI_PIPELINE_BACKFILL_DOCUMENTS",
        None,
        "most documents in one backfill: a larger launch (a batch, backfill --failed) is "
        "several backfills, each one's page readable in the UI; unset: 10,000",
        int,
    ),
    "sensor_max_files": Setting(
        "AI_PIPELINE_SENSOR_MAX_FILES",
        500,
        "new inbox files one sensor tick takes at most (a backlog drains over ticks)",
    ),
    "nightly_cron": Setting(
        "AI_PIPELINE_NIGHTLY_CRON", "0 2 * * *", "the nightly retry schedule (at load)"
    ),
    "timezone": Setting("AI_PIPELINE_TIMEZONE", "UTC", "the nightly schedule's timezone (at load)"),
    "nightly_via": Setting(
        "AI_PIPELINE_NIGHTLY_VIA",
        "sync",
        "how the nightly schedule retries: sync (a backfill) or batch (OpenAI's Batch API at "
        "half the price; the daemon's openai_batch_sensor runs the answers) (at load)",
    ),
    "section_chars": Setting(
        "AI_PIPELINE_SECTION_CHARS",
        6000,
        "a longer document is analysed in sections of at most this many characters",
    ),
    "prices_file": Setting(
        "AI_PIPELINE_PRICES_FILE",
        None,
        "per-model prices (JSON/YAML, USD per million tokens) over the packaged table",
    ),
    "run_budget_usd": Setting(
        "AI_PIPELINE_RUN_BUDGET_USD", None, "no run spends more than this (USD)", float
    ),
    "run_budget_tokens": Setting(
        "AI_PIPELINE_RUN_BUDGET_TOKENS", None, "no run spends more tokens than this", int
    ),
    "completion_reserve_tokens": Setting(
        "AI_PIPELINE_COMPLETION_RESERVE_TOKENS",
        1024,
        "completion tokens a call reserves against a budget before it is sent",
    ),
    "json_log": Setting(
        "AI_PIPELINE_JSON_LOG",
        None,
        "also write every line of the analysis runs as JSON to this file (one object a line)",
    ),
    "tenants_file": Setting(
        "AI_PIPELINE_TENANTS_FILE", None, "tenants and API keys of `ai-pipeline serve` (YAML/JSON)"
    ),
    "dagster_url": Setting(
        "AI_PIPELINE_DAGSTER_URL",
        "http://127.0.0.1:3000",
        "the Dagster UI, for the run links `ai-pipeline serve` hands out",
    ),
    "public_url": Setting(
        "AI_PIPELINE_PUBLIC_URL",
        None,
        "where clients reach `ai-pipeline serve` (its poll/SSE URLs and the review page's links); "
        "unset: paths, never the request's Host",
    ),
}


@dataclass(frozen=True)
class Settings:
    inbox: str | None
    database_url: str
    base_url: str | None
    analysis: str
    model: str
    llm_concurrency: int
    llm_timeout_seconds: float
    llm_requests_per_minute: int
    api_key_file: str | None
    api_key_command: str | None
    documents_per_run: int | None
    max_document_bytes: int
    min_confidence: float
    webhook_url: str | None
    retry_budget: int
    price_per_1k_prompt_tokens: float
    price_per_1k_completion_tokens: float
    settle_seconds: float
    db_retry_seconds: float
    lease_seconds: float
    claim_wait_seconds: float
    sensor_interval_seconds: int
    batch_api_interval_seconds: int
    sensor_max_files: int
    backfill_run_size: int | None
    backfill_documents: int | None
    nightly_cron: str
    timezone: str
    nightly_via: str
    section_chars: int
    prices_file: str | None
    run_budget_usd: float | None
    run_budget_tokens: int | None
    completion_reserve_tokens: int
    json_log: str | None
    tenants_file: str | None
    dagster_url: str
    public_url: str | None = None
    definitions: str | None = None
    global_llm_concurrency: int | None = None

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Settings from overrides (when not None), else the environment, else the defaults."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            setting = SETTINGS[f.name]
            value = overrides.get(f.name)
            if value is None:
                raw = os.environ.get(setting.env)
                value = setting.default if raw in (None, "") else _parse(setting, raw)
            values[f.name] = value
        if values["database_url"] is None:
            values["database_url"] = default_database_url(values["analysis"])
        settings = cls(**values)
        settings.validate()
        return settings

    @property
    def declaration(self) -> Declaration:
        """The analysis these settings name (checked when they are loaded)."""
        return analyses.resolve(self.analysis)

    @property
    def analysis_model(self) -> str:
        """The model the analysis's calls are sent to: its own, else the setting's."""
        return self.declaration.model.name or self.model

    def validate(self) -> None:
        try:
            self.declaration  # noqa: B018 - resolved now: a wrong name stops here, once
        except DeclarationError as e:
            raise SettingsError(f"AI_PIPELINE_ANALYSIS: {e}") from None
        if self.nightly_via not in ("sync", "batch"):
            raise SettingsError(
                f"AI_PIPELINE_NIGHTLY_VIA must be sync or batch, not {self.nightly_via!r}"
            )
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingsError(f"{SETTINGS[name].env} must be ≥ 1, not {value}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise SettingsError(
                f"AI_PIPELINE_MIN_CONFIDENCE must be between 0 and 1, not {self.min_confidence}"
            )
        if self.llm_timeout_seconds <= 0:
            raise SettingsError("AI_PIPELINE_LLM_TIMEOUT must be > 0")
        for budget in ("run_budget_usd", "run_budget_tokens"):
            if (getattr(self, budget) or 0) < 0:
                raise SettingsError(f"{SETTINGS[budget].env} must be ≥ 0")
        if self.db_retry_seconds < 0 or self.claim_wait_seconds < 0:
            raise SettingsError(
                "AI_PIPELINE_DB_RETRY_SECONDS and AI_PIPELINE_CLAIM_WAIT_SECONDS must be ≥ 0"
            )
        public = urlsplit(self.public_url or "http://x")
        if public.scheme not in ("http", "https") or not public.netloc or public.query:
            raise SettingsError(
                f"AI_PIPELINE_PUBLIC_URL must be an http(s) URL, not {self.public_url!r}"
            )


# The settings that must be at least 1 when set (counts, sizes, the lease and the sensor interval).
_AT_LEAST_ONE = (
    "llm_concurrency",
    "global_llm_concurrency",
    "documents_per_run",
    "retry_budget",
    "lease_seconds",
    "backfill_run_size",
    "backfill_documents",
    "sensor_max_files",
    "sensor_interval_seconds",
    "batch_api_interval_seconds",
    "section_chars",
    "completion_reserve_tokens",
)


def default_database_url(analysis: str | None = None) -> str:
    """The embedded default: a SQLite file beside the Dagster instance (``DAGSTER_HOME``); an
    analysis other than the default has its own (``ai_pipeline.<name>.sqlite``)."""
    home = Path(os.environ.get("DAGSTER_HOME") or os.getcwd()).resolve()
    if analysis in (None, analyses.DEFAULT.name):
        return f"sqlite:///{home / RESULTS_DATABASE_FILE}"
    safe = "".join(c if c.isalnum() or c in "_." else "_" for c in str(analysis))
    return f"sqlite:///{home / RESULTS_DATABASE_FILE.replace('.sqlite', f'.{safe}.sqlite')}"


def _parse(setting: Setting, raw: str) -> Any:
    kind = setting.kind or (type(setting.default) if setting.default is not None else str)
    try:
        return kind(raw)
    except ValueError as e:
        raise SettingsError(
            f"{setting.env}={raw!r} is not a valid {kind.__name__} ({setting.help})"
        ) from e
