"""The LLM client: analysis calls over the openai SDK, and what happens when one fails.

The SDK's own retries are off (``max_retries=0``): every call goes through the one retry policy of
``ai_pipeline.retry`` (network faults retried twice, a 429 waited out once a minute), and every
retry reuses the same task id and ``Idempotency-Key``. What this client adds:

- classification of every openai exception into a category (``classify``), and a description of it
  without headers or keys (``describe``);
- AUTH_FAILED (401/403): refresh the credentials once — re-read the key from its source — and
  resubmit; if that fails too the circuit opens and every other call of the run fails fast. Until a
  call has gone through, calls go one at a time, so bad credentials cost at most two requests;
- CONFIGURATION (a model the endpoint does not have, a parameter it refuses, an address where
  nothing listens): the circuit opens at the first such reply, with a message naming the setting
  (``ai_pipeline.misconfiguration``); the calls already in flight are all the run sends;
- a shared limiter (requests per minute, calls in flight) that keeps a run from causing 429s in the
  first place.

Only the document whose call failed waits; the others of the batch go on. Works with any
OpenAI-compatible endpoint by ``base_url`` (OpenAI, Azure OpenAI, vLLM, Ollama, the simulator).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import trace

from ai_pipeline.declaration import ModelSettings
from ai_pipeline.endpoints import request_parameters
from ai_pipeline.failures import Category, ClassifiedError, category_for_reply
from ai_pipeline.misconfiguration import connection_refused, refused_message, unreachable_message
from ai_pipeline.redaction import redact, register_secret
from ai_pipeline.retry import AttemptFailure, Log, NullLog, Retrier, RetryHook, parse_retry_after
from ai_pipeline.tracing import mark_failed, span


class Meter(Protocol):
    """What a client reports its spending to (``ai_pipeline.spend.Meter``): a reservation before
    each request (raising ClassifiedError when none can be had), its usage after it, and the
    completion limit a request must carry (None: none)."""

    @property
    def max_completion_tokens(self) -> int | None: ...

    def reserve(
        self,
        task_id: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        completion_tokens: int | None = ...,
        response_format: Mapping[str, Any] | None = ...,
    ) -> Any: ...

    def settle(
        self,
        reservation: Any,
        *,
        outcome: str = ...,
        model: str | None = ...,
        prompt_tokens: int | None = ...,
        completion_tokens: int | None = ...,
        usage_reported: bool = ...,
        cached_tokens: int | None = ...,
        reasoning_tokens: int | None = ...,
    ) -> Any: ...


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


def classify(error: BaseException) -> Category:
    """The category of an exception raised by the openai SDK."""
    import openai  # the SDK is imported where it is used: most processes never call the LLM

    if isinstance(error, ClassifiedError):
        return error.category
    if isinstance(error, openai.APIStatusError):
        status = getattr(error, "status_code", None)
        if isinstance(status, int) and 400 <= status <= 599:
            return category_for_reply(
                status, code=_text(error, "code"), param=_text(error, "param")
            )
        return Category.INTERNAL_ERROR
    # APITimeoutError is a subclass of APIConnectionError: both are the network layer.
    if isinstance(error, (openai.APIConnectionError, TimeoutError, ConnectionError)):
        return Category.NETWORK_TIMEOUT
    if isinstance(
        error,
        (
            openai.LengthFinishReasonError,
            openai.ContentFilterFinishReasonError,
            openai.APIResponseValidationError,
        ),
    ):
        return Category.SCHEMA_VIOLATION
    return Category.INTERNAL_ERROR


def _text(error: BaseException, name: str) -> str | None:
    """A field of the error object the endpoint sent (``code``, ``param``), when it is text."""
    value = getattr(error, name, None)
    return value if isinstance(value, str) else None


def describe(error: BaseException) -> str:
    """A one-line description of an SDK error, without request headers or keys."""
    import openai

    if isinstance(error, ClassifiedError):
        return redact(error.message)[:500]
    if isinstance(error, openai.APIStatusError):
        message = error.message if isinstance(error.message, str) else str(error.message)
        text = f"HTTP {error.status_code}: {message}"
    elif isinstance(error, openai.APITimeoutError):
        text = "APITimeoutError: the request timed out"
    else:
        text = f"{type(error).__name__}: {error}"
    return redact(text)[:500]


def attempt_failure(error: BaseException) -> AttemptFailure:
    """What one failed request of the SDK means to the retry policy: category, message, wait."""
    response = getattr(error, "response", None)
    return AttemptFailure(
        classify(error),
        describe(error),
        retry_after=parse_retry_after(getattr(response, "headers", None)),
        cause=error,
    )


def billed_details(usage: Any) -> tuple[int | None, int | None]:
    """The cached prompt tokens and the reasoning tokens of a reply's ``usage``
    (``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``);
    None for each the endpoint does not report (many OpenAI-compatible servers omit both)."""

    def count(details: Any, name: str) -> int | None:
        value = getattr(details, name, None) if details is not None else None
        return value if isinstance(value, int) else None

    if usage is None:
        return None, None
    return (
        count(getattr(usage, "prompt_tokens_details", None), "cached_tokens"),
        count(getattr(usage, "completion_tokens_details", None), "reasoning_tokens"),
    )


def _limit_of(parameters: Mapping[str, Any]) -> int | None:
    """The completion limit a request carries, under whichever name it sends it."""
    limit = parameters.get("max_completion_tokens", parameters.get("max_tokens"))
    return limit if isinstance(limit, int) else None


# --- credentials ---------------------------------------------------------------------------------


class Credentials:
    """The API key in use, and where a fresh one comes from when the endpoint refuses it.

    The source is, in order: a file (``key_file``: its stripped content), a command
    (``key_command``: its stripped standard output), or the environment variable ``key_env`` read
    again. Every key read is registered for redaction.
    """

    def __init__(
        self,
        key: str,
        *,
        key_file: str | None = None,
        key_command: str | None = None,
        key_env: str = "OPENAI_API_KEY",
    ):
        self.key = key
        self.generation = 0
        self.key_file = key_file
        self.key_command = key_command
        self.key_env = key_env
        self._lock = asyncio.Lock()
        register_secret(key)

    def read_source(self) -> str | None:
        if self.key_file:
            return Path(self.key_file).read_text("utf-8").strip() or None
        if self.key_command:
            out = subprocess.run(
                shlex.split(self.key_command), capture_output=True, text=True, timeout=30
            )
            return out.stdout.strip() if out.returncode == 0 else None
        return os.environ.get(self.key_env) or None

    async def refresh(self, seen_generation: int) -> bool:
        """Get a fresh key unless another call already did; False when no new key is to be had."""
        async with self._lock:
            if self.generation != seen_generation:
                return True
            try:
                fresh = await asyncio.to_thread(self.read_source)
            except (OSError, subprocess.SubprocessError):
                return False
            if not fresh or fresh == self.key:
                return False
            register_secret(fresh)
            self.key = fresh
            self.generation += 1
            return True


# --- limiting ------------------------------------------------------------------------------------


class RateLimiter:
    """At most ``per_minute`` requests in any rolling minute (None: no limit)."""

    def __init__(
        self,
        per_minute: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.per_minute = per_minute
        self._clock = clock
        self._sleep = sleep
        self._sent: deque[float] = deque()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if not self.per_minute:
            return
        async with self._lock:
            while True:
                now = self._clock()
                while self._sent and now - self._sent[0] >= 60.0:
                    self._sent.popleft()
                if len(self._sent) < self.per_minute:
                    self._sent.append(now)
                    return
                await self._sleep(60.0 - (now - self._sent[0]))


# --- the client ----------------------------------------------------------------------------------


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
    ):
        self.model = model
        self.meter = meter
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
        self._answered = False  # whether any call of the run got an HTTP reply, even an error
        self.base_url = base_url
        import openai

        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=self.credentials.key,
            max_retries=0,
            timeout=timeout_seconds,
        )

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
        if self._circuit is not None:
            raise ClassifiedError(
                self._circuit.category,
                f"not sent: the circuit is open after {self._circuit.message}",
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
            nonlocal refreshed
            if failure.category == Category.CONFIGURATION:
                return self._open_for_setting(task_id, failure, request, log)
            if failure.category != Category.AUTH_FAILED:
                return failure
            if refreshed:
                failure = failure.amended("; refused again after refreshing the credentials")
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
                failure = failure.amended("; no fresh credentials at the source")
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
                mark_failed(current, classify(e), describe(e))
                if getattr(e, "status_code", None) is not None:
                    self._answered = True  # an error reply is an answer: the address is right
            raise
        self._answered = True
        current.set_attribute("llm.prompt_tokens", reply.prompt_tokens or 0)
        current.set_attribute("llm.completion_tokens", reply.completion_tokens or 0)
        return reply

    async def _request(self, task_id: str, request: _Request) -> LLMReply:
        messages = request.messages
        self._refuse_if_stopping(task_id)
        await self._limiter.acquire()
        async with self._semaphore:
            self._refuse_if_stopping(task_id)
            # Every reply is bounded; under a budget by the completion tokens reserved for it:
            # what it costs then stays within the reservation.
            settings = request.settings
            limit = settings.max_output_tokens
            reserved = self.meter.max_completion_tokens if self.meter else None
            if reserved is not None:
                limit = reserved if limit is None else min(limit, reserved)
            parameters = request_parameters(
                self.model,
                temperature=settings.temperature,
                max_output_tokens=limit,
                reasoning_effort=settings.reasoning_effort,
                limit_parameter=settings.limit_parameter,
                send_temperature=settings.send_temperature,
            )
            # Reserved only while in flight (a call waiting for a slot holds no budget), for the
            # limit the request carries: a reasoning model's counts its reasoning too.
            reservation = (
                self.meter.reserve(
                    task_id,
                    self.model,
                    messages,
                    completion_tokens=_limit_of(parameters),
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
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type,call-overload]
                    response_format=request.response_format,  # type: ignore[arg-type]
                    extra_headers={"Idempotency-Key": task_id},
                    **parameters,
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
        choice = completion.choices[0] if completion.choices else None
        if choice is None:
            raise ClassifiedError(Category.SCHEMA_VIOLATION, "the reply has no choices")
        return LLMReply(
            content=choice.message.content or "",
            refusal=getattr(choice.message, "refusal", None) or None,
            finish_reason=choice.finish_reason,
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
        )

    def _landed(self, task_id: str) -> None:
        """The reply (or the failure) of a call in flight is in: from here on nothing suspends
        before the caller has it."""
        self._in_flight[task_id] -= 1
        if not self._in_flight[task_id]:
            del self._in_flight[task_id]

    async def aclose(self) -> None:
        await self._client.close()
