"""Usage as billed, read from the openai SDK's own usage objects: the cached prompt tokens and the
reasoning tokens, each absent or None on servers that do not report it."""

from __future__ import annotations

from openai.types import CompletionUsage
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails

from ai_pipeline.llm import billed_details


def test_cached_and_reasoning_tokens_are_read_from_the_sdks_usage() -> None:
    """OpenAI's usage block gives both; the SDK parses it into its detail objects."""
    usage = CompletionUsage(
        prompt_tokens=2006,
        completion_tokens=300,
        total_tokens=2306,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=1920, audio_tokens=0),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=128, audio_tokens=0),
    )
    assert billed_details(usage) == (1920, 128)


def test_details_a_server_leaves_out_or_nulls_are_none() -> None:
    """vLLM, Ollama and older servers send no details, or details with nulls: nothing is made up,
    and a reply without usage has none."""
    bare = CompletionUsage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    assert billed_details(bare) == (None, None)
    nulls = CompletionUsage.model_validate(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": None,
            "completion_tokens_details": {"reasoning_tokens": None},
        }
    )
    assert billed_details(nulls) == (None, None)
    cached_only = CompletionUsage.model_validate(
        {
            "prompt_tokens": 1300,
            "completion_tokens": 5,
            "total_tokens": 1305,
            "prompt_tokens_details": {"cached_tokens": 1152},
        }
    )
    assert billed_details(cached_only) == (1152, None)
    assert billed_details(None) == (None, None)
