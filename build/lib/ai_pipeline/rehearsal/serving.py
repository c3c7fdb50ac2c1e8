"""Running the bundled HTTP servers (the LLM simulator, the webhook receiver) on uvicorn.

One place for what both need: a listening socket with a large backlog, a uvicorn configuration
that leaves the host's logging alone, a server in a background thread (tests, the demo) or in the
foreground (the CLI), and a way to drop a connection on purpose — ASGI gives an app no way to
hang up without answering, so the HTTP protocol registers each open transport and
``ConnectionReset`` aborts its own request's transport with a TCP RST.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from contextlib import closing, suppress
from typing import Any

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

# Open connections by (server address, client address).
_TRANSPORTS: dict[tuple[tuple[Any, ...], tuple[Any, ...]], asyncio.Transport] = {}


def _tracking_protocol_class() -> type[asyncio.Protocol]:
    base: Any = AutoHTTPProtocol

    class TrackingHTTPProtocol(base):  # type: ignore[misc]
        """uvicorn's HTTP protocol, registering its transport while the connection is open."""

        _tracking_key: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # asyncio turns Nagle's algorithm off only for sockets made with IPPROTO_TCP, and
                # ``socket.create_server`` (``bind``) makes them with protocol 0: uvicorn's
                # response then went out in two writes, the second held back until the client's
                # delayed ACK — about 40 ms on every request.
                with suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super().connection_made(transport)
            if self.server and self.client:
                self._tracking_key = (tuple(self.server), tuple(self.client))
                _TRANSPORTS[self._tracking_key] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self._tracking_key is not None:
                _TRANSPORTS.pop(self._tracking_key, None)
            super().connection_lost(exc)

    return TrackingHTTPProtocol


class ConnectionReset(Response):
    """A "response" that drops the TCP connection with a RST instead of answering."""

    def __init__(self) -> None:
        super().__init__(status_code=500)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server, client = scope.get("server"), scope.get("client")
        transport = _TRANSPORTS.get((tuple(server), tuple(client))) if server and client else None
        if transport is None:
            # Not under uvicorn (e.g. an in-process ASGI transport): an exception is the
            # nearest thing to a dropped connection that the caller will see.
            raise ConnectionResetError("simulated connection reset")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0 makes close() send RST: the client sees "connection reset by peer".
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        # Return only once uvicorn has seen the disconnect, or it would try to send a 500.
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_until_disconnected(receive), timeout=2)


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def retry_after_header(seconds: float) -> str:
    """A Retry-After value: whole seconds when it is whole, else the decimal."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # A big backlog so that hundreds of simultaneous connects are queued, not refused.
    return socket.create_server((host, port), family=family, backlog=2048)


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def uvicorn_config(app: ASGIApp, *, configure_logging: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=_tracking_protocol_class(),
        ws="none",
        lifespan="off",
        loop="asyncio",
        log_level="warning",
        access_log=False,
        # In-process servers must not reconfigure the host's logging (pytest, Dagster).
        log_config=uvicorn.config.LOGGING_CONFIG if configure_logging else None,
        # A reset finds its connection by the peer address; a forwarded-for header must not
        # rewrite it.
        proxy_headers=False,
        limit_concurrency=None,
        backlog=2048,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=5,
    )


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling a waiting thread when it is up and running a hook at shutdown.

    The hook releases requests the app holds on purpose (a simulated hang or delay); otherwise they
    would hold up every shutdown for the graceful-shutdown timeout.
    """

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        await super().shutdown(sockets=sockets)


class BackgroundServer:
    """An ASGI app on uvicorn in a background thread (port 0 picks a free port)."""

    name = "server"

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port: int | None = None
        self._requested_port = port
        self._on_shutdown = on_shutdown
        self._uvicorn: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._crash: BaseException | None = None

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT``."""
        if self.port is None:
            raise RuntimeError(f"the {self.name} is not running; call start() first")
        return f"http://{url_host(self.host)}:{self.port}"

    def start(self, timeout: float = 10.0) -> Any:
        """Start serving; returns once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError(f"the {self.name} is already running")
        listener = bind(self.host, self._requested_port)
        self.port = listener.getsockname()[1]
        uv = _Uvicorn(uvicorn_config(self.app, configure_logging=False), self._on_shutdown)
        self._crash = None
        thread = threading.Thread(
            target=self._serve_here,
            args=(uv, listener),
            name=f"{self.name}-{self.port}",
            daemon=True,
        )
        self._uvicorn, self._thread = uv, thread
        thread.start()
        if not uv.ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the {self.name} did not start within {timeout} s")
        if not uv.started:
            thread.join(timeout)
            self._uvicorn = self._thread = None
            raise RuntimeError(f"the {self.name} failed to start") from self._crash
        return self

    def _serve_here(self, uv: _Uvicorn, listener: socket.socket) -> None:
        try:
            with closing(listener):
                asyncio.run(uv.serve(sockets=[listener]))
        except BaseException as exc:  # start() reports it; a thread has nobody else to tell
            self._crash = exc
        finally:
            uv.ready.set()  # never leave start() waiting for a server that died

    def stop(self) -> None:
        """Stop serving; held requests are released first so that stopping takes no time."""
        uv, thread = self._uvicorn, self._thread
        self._uvicorn = self._thread = None
        if uv is None or thread is None:
            return
        uv.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():
            uv.force_exit = True
            thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_foreground(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    banner: Callable[[str], str],
    on_shutdown: Callable[[], None] | None = None,
) -> None:
    """Serve until interrupted; prints ``banner(root_url)`` once the socket is listening."""
    listener = bind(host, port)
    print(banner(f"http://{url_host(host)}:{listener.getsockname()[1]}"), flush=True)
    uv = _Uvicorn(uvicorn_config(app, configure_logging=True), on_shutdown)
    # uvicorn shuts down gracefully on Ctrl+C and then re-raises it; for a command line tool that
    # is the normal way to stop, not an error worth a traceback.
    with closing(listener), suppress(KeyboardInterrupt):
        uv.run(sockets=[listener])
