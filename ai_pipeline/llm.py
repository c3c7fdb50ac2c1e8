"""The LLM client: analysis calls over the openai SDK, and what happens when one fails.

The SDK's own retries are off (``max_retries=0``): every call goes through the one retry policy of
``ai_pipeline.retry`` (network faults retried twice, a 429 waited out once a minute), and every
retry reuses the same task id and ``Idempotency-Key``. What this client adds:

- classification of every openai exception into a category, and a description of it without
  headers or keys (``ai_pipeline.llm_errors``);
- AUTH_FAILED (401/403): refresh the credentials once — re-read the key from its source — and
  resubmit; if that fails too the circuit opens and every other call of the run fails fast, unsent,
  as CONFIGURATION (the run's fault, not the document's). Until a call has gone through, calls go
  one at a time, so bad credentials cost at most two requests;
- CONFIGURATION (a model the endpoint does not have, a parameter it refuses, an address where
  nothing listens): the circuit opens at the first such reply, with a message naming the setting
  (``ai_pipeline.misconfiguration``); the calls already in flight are all the run sends;
- a shared limiter (requests per minute, calls in flight, optionally a cap on calls in flight
  across every run and host) that keeps a run from causing 429s in the first place
  (``ai_pipeline.llm_access``: the key in use, the limits, the budget a request reserves from).

Only the document whose call failed waits; the others of the batch go on. Works with any
OpenAI-compatible endpoint by ``base_url`` (OpenAI, Azure OpenAI, vLLM, Ollama, the simulator).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace

from ai_pipeline.declaration import ModelSettings
from ai_pipeline.endpoints import request_parameters
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm_access import (
    Credentials,
    GlobalCap,
    Meter,
    RateLimiter,
    billed_details,
    limit_of,
)
from ai_pipeline.llm_errors import attempt_failure, classify, describe
from ai_pipeline.misconfiguration import connection_refused, refused_message, unreachable_message
from ai_pipeline.retry import AttemptFailure, Log, NullLog, Retrier, RetryHook
from ai_pipeline.tracing import mark_failed, span

MAX_NETWORK_PROBES = 3
# The chat messages of one call, as the analysis's declaration writes them.
Messages = Sequence[Mapping[str, str]]
JSON_MODE: Mapping[str, Any] = {"type": "json_object"}


@dataclass(frozen=True)
class _Request:
    """What one call sends beside the model: its messages and the reply's format."""

    messages: Messages
    response_format: Mapping[str, Any]
    settings: ModelSettings


@dataclass(frozen=True)
class LLMReply:
    """What the model answered for one task, as stored in the task's checkpoint."""

    content: str
    finish_reason: str | None
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: int
    # What the model said instead of an answer, when the endpoint reports a refusal apart
    # (Structured Outputs: ``message.refusal``, the content then empty).
    refusal: str | None = None

    def to_payload(self) -> dict:
        return {
            "content": self.content,
            "refusal": self.refusal,
            "finish_reason": self.finish_reason,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_ms": self.latency_ms,
        }

    @classmethod
    def from_payload(cls, payload: dict) -> LLMReply:
        return cls(**{k: payload.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def chat_request(
    model: str,
    messages: Messages,
    response_format: Mapping[str, Any] | None,
    settings: ModelSettings,
    *,
    reserved_completion_tokens: int | None = None,
) -> dict[str, Any]:
    """The body of one chat completion request, as every path sends it (a call, a Batch API
    line): the model, the messages, the reply's format (JSON mode when None), and the
    temperature, output limit and reasoning effort that ``settings`` ask for and the model
    accepts (``ai_pipeline.endpoints``).

    Every reply is bounded; under a budget by the completion tokens reserved for it
    (``reserved_completion_tokens``): what it costs then stays within the reservation."""
    limit = settings.max_output_tokens
    if reserved_completion_tokens is not None:
        limit = (
            reserved_completion_tokens if limit is None else min(limit, reserved_completion_tokens)
        )
    parameters = request_parameters(
        model,
        temperature=settings.temperature,
        max_output_tokens=limit,
        reasoning_effort=settings.reasoning_effort,
        limit_parameter=settings.limit_parameter,
        send_temperature=settings.send_temperature,
    )
    return {
        "model": model,
        "messages": [dict(m) for m in messages],
        "response_format": dict(response_format or JSON_MODE),
        **parameters,
    }


def reply_of(completion: Any, model: str, latency_ms: int) -> LLMReply:
    """What a chat completion (the SDK's ``ChatCompletion``) answered, as a checkpoint stores
    it; raises SCHEMA_VIOLATION when it has no choices. ``model`` stands in for a reply that
    does not name its own."""
    usage = completion.usage
    choice = completion.choices[0] if completion.choices else None
    if choice is None:
        raise ClassifiedError(Category.SCHEMA_VIOLATION, "the reply has no choices")
    return LLMReply(
        content=choice.message.content or "",
        refusal=getattr(choice.message, "refusal", None) or None,
        finish_reason=choice.finish_reason,
        model=completion.model or model,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        latency_ms=latency_ms,
    )


class RunStopped(BaseException):  # noqa: N818 - a stop, like asyncio.CancelledError, not an error
    """The run is stopping: no new call goes out. Raised past every retry and failure handler,
    as a cancellation is, so the document ends where it is, neither failed nor done."""


class LLMClient:
    """Async analysis calls against one OpenAI-compatible endpoint, for one run."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | Credentials,
        model: str,
        timeout_seconds: float = 60.0,
        max_concurrency: int = 8,
        requests_per_minute: int | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_failure: RetryHook | None = None,
        meter: Meter | None = None,
        global_cap: GlobalCap | None = None,
    ):
        self.model = model
        self.meter = meter
        self.global_cap = global_cap
        self.credentials = api_key if isinstance(api_key, Credentials) else Credentials(api_key)
        self.on_failure = on_failure
        self._retrier = Retrier(sleep=sleep, clock=clock)
        self.max_concurrency = max_concurrency
        self.timeout_seconds = timeout_seconds
        self.stopping = False
        self._in_flight: Counter[str] = Counter()
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._limiter = RateLimiter(requests_per_minute, clock=clock, sleep=sleep)
        self._probe_lock = asyncio.Lock()
        self._proven = False
        self._probe_failures = 0
        self._circuit: ClassifiedError | None = None
        # Cleared from a 401/403 until its refresh settles (a fresh key, or the circuit open):
        # calls waiting for a slot do not go out meanwhile with a key just refused.
        self._auth_settled = asyncio.Event()
        self._auth_settled.set()
        self._answered = False  # whether any call of the run got an HTTP reply, even an error
        self.base_url = base_url
        import openai
        from openai.types.chat import ChatCompletion

        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=self.credentials.key,
            max_retries=0,
            timeout=timeout_seconds,
        )
        self._completion = ChatCompletion

    @property
    def circuit_open(self) -> bool:
        return self._circuit is not None

    @property
    def circuit(self) -> ClassifiedError | None:
        """Why the run stopped calling (None: it did not)."""
        return self._circuit

    @property
    def in_flight(self) -> set[str]:
        """The task ids whose request has been sent and whose reply is not yet handed back."""
        return set(self._in_flight)

    def report_failures_to(self, hook: RetryHook) -> None:
        """Where each failed request the client retries or waits out is reported (the analyser
        records it as an event), unless the client was built with a hook of its own."""
        if self.on_failure is None:
            self.on_failure = hook

    def stop(self) -> None:
        """Send no new request (each raises ``RunStopped``); those in flight go on to their reply:
        it is paid for, so it is handed back to be checkpointed."""
        self.stopping = True

    def _refuse_if_stopping(self, task_id: str) -> None:
        if self.stopping:
            raise RunStopped(f"not sent: the run is stopping ({task_id})")

    async def analyse(
        self,
        task_id: str,
        messages: Messages,
        *,
        response_format: Mapping[str, Any] | None = None,
        settings: ModelSettings | None = None,
        log: Log | None = None,
    ) -> LLMReply:
        """One call under the retry policy; raises ClassifiedError when it cannot be had.
        ``response_format`` is sent as given (JSON mode when None); the temperature, output limit
        and reasoning effort follow ``settings`` and what the model accepts."""
        request = _Request(messages, response_format or JSON_MODE, settings or ModelSettings())
        log = log or NullLog()
        self._fail_fast_if_open()
        if not self._proven:
            # Until one call has gone through, calls go one at a time: with bad credentials the
            # whole run then costs two requests (the first and its resubmission), not N.
            async with self._probe_lock:
                self._fail_fast_if_open()
                if not self._proven:
                    try:
                        reply = await self._with_policy(task_id, request, log)
                    except ClassifiedError as e:
                        # Only an answer proves the credentials: after a network failure the next
                        # call probes again, but not forever — an endpoint that stays unreachable
                        # gains nothing from calls made one at a time.
                        if e.category == Category.NETWORK_TIMEOUT:
                            self._probe_failures += 1
                            self._stop_if_unreachable(e, log)
                        if e.category not in (Category.AUTH_FAILED, Category.CONFIGURATION) and (
                            e.category != Category.NETWORK_TIMEOUT
                            or self._probe_failures >= MAX_NETWORK_PROBES
                        ):
                            self._proven = True
                        raise
                    self._proven = True
                    return reply
        return await self._with_policy(task_id, request, log)

    def _stop_if_unreachable(self, error: ClassifiedError, log: Log) -> None:
        """A probe that failed on the network: when no call of the run ever had an answer and
        the connection was refused (not timed out), the address is wrong, not the network slow:
        the circuit opens with CONFIGURATION. An outage that times out stays NETWORK_TIMEOUT."""
        if self._answered or not connection_refused(error.__cause__):
            return
        self._circuit = ClassifiedError(Category.CONFIGURATION, unreachable_message(self.base_url))
        log.error(f"[CIRCUIT] CONFIGURATION: {self._circuit.message}: open, the run stops calling")
        raise self._circuit from error

    def _fail_fast_if_open(self) -> None:
        """Once the circuit is open no call is sent: a fault of the run's settings (a key, a
        model, a parameter), not of the document, which waits, unsent, for the setting's fix."""
        if self._circuit is not None:
            raise ClassifiedError(
                Category.CONFIGURATION,
                f"not sent: the circuit is open after {self._circuit.category.value} "
                f"{self._circuit.message}",
            )

    async def _with_policy(self, task_id: str, request: _Request, log: Log) -> LLMReply:
        refreshed = False
        generation = self.credentials.generation
        attempt = 0

        async def send() -> LLMReply:
            nonlocal generation, attempt
            generation = self.credentials.generation
            attempt += 1
            return await self._send(task_id, request, attempt)

        async def recover(failure: AttemptFailure, attempt: int) -> AttemptFailure | None:
            """After a 401/403: refresh the credentials once and resubmit, else open the circuit."""
            if failure.category == Category.CONFIGURATION:
                return self._open_for_setting(task_id, failure, request, log)
            if failure.category != Category.AUTH_FAILED:
                return failure
            try:
                return await refresh_or_open(failure)
            finally:
                self._auth_settled.set()

        async def refresh_or_open(failure: AttemptFailure) -> AttemptFailure | None:
            nonlocal refreshed
            if refreshed:
                failure = failure.amended(
                    "; refused again after refreshing the credentials: check the API key "
                    f"({self.credentials.source})"
                )
            else:
                refreshed = True
                if await self.credentials.refresh(generation):
                    self._client = self._client.with_options(api_key=self.credentials.key)
                    log.warning(
                        f"[AUTH for TASK:{task_id}] {failure.message}; credentials refreshed, "
                        "resubmitting under the same task id"
                    )
                    if self.on_failure is not None:
                        self.on_failure(
                            task_id, failure.category, 1, f"{failure.message}; refreshed"
                        )
                    return None
                failure = failure.amended(
                    f"; no fresh credentials at the source: check the API key "
                    f"({self.credentials.source})"
                )
            self._circuit = ClassifiedError(failure.category, failure.message)
            log.error(
                f"[CIRCUIT for TASK:{task_id}] {failure.message}: open, the run stops calling"
            )
            return failure

        return await self._retrier.call(
            task_id, send, attempt_failure, log=log, on_retry=self.on_failure, recover=recover
        )

    def _open_for_setting(
        self, task_id: str, failure: AttemptFailure, request: _Request, log: Log
    ) -> AttemptFailure:
        """A reply that refuses a setting: the same request fails for every document, so the
        circuit opens, with a message that says what to change."""
        settings = request.settings
        sent = {
            "model": self.model,
            "response_format": request.response_format.get("type"),
            **request_parameters(
                self.model,
                temperature=settings.temperature,
                max_output_tokens=settings.max_output_tokens,
                reasoning_effort=settings.reasoning_effort,
                limit_parameter=settings.limit_parameter,
                send_temperature=settings.send_temperature,
            ),
        }
        status = getattr(failure.cause, "status_code", None)
        if failure.cause is not None and isinstance(status, int):
            failure = replace(failure, message=refused_message(failure.cause, status, sent))
        if self._circuit is None:
            self._circuit = ClassifiedError(failure.category, failure.message)
            log.error(
                f"[CIRCUIT for TASK:{task_id}] {failure.category.value}: {failure.message}: open, "
                "the run stops calling"
            )
        return failure

    async def _send(self, task_id: str, request: _Request, attempt: int = 1) -> LLMReply:
        with span("llm.attempt", task_id=task_id, **{"llm.model": self.model, "attempt": attempt}):
            return await self._attempt(task_id, request)

    async def _attempt(self, task_id: str, request: _Request) -> LLMReply:
        current = trace.get_current_span()
        try:
            reply = await self._request(task_id, request)
        except BaseException as e:
            if isinstance(e, Exception):
                category = classify(e)
                mark_failed(current, category, describe(e))
                if getattr(e, "status_code", None) is not None:
                    self._answered = True  # an error reply is an answer: the address is right
                    if category == Category.AUTH_FAILED:
                        self._auth_settled.clear()
            raise
        self._answered = True
        current.set_attribute("llm.prompt_tokens", reply.prompt_tokens or 0)
        current.set_attribute("llm.completion_tokens", reply.completion_tokens or 0)
        return reply

    async def _request(self, task_id: str, request: _Request) -> LLMReply:
        messages = request.messages
        self._refuse_if_stopping(task_id)
        await self._limiter.acquire()
        cap = self.global_cap.hold() if self.global_cap else nullcontext()
        async with self._semaphore, cap:
            self._refuse_if_stopping(task_id)
            if not self._auth_settled.is_set():
                with suppress(TimeoutError):  # a refresh never settled (cancelled): go on
                    await asyncio.wait_for(self._auth_settled.wait(), self.timeout_seconds)
            self._fail_fast_if_open()
            reserved = self.meter.max_completion_tokens if self.meter else None
            body = chat_request(
                self.model,
                messages,
                request.response_format,
                request.settings,
                reserved_completion_tokens=reserved,
            )
            # Reserved only while in flight (a call waiting for a slot holds no budget), for the
            # limit the request carries: a reasoning model's counts its reasoning too.
            reservation = (
                self.meter.reserve(
                    task_id,
                    self.model,
                    messages,
                    completion_tokens=limit_of(body),
                    response_format=request.response_format,
                )
                if self.meter
                else None
            )
            # In flight from here until the reply is handed back: a run that stops meanwhile lets
            # it come in, and checkpoints it (``ai_pipeline.batch``). A call its budget refused
            # never was.
            self._in_flight[task_id] += 1
            started = time.monotonic()
            try:
                # The SDK's own POST, as ``chat.completions.create`` makes it, without the walk
                # that method takes over the body to drop unset arguments and rename fields:
                # ``body`` is JSON already, and the walk cost about 0.5 ms of CPU per request,
                # 30 times encoding it (``benchmarks/README.md``). Authenticated as ``create``
                # does: by the API key.
                completion = await self._client.post(
                    "/chat/completions",
                    body=body,
                    cast_to=self._completion,
                    options={
                        "headers": {"Idempotency-Key": task_id},
                        "security": {"bearer_auth": True},
                    },
                )
            except BaseException as e:  # a cancelled call releases its reservation too
                self._landed(task_id)
                if self.meter is not None and reservation is not None:
                    cancelled = isinstance(e, asyncio.CancelledError)
                    self.meter.settle(
                        reservation, outcome="CANCELLED" if cancelled else classify(e).value
                    )
                raise
        latency_ms = int((time.monotonic() - started) * 1000)
        usage = completion.usage
        prompt_tokens = usage.prompt_tokens if usage else None
        completion_tokens = usage.completion_tokens if usage else None
        cached_tokens, reasoning_tokens = billed_details(usage)
        model = completion.model or self.model
        try:
            # The call waiting for this slot goes out first, before this reply's bookkeeping
            # (its usage, its checkpoint, its document's results) holds the event loop: that
            # kept every freed slot idle for ~10 ms (``benchmarks/README.md``).
            await asyncio.sleep(0)
        finally:
            self._landed(task_id)
            if self.meter is not None and reservation is not None:
                # Every reply's usage counts, whatever its checks say of it later — a reply
                # whose run is cancelled at this point too.
                self.meter.settle(
                    reservation,
                    model=model,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    usage_reported=usage is not None,
                    cached_tokens=cached_tokens,
                    reasoning_tokens=reasoning_tokens,
                )
        return reply_of(completion, self.model, latency_ms)

    def _landed(self, task_id: str) -> None:
        """The reply (or the failure) of a call in flight is in: from here on nothing suspends
        before the caller has it."""
        self._in_flight[task_id] -= 1
        if not self._in_flight[task_id]:
            del self._in_flight[task_id]

    async def aclose(self) -> None:
        await self._client.close()
