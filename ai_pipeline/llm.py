"""The LLM client: one analysis call over the openai SDK, and the classification of its failures.

The SDK's own retries are off (``max_retries=0``): this module decides what is retried, so that a
retry always reuses the same task id and ``Idempotency-Key`` and is logged. Every exception the SDK
can raise is mapped to a category of ``ai_pipeline.failures`` by ``classify``.

Works with any OpenAI-compatible endpoint by ``base_url`` (OpenAI, Azure OpenAI's v1 endpoint,
vLLM, Ollama, llama.cpp, the bundled simulator).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import openai

from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.prompts import ANALYSIS, Prompt

NETWORK_STATUSES = frozenset({408, 500, 502, 503, 504})


@dataclass(frozen=True)
class LLMReply:
    """What the model answered for one task, as stored in the task's checkpoint."""

    content: str
    finish_reason: str | None
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: int

    def to_payload(self) -> dict:
        return {
            "content": self.content,
            "finish_reason": self.finish_reason,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_ms": self.latency_ms,
        }

    @classmethod
    def from_payload(cls, payload: dict) -> LLMReply:
        return cls(**{k: payload.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def _status_category(status: int) -> Category:
    if status in (401, 403):
        return Category.AUTH_FAILED
    if status == 429:
        return Category.RATE_LIMIT_EXCEEDED
    if status == 409:
        # The endpoint already has a request under this idempotency key (still in flight or done
        # with another body): not ours to resolve automatically, and never a reason to re-send.
        return Category.DUPLICATE_EXECUTION
    if status in NETWORK_STATUSES or status >= 500:
        return Category.NETWORK_TIMEOUT
    return Category.INPUT_QUALITY_ISSUE


def classify(error: BaseException) -> Category:
    """The category of an exception raised by the openai SDK."""
    if isinstance(error, ClassifiedError):
        return error.category
    if isinstance(error, openai.APIStatusError):
        return _status_category(error.status_code)
    # APITimeoutError is a subclass of APIConnectionError: both are the network layer.
    if isinstance(error, (openai.APIConnectionError, TimeoutError, ConnectionError)):
        return Category.NETWORK_TIMEOUT
    if isinstance(error, (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)):
        return Category.SCHEMA_VIOLATION
    if isinstance(error, openai.APIResponseValidationError):
        return Category.SCHEMA_VIOLATION
    return Category.INTERNAL_ERROR


def describe(error: BaseException) -> str:
    """A one-line description of an SDK error that never includes request headers or keys."""
    if isinstance(error, openai.APIStatusError):
        message = error.message if isinstance(error.message, str) else str(error.message)
        return f"HTTP {error.status_code}: {message}"[:500]
    return f"{type(error).__name__}: {error}"[:500]


class LLMClient:
    """Async analysis calls against one OpenAI-compatible endpoint."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout_seconds: float = 60.0,
        max_concurrency: int = 8,
        prompt: Prompt = ANALYSIS,
    ):
        self.model = model
        self.prompt = prompt
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_seconds
        )

    async def analyse(self, task_id: str, text: str) -> LLMReply:
        """One chat completion for ``text``; raises ClassifiedError on any failure."""
        async with self._semaphore:
            started = time.monotonic()
            try:
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=self.prompt.messages(text),  # type: ignore[arg-type]
                    temperature=0,
                    response_format={"type": "json_object"},
                    extra_headers={"Idempotency-Key": task_id},
                )
            except Exception as e:
                raise ClassifiedError(classify(e), describe(e)) from e
        choice = completion.choices[0] if completion.choices else None
        if choice is None:
            raise ClassifiedError(Category.SCHEMA_VIOLATION, "the reply has no choices")
        usage = completion.usage
        return LLMReply(
            content=choice.message.content or "",
            finish_reason=choice.finish_reason,
            model=completion.model or self.model,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            latency_ms=int((time.monotonic() - started) * 1000),
        )

    async def aclose(self) -> None:
        await self._client.close()
