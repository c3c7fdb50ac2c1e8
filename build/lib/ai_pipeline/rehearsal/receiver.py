"""A reference downstream receiver: a notification webhook that implements idempotency correctly.

It models what the pipeline's completion notices are sent to, a payment gateway or notification
service that honours ``Idempotency-Key``: the first notice with a key is stored and
answered 201, the same key again is answered 409 and stored no second time, and with a
``state_file`` a restarted receiver still knows every key it accepted.

What lives here: :func:`create_app`, the Starlette app serving ``POST /notices`` and the control API
under ``/_receiver/`` (stats, reset, faults, health); :class:`ReceiverServer`, which runs it with
uvicorn in a background thread (tests, rehearsals); :func:`serve`, which runs it in the foreground;
and :class:`ReceiverControl`, which drives a receiver in another process over HTTP. The faults and
the stored notices are in :mod:`.receiver_state`. The control API is unauthenticated on purpose: the
receiver is a local rehearsal tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ai_pipeline.rehearsal.receiver_state import ReceiverConfig, ReceiverFault, ReceiverState
from ai_pipeline.rehearsal.serving import (
    BackgroundServer,
    ConnectionReset,
    retry_after_header,
    serve_foreground,
)

NOTICES_PATH = "/notices"
CONTROL_PREFIX = "/_receiver"
MISSING_KEY = "missing Idempotency-Key"

# ---------------------------------------------------------------------------------------------
# HTTP app
# ---------------------------------------------------------------------------------------------


def create_app(config: ReceiverConfig) -> Starlette:
    """The receiver's ASGI app; its :class:`ReceiverState` is ``app.state.receiver``."""
    state = ReceiverState(config)

    def answer(status: int, body: dict[str, Any], fault: str | None = None) -> JSONResponse:
        state.answered(status)
        headers = {"x-receiver-fault": fault} if fault else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def post_notice(request: Request) -> Response:
        raw = await request.body()
        key = request.headers.get("idempotency-key", "").strip()
        state.arrived(key)
        if not key:
            return answer(400, {"error": MISSING_KEY})
        try:
            body = json.loads(raw)
        except ValueError:
            return answer(400, {"error": "the body is not valid JSON"})

        rule = state.fault_for(key)
        kind = rule.kind if rule else None
        if rule is not None:
            if rule.kind == "status":
                response = answer(rule.status, rule.error_body(), rule.kind)
                if rule.retry_after is not None:
                    response.headers["retry-after"] = retry_after_header(rule.retry_after)
                return response
            if rule.kind in ("reset", "accept_then_reset"):
                if rule.kind == "accept_then_reset":
                    state.accept(key, body)
                state.answered(None)
                return ConnectionReset()
            await state.delay(rule.seconds)

        if state.accept(key, body):
            return answer(201, {"status": "accepted", "key": key}, kind)
        return answer(409, {"status": "duplicate", "key": key}, kind)

    async def faults(request: Request) -> Response:
        if request.method == "POST":
            try:
                payload = await request.json()
                rules = payload.get("faults") if isinstance(payload, dict) else None
                if not isinstance(rules, list):
                    raise ValueError('expected {"faults": [rule, ...]}')
                state.set_faults(rules)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(state.faults())

    async def get_stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "persistent": config.state_file is not None})

    async def post_reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    async def not_served(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        message = f"{request.method} {request.url.path} is not served"
        return JSONResponse({"error": message}, status_code=status)

    app = Starlette(
        routes=[
            Route(NOTICES_PATH, post_notice, methods=["POST"]),
            Route(f"{CONTROL_PREFIX}/stats", get_stats, methods=["GET"]),
            Route(f"{CONTROL_PREFIX}/reset", post_reset, methods=["POST"]),
            Route(f"{CONTROL_PREFIX}/faults", faults, methods=["GET", "POST"]),
            Route(f"{CONTROL_PREFIX}/health", health, methods=["GET"]),
        ],
        exception_handlers={404: not_served, 405: not_served},
    )
    app.state.receiver = state
    return app


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


class ReceiverServer(BackgroundServer):
    """The receiver on a uvicorn server in a background thread (port 0 picks a free port)."""

    name = "receiver"

    def __init__(
        self, config: ReceiverConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or ReceiverConfig()
        app = create_app(self.config)
        self.state: ReceiverState = app.state.receiver
        super().__init__(app, host, port, on_shutdown=self.state.wake_delayed)

    @property
    def url(self) -> str:
        """The notices URL to give the pipeline, e.g. ``http://127.0.0.1:PORT/notices``."""
        return self.root_url + NOTICES_PATH

    def stop(self) -> None:
        """Stop serving (delayed requests are woken first) and release the state file."""
        super().stop()
        self.state.close()

    def accepted(self, key: str) -> int:
        """How many notices are stored under this key: 0 or 1."""
        return self.state.accepted(key)

    def requests_for(self, key: str) -> int:
        """How many ``POST /notices`` carried this key."""
        return self.state.requests_for(key)

    def stats(self) -> dict[str, Any]:
        """The same document as ``GET /_receiver/stats``."""
        return self.state.stats()

    def reset(self) -> None:
        self.state.reset()

    def faults(self) -> dict[str, Any]:
        return self.state.faults()

    def set_faults(self, faults: Iterable[ReceiverFault | dict[str, Any]]) -> None:
        self.state.set_faults(faults)


def serve(config: ReceiverConfig, host: str = "127.0.0.1", port: int = 8766) -> None:
    """Run the receiver in the foreground until interrupted; prints its notices URL first."""
    app = create_app(config)
    state: ReceiverState = app.state.receiver
    stored = config.state_file or "memory"
    serve_foreground(
        app,
        host,
        port,
        banner=lambda root: (
            f"Notification receiver: POST notices to {root}{NOTICES_PATH} "
            f"(control API under {root}{CONTROL_PREFIX}/, notices kept in {stored})"
        ),
        on_shutdown=state.wake_delayed,
    )
    state.close()


class ReceiverControl:
    """Drive a receiver in another process over its ``/_receiver/`` control API."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        """``url`` is the notices URL or the receiver's root URL."""
        self.root_url = url.rstrip("/").removesuffix(NOTICES_PATH)
        self.url = self.root_url + NOTICES_PATH
        self.timeout = timeout

    def _document(self, name: str, post: Any = None) -> dict[str, Any]:
        """GET (or, with ``post``, POST it to) ``/_receiver/<name>``; 400 becomes ValueError."""
        endpoint = f"{self.root_url}{CONTROL_PREFIX}/{name}"
        method = "GET" if post is None else "POST"
        with httpx.Client(timeout=self.timeout) as client:
            response = client.request(method, endpoint, json=post)
        if response.status_code == 400:
            raise ValueError(response.json().get("error", response.text))
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document

    def accepted(self, key: str) -> int:
        return int(self.stats()["accepted_by_key"].get(key, 0))

    def requests_for(self, key: str) -> int:
        return int(self.stats()["requests_by_key"].get(key, 0))

    def stats(self) -> dict[str, Any]:
        return self._document("stats")

    def reset(self) -> None:
        self._document("reset", post={})

    def faults(self) -> dict[str, Any]:
        return self._document("faults")

    def set_faults(self, faults: Iterable[ReceiverFault | dict[str, Any]]) -> None:
        # Validated here too, so that a typo fails with the same ValueError as in-process.
        rules = [ReceiverFault.coerce(rule).model_dump() for rule in faults]
        self._document("faults", post={"faults": rules})
