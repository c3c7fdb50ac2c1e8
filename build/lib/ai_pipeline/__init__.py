"""ai_pipeline: idempotent, retry-safe LLM analysis of document collections on Dagster."""

__version__ = "0.1.0"
