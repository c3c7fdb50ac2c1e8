"""Throughput on the production path: ``submit`` → a backfill → queued runs under ``dagster-daemon``.

Everything a user runs in production, in temporary folders (the checkout gets only its bytecode):
a fresh DAGSTER_HOME whose ``dagster.yaml`` queues runs (``max_concurrent_runs`` = ``--runs``), on SQLite or
on PostgreSQL (the instance's storage and the results database, a database of its own, dropped
afterwards); a real ``dagster-daemon`` (its code server and run workers are processes of their
own); the bundled simulator over HTTP in this process with latency L; ``ai-pipeline submit DIR
--batch … --wait`` as a user types it. The total LLM concurrency C is ``--runs`` × the per-run
concurrency, so the LLM-bound limit is C / L documents per second.

It reports documents per second and its efficiency against that limit (until ``submit --wait``
returned, and until the last run ended: the daemon notices a backfill's end up to 30 s later),
where a run's time went (queued, worker start, step), CPU seconds per document summed over every
process below this one (sampled from /proc twice a second: the daemon, its code server, the run
workers, the ``submit`` command; this process — the simulator — is reported apart), Dagster
event-log entries per document, the bytes on disk of the event log and of the results database,
and the peak resident memory of a run worker; with ``--ui-timeout``, how long the Dagster UI's
pages take to show the batch (``scale.ui_pages``, headless Chromium). Then it submits the
same folder again: every document is done, so that pass must make no LLM request and start no
run; its time is reported as a share of the first pass. ``--peer-documents`` runs the one-run-per-document peer through the same
path (``AI_PIPELINE_BACKFILL_RUN_SIZE=1``) and reports the ratio of seconds per document.

    python benchmarks/production.py [--documents 1000] [--latency-ms 1000] [--concurrency 16]
        [--runs 4] [--run-size N] [--backfill-documents N] [--backend sqlite|postgres] [--dagster-postgres-storage]
        [--peer-documents 0] [--no-compile] [--ui-timeout S] [--json]

The checkout's package is compiled to bytecode first, as an installed one is
(``compile_like_an_install``); ``--no-compile`` leaves it as it is.

Exit code 0 when every document completed with exactly one LLM request each, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (  # noqa: E402
    REPO,
    daemon_serving,
    dagster_daemon,
    instance_yaml,
    make_inbox,
    report_header,
)

HERE = Path(__file__).resolve().parent
API_KEY = "sim-bench-key"
MODEL = "sim-analyst-1"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _step_bounds() -> tuple[Any, ...]:
    import dagster as dg

    return (
        dg.DagsterEventType.STEP_START,
        dg.DagsterEventType.STEP_SUCCESS,
        dg.DagsterEventType.STEP_FAILURE,
    )


def process_stats() -> dict[int, tuple[str, list[str]]]:
    """Every process of this machine: its name and the fields of ``/proc/<pid>/stat`` after it
    (``fields[1]`` the parent, ``[11]``/``[12]`` user/system ticks, ``[13]``/``[14]`` those of
    its reaped children, ``[21]`` resident pages)."""
    stats: dict[int, tuple[str, list[str]]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        stats[int(name)] = (comm, raw[raw.rindex(")") + 2 :].split())
    return stats


class ProcessWatch:
    """Samples, twice a second, every process below this one: the CPU seconds each has used (its
    last sample counts; a process that ends between two samples loses at most half a second), what
    it is (by its last command line), and the peak resident memory of the run workers (the code
    server starts each as a ``multiprocessing`` spawn child; ``dagster api execute_run`` under
    other launchers)."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.peak_worker_kib = 0
        self._tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    def cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            kind = self.kind.get(pid, "other")
            out[kind] = round(out.get(kind, 0.0) + seconds, 1)
        return out

    @staticmethod
    def _kind(cmdline: bytes) -> str:
        if b"spawn_main" in cmdline or b"execute_run" in cmdline:
            return "run workers"
        if b"api\x00grpc" in cmdline:
            return "code server"
        if b"dagster-daemon" in cmdline:
            return "daemon"
        if b"ai_pipeline.cli" in cmdline:
            return "submit command"
        return "other"

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.5):
            stats = {pid: fields for pid, (_, fields) in process_stats().items()}
            parents = {pid: int(fields[1]) for pid, fields in stats.items()}
            for pid, fields in stats.items():
                ancestor = parents.get(pid)
                while ancestor and ancestor != me:
                    ancestor = parents.get(ancestor)
                if ancestor != me:
                    continue
                self.cpu[pid] = (int(fields[11]) + int(fields[12])) / self._tick
                try:
                    # Asked at every sample: a child forked by the code server (or the daemon)
                    # has its parent's command line until it execs its own (and an exited one
                    # none at all).
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if cmdline:
                        self.kind[pid] = self._kind(cmdline)
                    if self.kind[pid] == "run workers":
                        rss_kib = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 1024
                        self.peak_worker_kib = max(self.peak_worker_kib, rss_kib)
                except OSError:
                    continue


def pg_database(admin_url: str = PG_ADMIN) -> tuple[str, Any]:
    """A new database on the server of ``admin_url`` (a database there to connect to): its URL,
    and what drops it."""
    import sqlalchemy as sa

    name = f"aip_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(
        admin_url.replace("postgresql://", "postgresql+psycopg2://", 1),
        isolation_level="AUTOCOMMIT",
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return admin_url.rsplit("/", 1)[0] + f"/{name}", drop


def what_dagster_recorded(
    home: Path, env: dict[str, str], slots: int
) -> tuple[Counter[str], dict[str, Any]]:
    """Event-log entries of every run by type, and where a run's time went — read after the
    daemon stopped: the backfill launched → its first run created (the daemon's loop), queued (created → started), starting (the worker up → the step began), the
    step, and the gaps between runs: a freed slot → the next run dequeued (the run queue's
    polling), dequeued → the worker up (process start and code import), the step's end → the
    run's end."""
    import dagster as dg

    os.environ.update({k: v for k, v in env.items() if k.startswith(("DAGSTER", "AI_PIPELINE"))})
    by_type: Counter[str] = Counter()
    queued, starting, stepping, launching, closing, ends = [], [], [], [], [], []
    dequeued: list[float] = []
    step_bounds: dict[str, tuple[float, float]] = {}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records()
        # The backfill daemon's start delay: the backfill launched → its first run created (the
        # daemon looks at new backfills every 30 s).
        launched = [b.backfill_timestamp for b in instance.get_backfills()]
        created = [r.create_timestamp.timestamp() for r in records]
        start_delay = min(created) - min(launched) if launched and created else None
        for record in records:
            run_id = record.dagster_run.run_id
            entries = instance.all_logs(run_id)
            for entry in entries:
                kind = entry.dagster_event_type
                by_type[kind.value if kind is not None else "LOG_MESSAGE"] += 1
            bounds = _step_bounds()
            step = [e.timestamp for e in entries if e.dagster_event_type in bounds]
            starting_at = [
                e.timestamp
                for e in entries
                if e.dagster_event_type == dg.DagsterEventType.PIPELINE_STARTING
            ]
            if record.start_time and record.end_time and len(step) == 2:
                queued.append(record.start_time - record.create_timestamp.timestamp())
                starting.append(step[0] - record.start_time)
                stepping.append(step[1] - step[0])
                step_bounds[run_id] = (step[0], step[1])
                closing.append(record.end_time - step[1])
                ends.append(record.end_time)
                if starting_at:
                    dequeued.append(starting_at[0])
                    launching.append(record.start_time - starting_at[0])
    # The k-th run dequeued (k ≥ slots) took the slot the (k - slots)-th run to end gave up.
    slot_waits = [
        start - end
        for start, end in zip(sorted(dequeued)[slots:], sorted(ends), strict=False)
        if start >= end
    ]

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 2) if values else None

    return by_type, {
        "seconds_backfill_launched_to_first_run_created": (
            round(start_delay, 2) if start_delay is not None else None
        ),
        "mean_seconds_queued": mean(queued),
        "mean_seconds_worker_start_to_step": mean(starting),
        "mean_seconds_in_step": mean(stepping),
        "mean_seconds_slot_free_to_dequeued": mean(slot_waits),
        "mean_seconds_dequeued_to_worker_up": mean(launching),
        "mean_seconds_step_end_to_run_end": mean(closing),
        "last_run_end": max(ends) if ends else None,
        "step_bounds": step_bounds,
    }


def replies_in_steps(
    database_url: str, step_bounds: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    """Where a run's step went around its LLM calls: the step's start → its first reply stored
    (the first request sent, plus one call), and its last reply stored → the step's end (the
    last documents' bookkeeping and events) — from the analysis checkpoints' times, by the run
    that settled each document."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT d.run_id, MIN(c.created_at), MAX(c.created_at) FROM checkpoints c "
                    "JOIN documents d ON d.document_id = c.document_id "
                    "WHERE c.step = 'analyse' GROUP BY d.run_id"
                )
            ).all()
    finally:
        engine.dispose()
    heads, tails = [], []
    for run_id, first, last in rows:
        if run_id not in step_bounds:
            continue
        start, end = step_bounds[run_id]
        first_at, last_at = (_epoch(v) for v in (first, last))
        heads.append(first_at - start)
        tails.append(end - last_at)

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 2) if values else None

    return {
        "mean_seconds_step_start_to_first_reply": mean(heads),
        "mean_seconds_last_reply_to_step_end": mean(tails),
    }


def _epoch(value: Any) -> float:
    """A timestamp column's value (a datetime, or SQLite's text) as seconds since the epoch."""
    from datetime import datetime, timezone

    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())


def runs_ended(home: Path, env: dict[str, str], timeout: float = 36000.0) -> None:
    """Returns when no run of the instance is queued, starting, running or being cancelled."""
    import dagster as dg

    os.environ.update({k: v for k, v in env.items() if k.startswith(("DAGSTER", "AI_PIPELINE"))})
    going = [
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    ]
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while (
            instance.get_runs_count(dg.RunsFilter(statuses=going)) and time.monotonic() < deadline
        ):
            time.sleep(0.5)


def llm_latency_seen_by_runs(database_url: str) -> float | None:
    """The mean time an LLM call took as the runs measured it (request sent → answer parsed, in
    each analysis checkpoint): the simulator's latency plus HTTP and its own serving time."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with engine.connect() as conn:
            payloads = conn.execute(
                sa.text("SELECT payload FROM checkpoints WHERE step = 'analyse'")
            ).scalars()
            values = [json.loads(p).get("latency_ms") for p in payloads]
    finally:
        engine.dispose()
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 1) if values else None


def _bytes_under(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def storage_bytes(home: Path, database_url: str) -> dict[str, int]:
    """Bytes on disk after the batch: Dagster's event log (on SQLite its ``storage/`` folder,
    the index and every run's shard; on PostgreSQL the ``event_logs`` table with its indexes and
    the tables beside it that index events) and the results database (the product's tables)."""
    if not database_url.startswith("postgresql"):
        return {
            "event_log_bytes": _bytes_under(home / "storage"),
            "run_storage_bytes": _bytes_under(home / "history"),
            "results_database_bytes": sum(
                f.stat().st_size for f in home.glob("ai_pipeline.sqlite*") if f.is_file()
            ),
        }
    import sqlalchemy as sa

    from ai_pipeline.store.tables import metadata

    def total(conn: Any, tables: list[str]) -> int:
        query = sa.text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname = ANY(:names)"
        )
        return int(conn.execute(query, {"names": tables}).scalar_one())

    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with engine.connect() as conn:
            return {
                "event_log_bytes": total(
                    conn, ["event_logs", "asset_keys", "asset_event_tags", "asset_check_executions"]
                ),
                "run_storage_bytes": total(conn, ["runs", "run_tags", "bulk_actions"]),
                "results_database_bytes": total(conn, list(metadata.tables)),
            }
    finally:
        engine.dispose()


def database_server_cpu_seconds() -> float | None:
    """CPU seconds the local PostgreSQL server has used so far (its postmaster, the children it
    reaped, and those still running), or None when it does not run on this machine. The
    difference over a pass is what the pass cost the server when nothing else uses it."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {pid: fields for pid, (name, fields) in process_stats().items() if name == "postgres"}
    postmasters = [pid for pid, fields in stats.items() if int(fields[1]) not in stats]
    if len(postmasters) != 1:
        return None
    (postmaster,) = postmasters
    fields = stats[postmaster]
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # its own and its reaped children's
    ticks += sum(int(f[11]) + int(f[12]) for pid, f in stats.items() if int(f[1]) == postmaster)
    return ticks / tick


def database_sessions(database_url: str) -> int:
    """How many sessions the server has opened for this database so far (this one among them)."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def one_pass(
    root: Path, name: str, n: int, args: argparse.Namespace, simulator: Any, run_size: int | None
) -> dict[str, Any]:
    home = root / name / "home"
    home.mkdir(parents=True)
    inbox = make_inbox(
        root / name / "inbox", range(n) if name == "main" else range(10**6, 10**6 + n)
    )
    pg_url, drop = pg_database() if args.backend == "postgres" else (None, None)
    (home / "dagster.yaml").write_text(
        instance_yaml(args.runs, pg_url, accelerated=not args.stock), encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
    env.update(
        DAGSTER_HOME=str(home),
        AI_PIPELINE_DATABASE_URL=pg_url or f"sqlite:///{home / 'ai_pipeline.sqlite'}",
        AI_PIPELINE_SETTLE_SECONDS="0",
        AI_PIPELINE_LLM_CONCURRENCY=str(max(1, args.concurrency // args.runs)),
        OPENAI_BASE_URL=simulator.base_url,
        OPENAI_API_KEY=API_KEY,
        AI_PIPELINE_MODEL=MODEL,
    )
    if args.analysis:
        # A declaration by import path: this folder is importable by every process of the run.
        env.update(
            AI_PIPELINE_ANALYSIS=args.analysis,
            PYTHONPATH=os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p),
        )
    if run_size is not None:
        env["AI_PIPELINE_BACKFILL_RUN_SIZE"] = str(run_size)
    if args.backfill_documents is not None:
        env["AI_PIPELINE_BACKFILL_DOCUMENTS"] = str(args.backfill_documents)

    def submit(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["submit", str(inbox), "--batch", name, "--wait", "--json", *extra]
        return subprocess.run(
            [sys.executable, "-m", "ai_pipeline.cli", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )

    requests_before = simulator.stats()["total"]
    with dagster_daemon(env, root / name / "daemon.log"):
        daemon_serving(home, env)
        server_before = database_server_cpu_seconds() if pg_url else None
        sessions_before = database_sessions(pg_url) if pg_url else None
        with ProcessWatch() as watch:
            started, started_epoch = time.perf_counter(), time.time()
            first = submit("--timeout", "36000")
            wall = time.perf_counter() - started
            # Its runs may still be writing their events (`--wait` returns at the last document
            # settled in the results database): their CPU is the batch's too.
            runs_ended(home, env)
        server_after = database_server_cpu_seconds() if pg_url else None
        sessions = (
            database_sessions(pg_url) - 1 - sessions_before if sessions_before is not None else None
        )
        # The same documents submitted again: all completed, so no run and no LLM call.
        again_requests = simulator.stats()["total"]
        again_started = time.perf_counter()
        again = submit()
        again_wall = time.perf_counter() - again_started
        again_requests = simulator.stats()["total"] - again_requests
    cpu = watch.cpu_seconds
    if first.returncode not in (0, 1) or not first.stdout.strip():
        raise SystemExit(f"FAILED: submit exited {first.returncode}: {first.stderr[-3000:]}")
    out = json.loads(first.stdout)
    events, timing = what_dagster_recorded(home, env, args.runs)
    latency_ms = llm_latency_seen_by_runs(env["AI_PIPELINE_DATABASE_URL"])
    timing.update(replies_in_steps(env["AI_PIPELINE_DATABASE_URL"], timing.pop("step_bounds")))
    sizes = storage_bytes(home, env["AI_PIPELINE_DATABASE_URL"])
    if args.ui_timeout is not None and name == "main":
        from scale import launched, ui_pages

        timing.update(
            ui_pages(home, env, launched(out), args.ui_timeout, partitions_shown="Materialized")
        )
    if drop is not None:
        drop()
    requests = simulator.stats()["total"] - requests_before - again_requests
    again_out = json.loads(again.stdout) if again.returncode == 0 else {}
    last_end = timing.pop("last_run_end")
    work = (last_end - started_epoch) if last_end else wall
    return {
        "documents": n,
        "run_size": run_size or "unset (the product's choice)",
        "backfill_documents": args.backfill_documents or "unset (the product's choice)",
        "succeeded": out["succeeded"],
        "backfill_status": out.get("status"),
        "wall_seconds": round(wall, 2),
        "docs_per_second": round(n / wall, 2),
        "seconds_per_document": round(wall / n, 4),
        # Until the last run ended: the backfill's own end is noticed by the daemon up to 30 s later.
        "seconds_to_last_run_end": round(work, 2),
        "docs_per_second_to_last_run_end": round(n / work, 2),
        "cpu_seconds_all_processes": round(cpu, 1),
        "cpu_seconds_per_document": round(cpu / n, 4),
        "cpu_seconds_by_process": watch.cpu_by_kind(),
        # PostgreSQL's own, apart (a local server; None on SQLite or a remote server).
        "database_server_cpu_seconds_per_document": (
            round((server_after - server_before) / n, 4)
            if server_before is not None and server_after is not None
            else None
        ),
        # The connections the pass's processes opened to PostgreSQL (each a server process).
        "database_sessions_opened": sessions,
        "event_log_entries_per_document": round(sum(events.values()) / n, 2),
        "event_log_entries_by_type": dict(events.most_common()),
        "runs": events.get("PIPELINE_START", 0),
        "llm_requests": requests,
        "mean_llm_latency_ms_seen_by_runs": latency_ms,
        "run_worker_peak_rss_mb": round(watch.peak_worker_kib / 1024, 1),
        "backfills": len(out.get("backfill_ids") or [out.get("backfill_id")]),
        **sizes,
        "event_log_bytes_per_document": round(sizes["event_log_bytes"] / n),
        "results_database_bytes_per_document": round(sizes["results_database_bytes"] / n),
        **timing,
        "resubmit_wall_seconds": round(again_wall, 2),
        "resubmit_over_first_pass": round(again_wall / wall, 4),
        "resubmit_llm_requests": again_requests,
        "resubmit_backfill": again_out.get("backfill_id"),
    }


def compile_like_an_install() -> None:
    """Compile the checkout's package to bytecode, as ``pip install`` does for an installed one.

    An editable checkout has no bytecode until Python writes it at the first import — which it
    never does where ``PYTHONDONTWRITEBYTECODE`` is set (this machine, and many container images).
    Then every process of the batch (the command, the daemon's code server, each run worker)
    compiles the package from source at its start: about 0.3 CPU seconds each, measured at the
    run workers' start, which an installed deployment does not pay."""
    import compileall

    compileall.compile_dir(str(REPO / "ai_pipeline"), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--latency-ms", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16, help="total LLM calls in flight")
    parser.add_argument("--runs", type=int, default=4, help="runs at once (max_concurrent_runs)")
    parser.add_argument(
        "--run-size",
        type=int,
        default=None,
        help="documents per backfill run (AI_PIPELINE_BACKFILL_RUN_SIZE); default: unset, so "
        "the product chooses it from the batch and max_concurrent_runs",
    )
    parser.add_argument(
        "--backfill-documents",
        type=int,
        default=None,
        help="documents per backfill of a batch (AI_PIPELINE_BACKFILL_DOCUMENTS); default: unset, "
        "the product's 10,000 (e.g. 3000 at 30,000 documents: the ten open backfills of 100,000)",
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--peer-documents", type=int, default=0, help="one run per document")
    parser.add_argument(
        "--stock",
        action="store_true",
        help="Dagster's own storage (SQLite, or dagster-postgres's storage: postgres) instead of "
        "the accelerator's of dagster.yaml and deploy/dagster.yaml",
    )
    parser.add_argument(
        "--analysis",
        help="the analysis (a built-in's name or a Declaration's import path; this folder is "
        "importable); default: the built-in document_analysis",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="leave the checkout's package without bytecode (see compile_like_an_install)",
    )
    parser.add_argument(
        "--ui-timeout",
        type=float,
        default=None,
        metavar="S",
        help="after the batch, time the Dagster UI's pages in headless Chromium (the partitions "
        "page, the backfills list, the first backfill's page), each waited for at most S "
        "seconds; default: no UI",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    limit = args.concurrency / (args.latency_ms / 1000)
    report: dict[str, Any] = {
        **report_header(),
        "llm_bound_docs_per_second": limit,
        "instance_storage": f"{args.backend}, "
        + ("Dagster's own" if args.stock else "accelerated"),
    }
    root = Path(tempfile.mkdtemp(prefix="aip-prod-"))
    if not args.no_compile:
        compile_like_an_install()
    report["bytecode"] = "as is" if args.no_compile else "compiled"
    cpu_self = time.process_time()
    problems = []
    try:
        config = SimulatorConfig(latency_ms=args.latency_ms, max_concurrency=2 * args.concurrency)
        with SimulatorServer(config) as simulator:
            main_pass = one_pass(root, "main", args.documents, args, simulator, args.run_size)
            main_pass["efficiency"] = round(main_pass["docs_per_second"] / limit, 3)
            main_pass["efficiency_to_last_run_end"] = round(
                main_pass["docs_per_second_to_last_run_end"] / limit, 3
            )
            seen = main_pass["mean_llm_latency_ms_seen_by_runs"]
            if seen:
                # Against the limit the calls' real duration allows (C / the latency measured).
                main_pass["efficiency_to_last_run_end_at_measured_latency"] = round(
                    main_pass["docs_per_second_to_last_run_end"]
                    / (args.concurrency / (seen / 1000)),
                    3,
                )
            report["main"] = main_pass
            if args.peer_documents:
                peer = one_pass(root, "peer", args.peer_documents, args, simulator, 1)
                peer["ratio_seconds_per_document_over_main"] = round(
                    peer["seconds_per_document"] / main_pass["seconds_per_document"], 1
                )
                report["one_run_per_document"] = peer
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["simulator_process_cpu_seconds"] = round(time.process_time() - cpu_self, 1)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    for name in ("main", "one_run_per_document"):
        p = report.get(name)
        if p and p["resubmit_llm_requests"]:
            problems.append(f"{name}: re-submitting made {p['resubmit_llm_requests']} LLM requests")
        if p and (p["succeeded"] != p["documents"] or p["llm_requests"] != p["documents"]):
            problems.append(
                f"{name}: {p['succeeded']}/{p['documents']} completed, "
                f"{p['llm_requests']} LLM requests"
            )
    report["problems"] = problems
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})"
        )
        print(f"  LLM-bound limit C/L = {limit:g} documents/s")
        for name in ("main", "one_run_per_document"):
            for key, value in report.get(name, {}).items():
                print(f"  {name:<21} {key:<32} {value}")
        print(f"  simulator (this process) CPU s     {report['simulator_process_cpu_seconds']}")
        print(f"  load at the end {report['loadavg_end']}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
