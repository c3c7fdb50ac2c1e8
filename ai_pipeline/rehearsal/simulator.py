"""An OpenAI-compatible LLM simulator: the HTTP app, and ways to run and drive it.

What lives here:

* :func:`create_app`, the Starlette app serving ``/v1/models``, ``/v1/chat/completions``, the
  Batch API (``/v1/files``, ``/v1/batches``: :mod:`.batch_api`, each line answered as the chat
  endpoint answers its body) and the control API under ``/_sim/`` (stats, reset, faults,
  api-keys, batch-timing); how it reads a request and what
  its model replies (the analysis, or an answer to the request's JSON schema) comes from
  :mod:`.replies`, which faults it injects from :mod:`.faults`, and in OpenAI rules mode what it
  refuses, and the reasoning and cached tokens its usage reports, from :mod:`.openai_rules`;
* :class:`SimulatorServer`, which runs the app with uvicorn in a background thread (tests, the
  demo), :func:`serve`, which runs it in the foreground (the ``simulate-llm`` command), and
  :class:`SimulatorControl`, which drives a simulator running in another process over HTTP.

Only chat completions are counted in the stats' ``total`` and ``by_key``: listing models is not an
LLM call, and counting it would blur "how often was this task sent to the model", which is what
the counts are for. Batch lines are counted apart (``batch_lines_by_key``, by ``custom_id``), and
every endpoint's calls in ``by_endpoint`` (``files.create``, ``batches.list``, …).
The control API is unauthenticated on purpose: the simulator is a local rehearsal tool.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ai_pipeline.rehearsal import openai_rules
from ai_pipeline.rehearsal.analysis import estimate_tokens
from ai_pipeline.rehearsal.batch_api import APIError, BatchAPI
from ai_pipeline.rehearsal.faults import (
    CONTENT_FAULTS,
    FaultRule,
    SimulatorConfig,
    SimulatorState,
    _Admission,
)
from ai_pipeline.rehearsal.replies import (
    DOCUMENT_END,
    DOCUMENT_START,
    ChatRequest,
    Reply,
    completion_tokens,
    compose_reply,
    cut_to,
    extract_document,
    message_text,
    parse_chat_request,
)
from ai_pipeline.rehearsal.serving import (
    BackgroundServer,
    ConnectionReset,
    retry_after_header,
    serve_foreground,
)

__all__ = [
    "DOCUMENT_END",
    "DOCUMENT_START",
    "SimulatorControl",
    "SimulatorServer",
    "create_app",
    "extract_document",
    "serve",
]


# ---------------------------------------------------------------------------------------------
# HTTP app
# ---------------------------------------------------------------------------------------------


# The Batch API's timing, as ``POST /_sim/batch-timing`` sets it (``BatchAPI`` attributes).
TIMING = ("seconds", "window_seconds", "cancel_seconds")


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


_STATUS_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "The request was invalid."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", "permission_denied", "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    409: ("invalid_request_error", "conflict", "The request conflicts with another request."),
    422: ("invalid_request_error", "unprocessable_entity", "The request could not be processed."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded."),
    504: ("server_error", "gateway_timeout", "The upstream server timed out."),
}


def _status_error(status: int, note: str, headers: dict[str, str] | None = None) -> JSONResponse:
    answer = _status_answer(status, note, headers)
    return JSONResponse(answer.body, status_code=status, headers=answer.headers)


@dataclass(frozen=True)
class ChatAnswer:
    """A chat request's answer: its status and body (status None: the connection is dropped)."""

    status: int | None
    body: dict[str, Any] | None
    headers: dict[str, str] = field(default_factory=dict)


def _status_answer(status: int, note: str, headers: dict[str, str] | None = None) -> ChatAnswer:
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    type_, code, message = _STATUS_ERRORS.get(status, (default_type, None, "Request failed."))
    return ChatAnswer(status, _error_body(f"{message} ({note})", type_, code), dict(headers or {}))


def _within_limit(reply: Reply, thinking: int, limit: int | None) -> tuple[Reply, int]:
    """The reply and its reasoning tokens within the request's limit on completion tokens.

    As a real endpoint does, the reply stops at the limit (``finish_reason: "length"``); a
    reasoning model's thought counts first, and when it takes the whole limit nothing is said.
    """
    if limit is None or reply.content is None:
        return reply, thinking
    if thinking >= limit:
        return replace(reply, content="", finish_reason="length"), limit
    if estimate_tokens(reply.content) > limit - thinking:
        cut = cut_to(reply.content, limit - thinking)
        return replace(reply, content=cut, finish_reason="length"), thinking
    return reply, thinking


def create_app(config: SimulatorConfig) -> Starlette:
    """The simulator's ASGI app; its :class:`SimulatorState` is ``app.state.simulator``, its
    :class:`BatchAPI` ``app.state.batches``."""
    state = SimulatorState(config)
    batches = BatchAPI(
        seconds=config.batch_seconds,
        window_seconds=config.batch_window_seconds,
        cancel_seconds=config.batch_cancel_seconds,
    )

    served = config.served_models

    def model_card(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "simulator"}

    async def list_models(request: Request) -> Response:
        if not state.is_authorized(request.headers.get("authorization")):
            return _status_error(401, "the simulator does not accept this key")
        names = served if served is not None else (config.model,)
        return JSONResponse({"object": "list", "data": [model_card(name) for name in names]})

    async def retrieve_model(request: Request) -> Response:
        if not state.is_authorized(request.headers.get("authorization")):
            return _status_error(401, "the simulator does not accept this key")
        model_id = request.path_params["model"]
        if served is not None and not openai_rules.serves(
            model_id, served, config.served_model_suffix
        ):
            error = openai_rules.model_error(model_id)
            return JSONResponse(error.body(), status_code=error.status)
        return JSONResponse(model_card(model_id))

    def refused(chat: ChatRequest) -> openai_rules.RequestError | None:
        """What OpenAI rules mode, or the list of models served, refuses in this request."""
        model, suffix = chat.model, config.served_model_suffix
        tokens = estimate_tokens(chat.text) if chat.text is not None else 0
        if config.context_tokens is not None and tokens > config.context_tokens:
            return openai_rules.RequestError(
                400,
                f"This model's maximum context length is {config.context_tokens} tokens. "
                f"However, your messages resulted in {tokens} tokens. Please reduce the length "
                "of the messages.",
                "messages",
                "context_length_exceeded",
            )
        if (
            model is not None
            and served is not None
            and not openai_rules.serves(model, served, suffix)
        ):
            return openai_rules.model_error(model)
        return openai_rules.check_request(chat.body, chat.messages) if config.openai_rules else None

    async def answer_chat(
        key: str,
        authorized: bool,
        chat: ChatRequest,
        rules_error: openai_rules.RequestError | None,
        admission: _Admission,
        *,
        stall: Callable[[], Awaitable[None]] | None,
        batch: bool = False,
    ) -> ChatAnswer:
        """What a chat request is answered, once admitted: the one answer of both the
        synchronous endpoint and each line of a batch. ``stall`` is how a timeout fault holds
        the request (None: it fails as a gateway timeout instead, as nobody waits on a line)."""
        record, rule = admission.record, admission.rule
        note = f"simulated by fault rule #{admission.rule_index}"
        if not authorized:
            state.finish(record, 401)
            return _status_answer(401, "the simulator does not accept this key")
        if chat.error is not None or chat.text is None:
            state.finish(record, 400)
            body = _error_body(chat.error or "Bad request.", "invalid_request_error", None)
            return ChatAnswer(400, body)
        if rules_error is not None:
            state.finish(record, rules_error.status)
            return ChatAnswer(rules_error.status, rules_error.body())
        fault_header = {"x-simulator-fault": rule.kind} if rule else {}
        if rule is not None and rule.kind == "status":
            headers = dict(fault_header)
            if rule.retry_after is not None:
                headers["retry-after"] = retry_after_header(rule.retry_after)
            state.finish(record, rule.status)
            return _status_answer(rule.status, note, headers)
        if rule is not None and rule.kind == "reset":
            state.finish(record, None)
            return ChatAnswer(None, None, fault_header)
        if rule is not None and rule.kind == "expire" and stall is None:
            # A line the batch never reaches before its window closes.
            state.finish(record, "expired")
            return ChatAnswer(None, None, fault_header)
        if rule is not None and rule.kind in ("timeout", "expire"):
            if stall is None:
                state.finish(record, 504)
                return _status_answer(504, note, fault_header)
            await stall()

        fault = rule.kind if rule is not None and rule.kind in CONTENT_FAULTS else None
        reply = compose_reply(chat.text, chat.schema, fault)
        thinking = 0
        if config.openai_rules and chat.model and openai_rules.is_reasoning_model(chat.model):
            thinking = openai_rules.reasoning_tokens(chat.text)
        reply, thinking = _within_limit(reply, thinking, chat.max_tokens)
        state.finish(record, 200, reply.builtin_fault)
        with_usage = rule is None or rule.kind != "no_usage"
        body, request_id = _completion(key, chat, reply, thinking, with_usage, batch)
        return ChatAnswer(200, body, {"x-request-id": request_id, **fault_header})

    def admit_chat(
        key: str, authorized: bool, raw: bytes, *, batch: bool = False
    ) -> tuple[ChatRequest, openai_rules.RequestError | None, _Admission]:
        """Read a chat request and count its arrival (choosing the fault rule that hits it)."""
        chat = parse_chat_request(raw)
        rules_error = refused(chat) if chat.error is None else None
        # A refused request reaches no model: no fault rule is spent on it.
        text = chat.text if rules_error is None else None
        return chat, rules_error, state.admit(key, authorized, text, chat.max_tokens, batch=batch)

    async def chat_completions(request: Request) -> Response:
        state.count_endpoint("chat.completions")
        key = request.headers.get("idempotency-key", "")
        authorized = state.is_authorized(request.headers.get("authorization"))
        chat, rules_error, admission = admit_chat(key, authorized, await request.body())
        async with state.capacity():
            if config.latency_ms:
                await asyncio.sleep(config.latency_ms / 1000)
            answer = await answer_chat(
                key, authorized, chat, rules_error, admission, stall=state.hang
            )
        if answer.status is None:
            return ConnectionReset()
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    async def answer_line(custom_id: str, raw: bytes) -> ChatAnswer:
        """One line of a batch, answered as the synchronous endpoint answers its body."""
        chat, rules_error, admission = admit_chat(custom_id, True, raw, batch=True)
        answer = await answer_chat(
            custom_id, True, chat, rules_error, admission, stall=None, batch=True
        )
        if answer.status is None and answer.headers.get("x-simulator-fault") == "reset":
            # A dropped connection, for a line: the server's error.
            return _status_answer(500, "the connection was reset", answer.headers)
        return answer

    def _completion(
        key: str,
        chat: ChatRequest,
        reply: Reply,
        thinking: int,
        with_usage: bool,
        batch: bool,
    ) -> tuple[dict[str, Any], str]:
        said = [(str(m.get("role", "")), message_text(m.get("content"))) for m in chat.messages]
        prompt_tokens = sum(estimate_tokens(text) for _, text in said)
        completion = completion_tokens(reply) + thinking
        state.add_usage(key, prompt_tokens + completion, batch=batch)
        request_id = uuid.uuid4().hex
        model = chat.model or config.model
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        if config.caches_prompts:
            cached = state.prompt_cache.cached_tokens(model, said)
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        if config.openai_rules:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": thinking,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            }
        message = {"role": "assistant", "content": reply.content, "refusal": reply.refusal}
        body = {
            "id": f"chatcmpl-sim-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model + config.served_model_suffix,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            **({"usage": usage} if with_usage else {}),
        }
        return body, request_id

    def batch_endpoint(
        name: str, handler: Callable[[Request], Awaitable[Any]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A Batch API route: counted, authorized, its APIError answered as OpenAI does."""

        async def route(request: Request) -> Response:
            state.count_endpoint(name)
            if not state.is_authorized(request.headers.get("authorization")):
                return _status_error(401, "the simulator does not accept this key")
            try:
                result = await handler(request)
            except APIError as e:
                return JSONResponse(e.body(), status_code=e.status)
            return result if isinstance(result, Response) else JSONResponse(result)

        return route

    async def upload_file(request: Request) -> Any:
        form = await request.form()
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str) or not isinstance(purpose, str):
            raise APIError(400, "a multipart form with 'file' and 'purpose' is required", "file")
        data = await upload.read()
        return batches.upload(upload.filename or "upload.jsonl", purpose, data)

    async def list_files(request: Request) -> Any:
        data = batches.files(request.query_params.get("purpose"))
        return {"object": "list", "data": data, "has_more": False}

    async def retrieve_file(request: Request) -> Any:
        return batches.file(request.path_params["file_id"]).card()

    async def file_content(request: Request) -> Any:
        stored = batches.file(request.path_params["file_id"])
        return Response(stored.data, media_type="application/octet-stream")

    async def create_batch(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError as e:
            raise APIError(400, "The request body is not valid JSON.") from e
        if not isinstance(body, dict) or not isinstance(body.get("input_file_id"), str):
            raise APIError(400, "input_file_id is required", "input_file_id")
        return await batches.create(
            body["input_file_id"],
            str(body.get("endpoint")),
            str(body.get("completion_window")),
            body.get("metadata"),
            answer_line,
        )

    async def list_batches(request: Request) -> Any:
        try:
            limit = int(request.query_params.get("limit", 20))
        except ValueError as e:
            raise APIError(400, "limit must be an integer", "limit") from e
        return batches.page(request.query_params.get("after"), limit)

    async def retrieve_batch(request: Request) -> Any:
        return batches.retrieve(request.path_params["batch_id"])

    async def cancel_batch(request: Request) -> Any:
        return batches.cancel(request.path_params["batch_id"])

    async def batch_timing(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError('expected {"seconds", "window_seconds", "cancel_seconds"}')
                timing = {k: body[k] for k in TIMING if k in body}
                for name, value in timing.items():
                    number = isinstance(value, int | float) and not isinstance(value, bool)
                    # Only the window may be null (never expires).
                    if not (number and value >= 0) and not (value is None and name == TIMING[1]):
                        raise ValueError(f"{name} must be a number >= 0")
            except ValueError as exc:
                return JSONResponse(_error_body(str(exc), "invalid_request_error", None), 400)
            for name, value in timing.items():
                setattr(batches, name, value)
        return JSONResponse({name: getattr(batches, name) for name in TIMING})

    async def get_stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    def reset() -> None:
        state.reset()
        batches.clear(
            seconds=config.batch_seconds,
            window_seconds=config.batch_window_seconds,
            cancel_seconds=config.batch_cancel_seconds,
        )

    async def post_reset(request: Request) -> Response:
        reset()
        return JSONResponse({"ok": True})

    async def faults(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
                rules = body["faults"] if isinstance(body, dict) else None
                if not isinstance(rules, list):
                    raise ValueError('expected {"faults": [rule, ...]}')
                state.set_faults(rules)
            except (ValueError, KeyError, ValidationError) as exc:
                return JSONResponse(_error_body(str(exc), "invalid_request_error", None), 400)
        return JSONResponse(state.faults())

    async def api_keys(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError as exc:
                return JSONResponse(_error_body(str(exc), "invalid_request_error", None), 400)
            keys = body.get("api_keys", ...) if isinstance(body, dict) else ...
            if keys is None:
                state.set_api_keys(None)
            elif isinstance(keys, list) and all(isinstance(k, str) and k for k in keys):
                state.set_api_keys(keys)
            else:
                message = 'expected {"api_keys": ["key", ...]} or {"api_keys": null}'
                return JSONResponse(_error_body(message, "invalid_request_error", None), 400)
        return JSONResponse(state.api_keys_summary())

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "model": config.model})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return JSONResponse(
            _error_body(
                f"{request.method} {request.url.path} is not served", "invalid_request_error", None
            ),
            status_code=status,
        )

    app = Starlette(
        routes=[
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/files", batch_endpoint("files.create", upload_file), methods=["POST"]),
            Route("/v1/files", batch_endpoint("files.list", list_files), methods=["GET"]),
            Route(
                "/v1/files/{file_id}",
                batch_endpoint("files.retrieve", retrieve_file),
                methods=["GET"],
            ),
            Route(
                "/v1/files/{file_id}/content",
                batch_endpoint("files.content", file_content),
                methods=["GET"],
            ),
            Route("/v1/batches", batch_endpoint("batches.create", create_batch), methods=["POST"]),
            Route("/v1/batches", batch_endpoint("batches.list", list_batches), methods=["GET"]),
            Route(
                "/v1/batches/{batch_id}",
                batch_endpoint("batches.retrieve", retrieve_batch),
                methods=["GET"],
            ),
            Route(
                "/v1/batches/{batch_id}/cancel",
                batch_endpoint("batches.cancel", cancel_batch),
                methods=["POST"],
            ),
            Route("/_sim/batch-timing", batch_timing, methods=["GET", "POST"]),
            Route("/_sim/stats", get_stats, methods=["GET"]),
            Route("/_sim/reset", post_reset, methods=["POST"]),
            Route("/_sim/faults", faults, methods=["GET", "POST"]),
            Route("/_sim/api-keys", api_keys, methods=["GET", "POST"]),
            Route("/_sim/health", health, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )
    app.state.simulator = state
    app.state.batches = batches
    app.state.reset = reset
    return app


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


class SimulatorServer(BackgroundServer):
    """The simulator on a uvicorn server in a background thread (port 0 picks a free port)."""

    name = "LLM simulator"

    def __init__(
        self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or SimulatorConfig()
        app = create_app(self.config)
        self.state: SimulatorState = app.state.simulator
        self.batches: BatchAPI = app.state.batches
        self._reset: Callable[[], None] = app.state.reset
        # Hanging requests are released first, so that stopping takes no time.
        super().__init__(app, host, port, on_shutdown=self.state.release_hangs)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.root_url}/v1"

    def stats(self) -> dict[str, Any]:
        """The same document as ``GET /_sim/stats``."""
        return self.state.stats()

    def requests_for(self, key: str) -> int:
        """How many chat requests carried this Idempotency-Key ("" for none)."""
        return self.state.requests_for(key)

    def tokens_for(self, key: str) -> int:
        """The tokens the replies to this Idempotency-Key reported, all together."""
        return int(self.stats()["tokens_by_key"].get(key, 0))

    def text_for(self, key: str) -> str | None:
        """The document text the newest request with this Idempotency-Key carried."""
        return self.state.text_for(key)

    def reset(self) -> None:
        """Counters, files and batches cleared, the batch timing as configured."""
        self._reset()

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        self.state.set_faults(faults)

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        self.state.set_api_keys(keys)

    def calls_to(self, endpoint: str) -> int:
        """How many calls an endpoint had (``batches.create``, ``files.create``, …)."""
        return int(self.stats()["by_endpoint"].get(endpoint, 0))

    def set_batch_timing(
        self,
        *,
        seconds: float | None = None,
        window_seconds: float | None = None,
        cancel_seconds: float | None = None,
    ) -> None:
        """How batches created from now on behave (see :mod:`.batch_api`); the window is
        replaced even when None (never expires)."""
        if seconds is not None:
            self.batches.seconds = seconds
        self.batches.window_seconds = window_seconds
        if cancel_seconds is not None:
            self.batches.cancel_seconds = cancel_seconds


def serve(config: SimulatorConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the simulator in the foreground until interrupted; prints its base URL first."""
    app = create_app(config)
    serve_foreground(
        app,
        host,
        port,
        banner=lambda url: (
            f"LLM simulator: OpenAI base URL {url}/v1 (control API under {url}/_sim/)"
        ),
        on_shutdown=app.state.simulator.release_hangs,
    )


class SimulatorControl:
    """Drive a simulator in another process over its ``/_sim/`` control API."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        root = base_url.rstrip("/")
        self.root_url = root.removesuffix("/v1")
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        with httpx.Client(timeout=self.timeout) as client:
            response = client.request(method, f"{self.root_url}/_sim/{path}", json=payload)
        if response.status_code == 400:
            raise ValueError(response.json().get("error", {}).get("message", response.text))
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "stats")  # type: ignore[no-any-return]

    def requests_for(self, key: str) -> int:
        return int(self.stats()["by_key"].get(key, 0))

    def reset(self) -> None:
        self._call("POST", "reset")

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "faults")  # type: ignore[no-any-return]

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        # Validate here too, so a typo fails with the same ValueError as in-process.
        rules = [FaultRule.coerce(rule).as_dict() for rule in faults]
        self._call("POST", "faults", {"faults": rules})

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        self._call("POST", "api-keys", {"api_keys": None if keys is None else sorted(keys)})

    def calls_to(self, endpoint: str) -> int:
        return int(self.stats()["by_endpoint"].get(endpoint, 0))

    def set_batch_timing(
        self,
        *,
        seconds: float | None = None,
        window_seconds: float | None = None,
        cancel_seconds: float | None = None,
    ) -> None:
        timing: dict[str, float | None] = {"window_seconds": window_seconds}
        if seconds is not None:
            timing["seconds"] = seconds
        if cancel_seconds is not None:
            timing["cancel_seconds"] = cancel_seconds
        self._call("POST", "batch-timing", timing)
