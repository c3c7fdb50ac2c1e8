"""Throughput of ``Launcher.process_inbox`` against the bundled LLM simulator, through real Dagster runs.

What it does (everything in temporary folders, nothing in the checkout is touched):

1. *Main pass*: a fresh DAGSTER_HOME (a copy of the repository's ``dagster.yaml``) and an inbox of N
   distinct generated English documents; the simulator runs in this process with latency L and
   ``max_concurrency`` = 2 × the pipeline's LLM concurrency; ``Launcher.process_inbox(inbox)`` —
   registration, dynamic partitions, range runs through ``execute_in_process`` — is timed and
   compared with the ideal ``N × L / concurrency`` (what the LLM alone would cost).
2. *Second pass* over the same inbox: everything is checkpointed, so the simulator must receive no
   request at all; its wall time is the cost of "nothing to do".
3. *Baseline*: ``--baseline-documents`` other documents on another fresh DAGSTER_HOME with
   ``AI_PIPELINE_DOCUMENTS_PER_RUN=1`` (one Dagster run per document), to show what a range run saves.

Exit code 0 when every document completed and the request counts are as expected, 1 otherwise.

    python benchmarks/throughput.py [--documents 500] [--latency-ms 200] [--concurrency 16]
                                    [--documents-per-run N] [--baseline-documents 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sim-bench-key"
MODEL = "sim-analyst-1"
BASELINE_OFFSET = 1_000_000  # baseline documents use other indexes: other texts, other ids

# --- generated documents -------------------------------------------------------------------------

_CUSTOMERS = [
    "Ana Ribeiro",
    "Tomas Novak",
    "Priya Natarajan",
    "Kenji Watanabe",
    "Lucia Moretti",
    "Omar Haddad",
    "Freya Lindqvist",
    "Diego Alvarez",
    "Mei Chen",
    "Samuel Okafor",
    "Ingrid Solberg",
]
_COMPANIES = [
    "Harbor Supplies",
    "Northwind Traders",
    "Bluepeak Logistics",
    "Cedar Analytics",
    "Orion Textiles",
    "Lumen Foods",
    "Granite Works",
    "Vega Pharmacy",
    "Atlas Marine",
]
_CITIES = [
    "Lisbon",
    "Porto",
    "Rotterdam",
    "Hamburg",
    "Valencia",
    "Lyon",
    "Krakow",
    "Dublin",
    "Oslo",
    "Turin",
    "Ghent",
    "Seville",
    "Bergen",
]
_PRODUCTS = [
    "ceramic tiles",
    "office chairs",
    "solar panels",
    "coffee beans",
    "winter jackets",
    "laboratory gloves",
    "bicycle frames",
    "printer toner",
    "garden hoses",
    "oak flooring",
]
_OPENINGS = [
    "Order {i} for {company} was delivered to {city} on time.",
    "Shipment {i} of {product} from {company} reached {city} two days early.",
    "Invoice {i} from {company} covers {qty} crates of {product} sent to {city}.",
    "Ticket {i} concerns a delivery of {product} by {company} in {city}.",
]
_MIDDLES = [
    "Customer {customer} praised the excellent packaging of shipment {i}.",
    "Customer {customer} reported that {qty} boxes arrived damaged and asked for a refund.",
    "Customer {customer} confirmed the quantities and signed the delivery note.",
    "Customer {customer} was disappointed by the slow response about parcel {i}.",
    "Customer {customer} thanked the driver for the careful handling of the {product}.",
]
_CLOSINGS = [
    "The team resolved every question quickly.",
    "A follow-up call is planned for next week.",
    "The account manager will review the contract terms.",
    "Stock levels for {product} remain stable this quarter.",
]


def document_text(i: int) -> str:
    """A small, distinct English document, deterministic from its index (a few sentences)."""
    fields = {
        "i": i,
        "customer": _CUSTOMERS[i % len(_CUSTOMERS)],
        "company": _COMPANIES[(i // 3) % len(_COMPANIES)],
        "city": _CITIES[(i * 7) % len(_CITIES)],
        "product": _PRODUCTS[(i * 3) % len(_PRODUCTS)],
        "qty": 2 + (i * 13) % 47,
    }
    sentences = [
        _OPENINGS[i % len(_OPENINGS)],
        _MIDDLES[(i // 2) % len(_MIDDLES)],
        _CLOSINGS[(i // 5) % len(_CLOSINGS)],
    ]
    return " ".join(s.format(**fields) for s in sentences) + "\n"


def document_id(i: int) -> str:
    """The document id ``make_inbox`` gives the ``i``-th document (its normalised content's)."""
    from ai_pipeline.documents import content_id, normalise_text

    return content_id(normalise_text(document_text(i)).encode("utf-8"))


def make_inbox(folder: Path, indexes: range) -> Path:
    folder.mkdir(parents=True)
    for i in indexes:
        (folder / f"doc-{i:07d}.txt").write_text(document_text(i), encoding="utf-8")
    return folder


# --- environment ---------------------------------------------------------------------------------


def report_header() -> dict[str, Any]:
    """What every benchmark report starts with: its command line, the commit and the machine."""
    return {
        "command": " ".join(sys.argv),
        "commit": git_commit() or "unknown",
        "machine": machine_info(),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    nproc: int | None
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        nproc = os.cpu_count()
    try:
        from importlib.metadata import version

        dagster_version = version("dagster")
    except Exception:
        dagster_version = None
    return {
        "nproc": nproc,
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "dagster": dagster_version,
    }


def configure(
    home: Path, simulator_url: str, concurrency: int, documents_per_run: int | None
) -> None:
    """Point this process at a fresh instance and results database, and at the simulator."""
    from ai_pipeline.store import dispose_stores

    dispose_stores()
    # Only the settings below: an AI_PIPELINE_* variable of the caller's shell (an inbox, a
    # webhook, a smaller size limit) would change what is measured.
    for name in [k for k in os.environ if k.startswith("AI_PIPELINE_")]:
        del os.environ[name]
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["AI_PIPELINE_DATABASE_URL"] = f"sqlite:///{home / 'ai_pipeline.sqlite'}"
    os.environ["OPENAI_BASE_URL"] = simulator_url
    os.environ["OPENAI_API_KEY"] = API_KEY
    os.environ["AI_PIPELINE_MODEL"] = MODEL
    # The inbox is written just before the pass: no file may wait out the settle time.
    os.environ["AI_PIPELINE_SETTLE_SECONDS"] = "0"
    os.environ["AI_PIPELINE_LLM_CONCURRENCY"] = str(concurrency)
    if documents_per_run is not None:
        os.environ["AI_PIPELINE_DOCUMENTS_PER_RUN"] = str(documents_per_run)


def instance_yaml(
    max_concurrent_runs: int | None = None,
    pg_url: str | None = None,
    *,
    accelerated: bool = True,
) -> str:
    """The checkout's dagster.yaml (the accelerator on), with another run queue size, or on
    PostgreSQL through the accelerator's pooled storage of ``deploy/dagster.yaml``; with
    ``accelerated=False``, Dagster's own storage (SQLite, or ``storage: postgres``)."""
    from ai_pipeline.accelerator.sqlite import without_sqlite_storage

    text = (REPO / "dagster.yaml").read_text(encoding="utf-8")
    if max_concurrent_runs is not None:
        text = re.sub(
            r"max_concurrent_runs: \d+", f"max_concurrent_runs: {max_concurrent_runs}", text
        )
    if pg_url or not accelerated:
        # Dagster refuses a storage section beside the SQLite ones.
        text = without_sqlite_storage(text)
    if pg_url:
        # psycopg2 by name: SQLAlchemy 2.1 maps postgresql:// to psycopg 3 (see deploy/dagster.yaml).
        url = pg_url.replace("postgresql://", "postgresql+psycopg2://", 1)
        if accelerated:
            from ai_pipeline.accelerator.postgres import storage_yaml

            text += "\n" + storage_yaml(postgres_url=url)
        else:
            text += f"\nstorage:\n  postgres:\n    postgres_url: {url}\n"
    return text


def _beside_python(command: str) -> str:
    """A console script of this interpreter's environment (the virtualenv need not be active)."""
    script = Path(sys.executable).parent / command
    return str(script) if script.exists() else command


@contextmanager
def background(
    argv: list[str], env: dict[str, str], log_path: Path, cwd: Path = REPO
) -> Iterator[subprocess.Popen[bytes]]:
    """A process of the checkout (``cwd``) in a session of its own, its output to ``log_path``;
    stopped (its process group: it and what it started) after."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@contextmanager
def dagster_daemon(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``dagster-daemon`` on the project's workspace, stopped (its process group) after."""
    argv = [_beside_python("dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")]
    with background(argv, env, log_path) as daemon:
        yield daemon


def daemon_serving(home: Path, env: dict[str, str], timeout: float = 120.0) -> float:
    """Waits until the daemon evaluates the code location's sensors (its reconcile sensor has
    begun a tick), as a deployment's daemon does before batches arrive; returns the seconds waited."""
    import dagster as dg

    os.environ.update({k: v for k, v in env.items() if k.startswith(("DAGSTER", "AI_PIPELINE"))})
    started = time.monotonic()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() - started < timeout:
            if any(
                state.instigator_name == "reconcile_sensor"
                and getattr(state.instigator_data, "last_tick_start_timestamp", None)
                for state in instance.all_instigator_state()
            ):
                break
            time.sleep(0.5)
    return time.monotonic() - started


def fresh_home(root: Path, name: str, instance_yaml: Path = REPO / "dagster.yaml") -> Path:
    home = root / name
    home.mkdir(parents=True)
    shutil.copy(instance_yaml, home / "dagster.yaml")
    return home


def run_breakdown(home: Path, run_ids: list[str]) -> dict[str, Any]:
    """What Dagster recorded about the runs: time creating vs executing them, events written.

    ``create → start`` is mostly ``create_run`` logging the planned-materialization events;
    ``start → end`` is the run itself (the analysis step and its per-document events).
    """
    import dagster as dg

    creating = executing = 0.0
    by_type: Counter[str] = Counter()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records(dg.RunsFilter(run_ids=run_ids)) if run_ids else []
        for record in records:
            if record.start_time:
                creating += record.start_time - record.create_timestamp.timestamp()
                if record.end_time:
                    executing += record.end_time - record.start_time
        for run_id in run_ids:
            for entry in instance.all_logs(run_id):
                kind = entry.dagster_event_type
                by_type[kind.value if kind is not None else "LOG_MESSAGE"] += 1
    return {
        "seconds_creating_runs": creating,
        "seconds_executing_runs": executing,
        "event_log_entries": sum(by_type.values()),
        "event_log_entries_by_type": dict(by_type.most_common()),
    }


def timed_pass(inbox: Path, simulator: Any) -> dict[str, Any]:
    import dagster as dg

    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.launch import Launcher

    before = simulator.stats()["total"]
    cpu_started = time.process_time()
    started = time.perf_counter()
    report = Launcher(dg.DagsterInstance.get(), defs).process_inbox(inbox)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    requests = simulator.stats()["total"] - before
    states = report["counts"]["by_state"]
    return {
        "report": report,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "runs": len(report["runs"]),
        "run_ids": [r["run_id"] for r in report["runs"]],
        "failed_runs": sum(1 for r in report["runs"] if not r["success"]),
        "llm_requests": requests,
        "by_state": states,
        "completed": states.get("COMPLETED", 0),
        "documents": report["counts"]["total"],
    }


# --- the benchmark -------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer
    from ai_pipeline.settings import Settings

    n, latency, concurrency = args.documents, args.latency_ms, args.concurrency
    out: dict[str, Any] = {}
    problems: list[str] = []
    with SimulatorServer(
        SimulatorConfig(latency_ms=latency, max_concurrency=max(2 * concurrency, concurrency + 1))
    ) as simulator:
        # --- main pass -----------------------------------------------------------------------
        home = fresh_home(root, "main_home", args.dagster_yaml)
        inbox = make_inbox(root / "main_inbox", range(n))
        configure(home, simulator.base_url, concurrency, args.documents_per_run)
        documents_per_run = Settings.load().documents_per_run
        first = timed_pass(inbox, simulator)
        ideal = n * latency / 1000 / concurrency
        wall = first["wall_seconds"]
        runs = run_breakdown(home, first["run_ids"])
        out["main"] = {
            "documents": first["documents"],
            "documents_per_run": documents_per_run,
            "runs": first["runs"],
            "failed_runs": first["failed_runs"],
            "wall_seconds": round(wall, 3),
            "ideal_seconds": round(ideal, 3),
            "wall_over_ideal": round(wall / ideal, 2) if ideal else None,
            # CPU of the whole process (simulator thread included); wall − CPU is waiting: on the
            # disk (fsync), on the LLM, or for a core when something else loads the machine.
            "cpu_seconds": round(first["cpu_seconds"], 3),
            "docs_per_second": round(n / wall, 2),
            "seconds_per_document": round(wall / n, 4),
            # Little's law: LLM requests in flight on average, against the configured concurrency.
            "mean_llm_requests_in_flight": round(first["llm_requests"] * latency / 1000 / wall, 2),
            "seconds_creating_runs": round(runs["seconds_creating_runs"], 3),
            "seconds_executing_runs": round(runs["seconds_executing_runs"], 3),
            "mean_seconds_per_run": round(
                (runs["seconds_creating_runs"] + runs["seconds_executing_runs"]) / first["runs"], 3
            )
            if first["runs"]
            else None,
            "seconds_outside_runs": round(
                wall - runs["seconds_creating_runs"] - runs["seconds_executing_runs"], 3
            ),
            "event_log_entries": runs["event_log_entries"],
            "event_log_entries_per_document": round(runs["event_log_entries"] / n, 2),
            "event_log_entries_by_type": runs["event_log_entries_by_type"],
            "llm_requests": first["llm_requests"],
            "simulator_peak_in_flight": simulator.stats()["peak_in_flight"],
            "by_state": first["by_state"],
            "all_completed": first["completed"] == n == first["documents"],
        }
        if not out["main"]["all_completed"]:
            problems.append(
                f"main pass: {first['completed']}/{n} documents COMPLETED ({first['by_state']})"
            )
        if first["llm_requests"] != n:
            problems.append(f"main pass: {first['llm_requests']} LLM requests for {n} documents")

        # --- second pass: everything checkpointed ----------------------------------------------
        second = timed_pass(inbox, simulator)
        out["second_pass"] = {
            "documents": second["documents"],
            "wall_seconds": round(second["wall_seconds"], 3),
            "runs": second["runs"],
            "llm_requests": second["llm_requests"],
            "all_completed": second["completed"] == n,
        }
        if second["llm_requests"] != 0:
            problems.append(f"second pass: {second['llm_requests']} LLM requests, expected 0")
        if second["runs"] != 0 and out["main"]["all_completed"]:
            problems.append(f"second pass: {second['runs']} runs launched, expected 0")
        if second["completed"] != n:
            problems.append(f"second pass: {second['completed']}/{n} documents COMPLETED")

        # --- baseline: one run per document -----------------------------------------------------
        b = args.baseline_documents
        if b > 0:
            home_b = fresh_home(root, "baseline_home", args.dagster_yaml)
            inbox_b = make_inbox(
                root / "baseline_inbox", range(BASELINE_OFFSET, BASELINE_OFFSET + b)
            )
            configure(home_b, simulator.base_url, concurrency, 1)
            base = timed_pass(inbox_b, simulator)
            runs_b = run_breakdown(home_b, base["run_ids"])
            per_doc_range = first["wall_seconds"] / n
            per_doc_single = base["wall_seconds"] / b
            out["baseline_one_run_per_document"] = {
                "documents": base["documents"],
                "runs": base["runs"],
                "wall_seconds": round(base["wall_seconds"], 3),
                "mean_seconds_per_run": round(
                    (runs_b["seconds_creating_runs"] + runs_b["seconds_executing_runs"])
                    / base["runs"],
                    3,
                )
                if base["runs"]
                else None,
                "event_log_entries_per_document": round(runs_b["event_log_entries"] / b, 2),
                "seconds_per_document": round(per_doc_single, 4),
                "range_runs_seconds_per_document": round(per_doc_range, 4),
                "ratio_single_over_range": round(per_doc_single / per_doc_range, 1),
                "llm_requests": base["llm_requests"],
                "all_completed": base["completed"] == b == base["documents"],
            }
            if base["completed"] != b or base["llm_requests"] != b:
                problems.append(
                    f"baseline: {base['completed']}/{b} COMPLETED, "
                    f"{base['llm_requests']} LLM requests"
                )
    out["ok"] = not problems
    out["problems"] = problems
    return out


def print_human(result: dict[str, Any]) -> None:
    p = result["parameters"]
    print(f"command:  {result['command']}")
    print(f"commit:   {result['git_commit'] or 'unknown'}")
    m = result["machine"]
    print(
        f"machine:  {m['nproc']} cores, Python {m['python']}, dagster {m['dagster']}, {m['platform']}"
    )
    if m["loadavg"]:
        print(
            f"load:     {' '.join(map(str, m['loadavg']))} at start, "
            f"{' '.join(map(str, m['loadavg_at_end']))} at end (1/5/15-min load averages; "
            "anything else running skews the numbers)"
        )
    if result["dagster_env"]:
        print("env:      " + " ".join(f"{k}={v}" for k, v in result["dagster_env"].items()))
    print(
        f"settings: {p['documents']} documents, latency {p['latency_ms']} ms, LLM concurrency "
        f"{p['concurrency']}, {result['main']['documents_per_run']} documents per run, "
        f"simulator max_concurrency {p['simulator_max_concurrency']}"
    )
    print()
    a = result["main"]
    rows = [
        ("documents", a["documents"]),
        ("runs", f"{a['runs']} ({a['failed_runs']} failed)"),
        ("wall seconds", f"{a['wall_seconds']:.2f}"),
        ("ideal seconds (N×L/concurrency)", f"{a['ideal_seconds']:.2f}"),
        ("wall / ideal", f"{a['wall_over_ideal']:.2f}×" if a["wall_over_ideal"] else "-"),
        ("CPU seconds (whole process)", f"{a['cpu_seconds']:.2f}"),
        ("documents / second", f"{a['docs_per_second']:.2f}"),
        (
            "mean LLM requests in flight (N×L/wall)",
            f"{a['mean_llm_requests_in_flight']:.2f} of {p['concurrency']}",
        ),
        ("seconds creating runs (create → start)", f"{a['seconds_creating_runs']:.2f}"),
        ("seconds executing runs (start → end)", f"{a['seconds_executing_runs']:.2f}"),
        ("seconds outside runs (intake, report)", f"{a['seconds_outside_runs']:.2f}"),
        ("mean seconds per run", a["mean_seconds_per_run"]),
        (
            "event log entries written",
            f"{a['event_log_entries']} ({a['event_log_entries_per_document']} per document)",
        ),
        ("LLM requests at the simulator", f"{a['llm_requests']} (expected {a['documents']})"),
        ("simulator peak in flight", a["simulator_peak_in_flight"]),
        ("all documents COMPLETED", a["all_completed"]),
    ]
    s = result["second_pass"]
    rows += [
        ("second pass: wall seconds", f"{s['wall_seconds']:.2f}"),
        ("second pass: runs", s["runs"]),
        ("second pass: new LLM requests", f"{s['llm_requests']} (expected 0)"),
    ]
    base = result.get("baseline_one_run_per_document")
    if base:
        rows += [
            ("baseline: documents (1 per run)", base["documents"]),
            ("baseline: wall seconds", f"{base['wall_seconds']:.2f}"),
            ("baseline: mean seconds per run", base["mean_seconds_per_run"]),
            ("baseline: event log entries per document", base["event_log_entries_per_document"]),
            ("seconds/document, one run per doc", f"{base['seconds_per_document']:.3f}"),
            ("seconds/document, range runs", f"{base['range_runs_seconds_per_document']:.3f}"),
            ("ratio (one-per-doc / range)", f"{base['ratio_single_over_range']}×"),
        ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print()
    print(
        "main pass, event log entries by type: "
        + ", ".join(f"{k} {v}" for k, v in a["event_log_entries_by_type"].items())
    )
    print()
    print("OK" if result["ok"] else "FAILED: " + "; ".join(result["problems"]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--documents", type=int, default=500, help="documents in the inbox (default: %(default)s)"
    )
    p.add_argument(
        "--latency-ms", type=int, default=200, help="simulated LLM latency (default: %(default)s)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="AI_PIPELINE_LLM_CONCURRENCY (default: %(default)s)",
    )
    p.add_argument(
        "--documents-per-run",
        type=int,
        default=None,
        help="AI_PIPELINE_DOCUMENTS_PER_RUN (default: the setting's default)",
    )
    p.add_argument(
        "--baseline-documents",
        type=int,
        default=20,
        help="documents for the one-run-per-document baseline; 0 skips it (default: %(default)s)",
    )
    p.add_argument(
        "--dagster-yaml",
        type=Path,
        default=REPO / "dagster.yaml",
        help="the instance's dagster.yaml, to compare storages (default: the checkout's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.documents < 1
        or args.latency_ms < 0
        or args.concurrency < 1
        or args.baseline_documents < 0
    ):
        print(
            "throughput.py: --documents and --concurrency must be ≥ 1, latency and baseline ≥ 0",
            file=sys.stderr,
        )
        return 2
    raw_argv = sys.argv[1:] if argv is None else argv
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv[:1], *raw_argv])

    # Imports are paid once per process, not per document: keep them out of the timed passes.
    t0 = time.perf_counter()
    import dagster  # noqa: F401

    import ai_pipeline.cli  # noqa: F401
    import ai_pipeline.definitions  # noqa: F401

    import_seconds = time.perf_counter() - t0

    machine_before = machine_info()
    saved_env = dict(os.environ)
    started_at = datetime.now(timezone.utc)
    try:
        with tempfile.TemporaryDirectory(prefix="aip-throughput-") as tmp:
            measured = benchmark(args, Path(tmp))
            from ai_pipeline.store import dispose_stores

            dispose_stores()
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    result = {
        "command": command,
        "git_commit": git_commit(),
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": {**machine_before, "loadavg_at_end": machine_info()["loadavg"]},
        # Dagster's own switches change what is measured (e.g. how planned events are written).
        "dagster_env": {
            k: v
            for k, v in sorted(saved_env.items())
            if k.startswith("DAGSTER_") and k != "DAGSTER_HOME"
        },
        "parameters": {
            "documents": args.documents,
            "latency_ms": args.latency_ms,
            "concurrency": args.concurrency,
            "documents_per_run": measured["main"]["documents_per_run"],
            "baseline_documents": args.baseline_documents,
            "simulator_max_concurrency": max(2 * args.concurrency, args.concurrency + 1),
        },
        "import_seconds": round(import_seconds, 3),
        **measured,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_human(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
