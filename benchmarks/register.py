"""Registering a folder of files as documents: one checkout against others, in turns.

Each pass is a process of its own that runs one checkout's intake (``register_files``, what
``submit`` and ``run`` do before any run starts) over the same folder of N files into a fresh
results database, then over it again (every file known by then). It reports, for both, the wall
and CPU seconds, and the statements the database driver put on the wire per file: psycopg2's
``executemany`` sends a statement per row, so a round trip each, which a database on another host
pays in its network's round-trip time. The checkouts take turns, ``--rounds`` times; the report
gives each checkout's medians.

    python benchmarks/register.py [--documents 10000] [--rounds 3] [--backend sqlite|postgres]
        [--pg-admin-url URL] [--rtt-ms MS] [--json] [CHECKOUT ...]

With ``--backend postgres`` each pass gets a database of its own on the server of
``--pg-admin-url`` (default: the local one), dropped afterwards. ``--rtt-ms`` puts a proxy in this
process between the passes and that server which holds back every chunk of bytes for half of it in
each direction, as a server on another host would; the report gives the round trip measured
through it (a ``SELECT 1``, the median of 100). With no CHECKOUT it measures this
one. A checkout is a directory holding ``ai_pipeline`` (e.g. a ``git worktree add /tmp/base
<commit>``); it is put first on ``PYTHONPATH`` of its passes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy.engine.url as sa_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cpu import commit_of, finish_report, in_turns, run_pass  # noqa: E402
from production import PG_ADMIN, pg_database  # noqa: E402
from throughput import REPO, make_inbox, report_header  # noqa: E402

# One pass, run as ``python -c`` in the checkout's environment; prints its figures as JSON.
_PASS = r"""
import json, sys, time
from pathlib import Path

import sqlalchemy as sa

from ai_pipeline.intake import register_files
from ai_pipeline.store import Store

url, inbox = sys.argv[1], Path(sys.argv[2])
files = sorted(inbox.iterdir())
store = Store(url)
on_the_wire = 0

@sa.event.listens_for(store.db.engine, "before_cursor_execute")
def _sent(conn, cursor, statement, params, context, executemany):
    global on_the_wire
    on_the_wire += len(params) if context.execute_style.name == "EXECUTEMANY" else 1

figures = {}
for name in ("new", "known"):
    on_the_wire = 0
    cpu, wall = time.process_time(), time.perf_counter()
    registered = register_files(store, files, max_bytes=1 << 20)
    figures[name] = {
        "wall_seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "statements_per_file": on_the_wire / len(files),
        "new": sum(r.new for r in registered),
    }
figures["documents"] = len(store.documents.rows())
store.db.dispose()
print(json.dumps(figures))
"""


def _fresh_database(args: argparse.Namespace, tmp: Path) -> tuple[str, Any]:
    """A database URL for one pass and what drops it."""
    if args.backend == "sqlite":
        path = tmp / f"{uuid.uuid4().hex[:8]}.sqlite"
        return f"sqlite:///{path}", lambda: path.unlink(missing_ok=True)
    return pg_database(args.pg_admin_url)


@contextmanager
def delaying_proxy(host: str, port: int, rtt_seconds: float) -> Iterator[int]:
    """A TCP proxy to ``host:port`` on a port of 127.0.0.1 (yielded) that forwards each chunk of
    bytes half of ``rtt_seconds`` after it arrived, in both directions, in order."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    bound: list[int] = []

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(chunk)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        while True:
            chunk = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + rtt_seconds / 2, chunk))
            if not chunk:
                break
        await delivering

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def listen() -> None:
        server = await asyncio.start_server(connected, "127.0.0.1", 0)
        bound.append(server.sockets[0].getsockname()[1])

    def serve() -> None:
        loop.run_until_complete(listen())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait()
    yield bound[0]

    async def stop() -> None:
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        loop.stop()

    asyncio.run_coroutine_threadsafe(stop(), loop)
    thread.join()


def measured_rtt_ms(url: str) -> float:
    """The median time of a ``SELECT 1`` on one connection to ``url``, in milliseconds."""
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with engine.connect() as conn:
        times = []
        for _ in range(100):
            began = time.perf_counter()
            conn.execute(sa.text("SELECT 1"))
            times.append(time.perf_counter() - began)
    engine.dispose()
    return round(1000 * statistics.median(times), 3)


def one_pass(checkout: Path, inbox: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    url, drop = _fresh_database(args, tmp)
    try:
        return run_pass(checkout, _PASS, url, str(inbox))
    finally:
        drop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, help="default: this checkout")
    parser.add_argument("--documents", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--pg-admin-url",
        default=PG_ADMIN,
        help="with --backend postgres: a database on the server to create each pass's in",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="with --backend postgres: the round trip a proxy adds to the server's",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts] or [REPO]
    if args.rtt_ms and args.backend != "postgres":
        parser.error("--rtt-ms needs --backend postgres")

    report: dict[str, Any] = {**report_header(), "backend": args.backend, "checkouts": {}}
    with contextlib.ExitStack() as stack:
        if args.rtt_ms:
            server = sa_url.make_url(args.pg_admin_url)
            port = stack.enter_context(
                delaying_proxy(server.host or "127.0.0.1", server.port or 5432, args.rtt_ms / 1000)
            )
            args.pg_admin_url = server.set(host="127.0.0.1", port=port).render_as_string(
                hide_password=False
            )
        if args.backend == "postgres":
            report["round_trip_ms"] = measured_rtt_ms(args.pg_admin_url)
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="aip-register-"))
        tmp = Path(folder)
        inbox = make_inbox(tmp / "inbox", range(args.documents))
        passes = in_turns(
            checkouts,
            args.rounds,
            lambda checkout: one_pass(checkout, inbox, args, tmp),
            None
            if args.json
            else lambda f: (
                f"new {f['new']['wall_seconds']:.2f} s, known {f['known']['wall_seconds']:.2f} s"
            ),
        )
    problems = []
    for checkout in checkouts:
        entry: dict[str, Any] = {"commit": commit_of(checkout)}
        for name in ("new", "known"):
            runs = [p[name] for p in passes[checkout]]
            entry[name] = {
                "wall_seconds": [round(r["wall_seconds"], 3) for r in runs],
                "median_wall_seconds": round(statistics.median(r["wall_seconds"] for r in runs), 3),
                "median_cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in runs), 3),
                "statements_per_file": round(runs[0]["statements_per_file"], 4),
            }
        report["checkouts"][str(checkout)] = entry
        for p in passes[checkout]:
            if (p["new"]["new"], p["known"]["new"], p["documents"]) != (
                args.documents,
                0,
                args.documents,
            ):
                problems.append(f"{checkout}: a pass did not register every file once")
    rtt = report.get("round_trip_ms")
    return finish_report(
        report,
        problems,
        args.json,
        lambda entry: "; ".join(
            f"{name}: median {entry[name]['median_wall_seconds']} s wall, "
            f"{entry[name]['median_cpu_seconds']} s CPU, "
            f"{entry[name]['statements_per_file']} statements per file"
            for name in ("new", "known")
        ),
        preface=[] if rtt is None else [f"a round trip to the server: {rtt} ms"],
    )


if __name__ == "__main__":
    raise SystemExit(main())
