"""Unit tests of ai_pipeline.settings: defaults, the environment, explicit overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_pipeline.declaration import DEFAULT_MIN_CONFIDENCE
from ai_pipeline.documents import DEFAULT_MAX_DOCUMENT_BYTES
from ai_pipeline.settings import SETTINGS, Settings, SettingsError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting's environment variable is set unless a test sets it."""
    for setting in SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)


def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With nothing set, every setting has its documented default."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    s = Settings.load()
    assert s == Settings(
        inbox=None,
        database_url=f"sqlite:///{tmp_path.resolve() / 'ai_pipeline.sqlite'}",
        base_url=None,
        analysis="document_analysis",
        model="gpt-4o-mini",
        llm_concurrency=8,
        llm_timeout_seconds=60.0,
        llm_requests_per_minute=0,
        api_key_file=None,
        api_key_command=None,
        documents_per_run=None,
        max_document_bytes=DEFAULT_MAX_DOCUMENT_BYTES,
        min_confidence=DEFAULT_MIN_CONFIDENCE,
        webhook_url=None,
        retry_budget=3,
        price_per_1k_prompt_tokens=0.00015,
        price_per_1k_completion_tokens=0.0006,
        settle_seconds=1.0,
        db_retry_seconds=60.0,
        lease_seconds=60.0,
        claim_wait_seconds=600.0,
        sensor_interval_seconds=30,
        batch_api_interval_seconds=120,
        sensor_max_files=500,
        backfill_run_size=None,
        backfill_documents=None,
        nightly_cron="0 2 * * *",
        timezone="UTC",
        nightly_via="sync",
        section_chars=6000,
        prices_file=None,
        run_budget_usd=None,
        run_budget_tokens=None,
        completion_reserve_tokens=1024,
        json_log=None,
        tenants_file=None,
        dagster_url="http://127.0.0.1:3000",
    )
    assert s.max_document_bytes == 5 * 1024 * 1024
    assert s.min_confidence == 0.75


def test_settings_table_covers_every_field() -> None:
    """Every Settings field has an entry (with an environment variable) in SETTINGS."""
    assert set(SETTINGS) == set(Settings.__dataclass_fields__)
    assert all(s.env.isupper() and s.help for s in SETTINGS.values())


def test_environment_overrides_defaults_with_parsed_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment variables override the defaults and are parsed to the default's type."""
    monkeypatch.setenv("AI_PIPELINE_INBOX", "/data/inbox")
    monkeypatch.setenv("AI_PIPELINE_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9999/v1")
    monkeypatch.setenv("AI_PIPELINE_MODEL", "sim-analyst-1")
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "3")
    monkeypatch.setenv("AI_PIPELINE_LLM_TIMEOUT", "2.5")
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "7")
    monkeypatch.setenv("AI_PIPELINE_MAX_DOCUMENT_BYTES", "1024")
    monkeypatch.setenv("AI_PIPELINE_MIN_CONFIDENCE", "0.6")
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "0")
    s = Settings.load()
    assert (s.inbox, s.database_url, s.base_url, s.model) == (
        "/data/inbox",
        "postgresql://u@h/db",
        "http://127.0.0.1:9999/v1",
        "sim-analyst-1",
    )
    assert (s.llm_concurrency, s.documents_per_run, s.max_document_bytes) == (3, 7, 1024)
    assert (s.llm_timeout_seconds, s.min_confidence, s.settle_seconds) == (2.5, 0.6, 0.0)
    assert isinstance(s.llm_concurrency, int) and isinstance(s.llm_timeout_seconds, float)
    assert isinstance(s.settle_seconds, float)


def test_empty_environment_variable_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set to the empty string is treated as unset."""
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "")
    monkeypatch.setenv("AI_PIPELINE_MODEL", "")
    s = Settings.load()
    assert (s.llm_concurrency, s.model) == (8, "gpt-4o-mini")


def test_explicit_override_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value passed to load() wins over the environment; None falls through to it."""
    monkeypatch.setenv("AI_PIPELINE_MODEL", "from-env")
    monkeypatch.setenv("AI_PIPELINE_DOCUMENTS_PER_RUN", "7")
    monkeypatch.setenv("AI_PIPELINE_MIN_CONFIDENCE", "0.6")
    s = Settings.load(model="from-config", documents_per_run=2, min_confidence=None)
    assert (s.model, s.documents_per_run, s.min_confidence) == ("from-config", 2, 0.6)


def test_override_of_zero_is_not_treated_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A falsy explicit value such as 0.0 still overrides the environment."""
    monkeypatch.setenv("AI_PIPELINE_MIN_CONFIDENCE", "0.9")
    monkeypatch.setenv("AI_PIPELINE_SETTLE_SECONDS", "5")
    s = Settings.load(min_confidence=0.0, settle_seconds=0.0)
    assert (s.min_confidence, s.settle_seconds) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("env", "raw", "kind"),
    [
        ("AI_PIPELINE_LLM_CONCURRENCY", "eight", "int"),
        ("AI_PIPELINE_DOCUMENTS_PER_RUN", "2.5", "int"),
        ("AI_PIPELINE_MAX_DOCUMENT_BYTES", "5MB", "int"),
        ("AI_PIPELINE_LLM_TIMEOUT", "soon", "float"),
        ("AI_PIPELINE_MIN_CONFIDENCE", "high", "float"),
    ],
)
def test_invalid_number_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, raw: str, kind: str
) -> None:
    """A value that does not parse raises SettingsError naming the variable, value and type."""
    monkeypatch.setenv(env, raw)
    with pytest.raises(SettingsError) as info:
        Settings.load()
    message = str(info.value)
    assert message.startswith(f"{env}={raw!r} is not a valid {kind}")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "nan"])
def test_min_confidence_out_of_range_from_env(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    """A min_confidence outside 0..1 in the environment raises SettingsError naming it."""
    monkeypatch.setenv("AI_PIPELINE_MIN_CONFIDENCE", raw)
    with pytest.raises(SettingsError, match="AI_PIPELINE_MIN_CONFIDENCE must be between 0 and 1"):
        Settings.load()


@pytest.mark.parametrize("value", [1.01, -0.5])
def test_min_confidence_out_of_range_from_override(value: float) -> None:
    """An explicit min_confidence outside 0..1 is refused too."""
    with pytest.raises(SettingsError, match=f"MIN_CONFIDENCE must be between 0 and 1, not {value}"):
        Settings.load(min_confidence=value)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_min_confidence_bounds_are_allowed(value: float) -> None:
    """0 and 1 are valid thresholds."""
    assert Settings.load(min_confidence=value).min_confidence == value


@pytest.mark.parametrize(
    ("overrides", "env"),
    [
        ({"llm_concurrency": 0}, "AI_PIPELINE_LLM_CONCURRENCY"),
        ({"global_llm_concurrency": 0}, "AI_PIPELINE_GLOBAL_LLM_CONCURRENCY"),
        ({"global_llm_concurrency": -2}, "AI_PIPELINE_GLOBAL_LLM_CONCURRENCY"),
        ({"documents_per_run": -1}, "AI_PIPELINE_DOCUMENTS_PER_RUN"),
        ({"llm_timeout_seconds": 0.0}, "AI_PIPELINE_LLM_TIMEOUT"),
    ],
)
def test_other_invalid_values_name_the_variable(overrides: dict[str, object], env: str) -> None:
    """Concurrency, batch size and timeout below their minimum raise SettingsError naming them."""
    with pytest.raises(SettingsError, match=env):
        Settings.load(**overrides)


def test_settings_are_read_at_load_time_not_import_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed environment is seen by the next load() without reloading the module."""
    monkeypatch.setenv("AI_PIPELINE_MODEL", "first")
    assert Settings.load().model == "first"
    monkeypatch.setenv("AI_PIPELINE_MODEL", "second")
    assert Settings.load().model == "second"


def test_budgets_are_typed_and_never_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AI_PIPELINE_RUN_BUDGET_USD", "2.5")
    monkeypatch.setenv("AI_PIPELINE_RUN_BUDGET_TOKENS", "100000")
    s = Settings.load()
    assert (s.run_budget_usd, s.run_budget_tokens) == (2.5, 100_000)
    monkeypatch.setenv("AI_PIPELINE_RUN_BUDGET_TOKENS", "lots")
    with pytest.raises(SettingsError, match="AI_PIPELINE_RUN_BUDGET_TOKENS"):
        Settings.load()
    monkeypatch.setenv("AI_PIPELINE_RUN_BUDGET_TOKENS", "-1")
    with pytest.raises(SettingsError, match="≥ 0"):
        Settings.load()


def test_the_global_llm_cap_is_off_unless_set_and_must_be_a_whole_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, there is no global cap; set, it is a count; not a whole number, one SettingsError
    names the variable."""
    monkeypatch.delenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", raising=False)
    assert Settings.load().global_llm_concurrency is None
    monkeypatch.setenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", "4")
    assert Settings.load().global_llm_concurrency == 4
    for wrong in ("four", "2.5"):
        monkeypatch.setenv("AI_PIPELINE_GLOBAL_LLM_CONCURRENCY", wrong)
        with pytest.raises(SettingsError, match=f"AI_PIPELINE_GLOBAL_LLM_CONCURRENCY='{wrong}'"):
            Settings.load()
