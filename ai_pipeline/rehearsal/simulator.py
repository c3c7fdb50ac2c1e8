"""An OpenAI-compatible LLM simulator: the HTTP app, and ways to run and drive it.

What lives here:

* :func:`create_app`, the Starlette app serving ``/v1/models``, ``/v1/chat/completions``, the
  Batch API (``/v1/files``, ``/v1/batches``: :mod:`.batch_api`, each line answered as the chat
  endpoint answers its body) and the control API under ``/_sim/`` (stats, reset, faults,
  api-keys, batch-timing); how it answers a chat request comes from :mod:`.chat_endpoint`, how
  it reads a request and what its model replies (the analysis, or an answer to the request's JSON
  schema) from :mod:`.replies`, which faults it injects from :mod:`.faults`, and in OpenAI rules
  mode what it refuses, and the reasoning and cached tokens its usage reports, from
  :mod:`.openai_rules`;
* :class:`SimulatorServer`, which runs the app with uvicorn in a background thread (tests, the
  demo), and :func:`serve`, which runs it in the foreground (the ``simulate-llm`` command).

What does not: what a chat request or a batch line is answered (:mod:`.chat_endpoint`), and
:class:`~.control.SimulatorControl`, which drives a simulator running in another process.

Only chat completions are counted in the stats' ``total`` and ``by_key``: listing models is not an
LLM call, and counting it would blur "how often was this task sent to the model", which is what
the counts are for. Batch lines are counted apart (``batch_lines_by_key``, by ``custom_id``), and
every endpoint's calls in ``by_endpoint`` (``files.create``, ``batches.list``, …).
The control API is unauthenticated on purpose: the simulator is a local rehearsal tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ai_pipeline.rehearsal import openai_rules
from ai_pipeline.rehearsal.batch_api import BatchAPI
from ai_pipeline.rehearsal.batch_validation import APIError
from ai_pipeline.rehearsal.chat_endpoint import ChatEndpoint, error_body, status_answer
from ai_pipeline.rehearsal.faults import FaultRule, SimulatorConfig, SimulatorState
from ai_pipeline.rehearsal.replies import DOCUMENT_END, DOCUMENT_START, extract_document
from ai_pipeline.rehearsal.serving import BackgroundServer, ConnectionReset, serve_foreground

__all__ = [
    "DOCUMENT_END",
    "DOCUMENT_START",
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


def _status_error(status: int, note: str, headers: dict[str, str] | None = None) -> JSONResponse:
    answer = status_answer(status, note, headers)
    return JSONResponse(answer.body, status_code=status, headers=answer.headers)


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

    endpoint = ChatEndpoint(config, state)

    async def chat_completions(request: Request) -> Response:
        state.count_endpoint("chat.completions")
        key = request.headers.get("idempotency-key", "")
        authorized = state.is_authorized(request.headers.get("authorization"))
        chat, rules_error, admission = endpoint.admit_chat(key, authorized, await request.body())
        async with state.capacity():
            if config.latency_ms:
                await asyncio.sleep(config.latency_ms / 1000)
            answer = await endpoint.answer_chat(
                key, authorized, chat, rules_error, admission, stall=state.hang
            )
        if answer.status is None:
            return ConnectionReset()
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    def batch_route(
        method: str, path: str, name: str, handler: Callable[[Request], Awaitable[Any]]
    ) -> Route:
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

        return Route(path, route, methods=[method])

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
            endpoint.answer_line,
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
                return JSONResponse(error_body(str(exc), "invalid_request_error", None), 400)
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
                return JSONResponse(error_body(str(exc), "invalid_request_error", None), 400)
        return JSONResponse(state.faults())

    async def api_keys(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError as exc:
                return JSONResponse(error_body(str(exc), "invalid_request_error", None), 400)
            keys = body.get("api_keys", ...) if isinstance(body, dict) else ...
            if keys is None:
                state.set_api_keys(None)
            elif isinstance(keys, list) and all(isinstance(k, str) and k for k in keys):
                state.set_api_keys(keys)
            else:
                message = 'expected {"api_keys": ["key", ...]} or {"api_keys": null}'
                return JSONResponse(error_body(message, "invalid_request_error", None), 400)
        return JSONResponse(state.api_keys_summary())

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "model": config.model})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return JSONResponse(
            error_body(
                f"{request.method} {request.url.path} is not served", "invalid_request_error", None
            ),
            status_code=status,
        )

    app = Starlette(
        routes=[
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            batch_route("POST", "/v1/files", "files.create", upload_file),
            batch_route("GET", "/v1/files", "files.list", list_files),
            batch_route("GET", "/v1/files/{file_id}", "files.retrieve", retrieve_file),
            batch_route("GET", "/v1/files/{file_id}/content", "files.content", file_content),
            batch_route("POST", "/v1/batches", "batches.create", create_batch),
            batch_route("GET", "/v1/batches", "batches.list", list_batches),
            batch_route("GET", "/v1/batches/{batch_id}", "batches.retrieve", retrieve_batch),
            batch_route("POST", "/v1/batches/{batch_id}/cancel", "batches.cancel", cancel_batch),
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

    def release_hangs(self) -> None:
        """Answer the requests a "timeout" fault holds now, before its ``hang_seconds``."""
        self.state.release_hangs_from()

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
