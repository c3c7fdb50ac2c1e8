"""Throughput of the scale-out deployment (deploy/scale-out/) with 1, 2 and 3 worker hosts.

Each pass builds what ``ai_pipeline_tests/test_scale_out.py`` builds — worker hosts as network
namespaces (``ai_pipeline_tests.hosts``), a Redis broker, a ``socat`` forward to the machine's
PostgreSQL (databases of its own, dropped afterwards) and the simulator, all on the bridge address
only, a ``dagster-daemon`` launching runs through the scale-out ``dagster.yaml`` — then runs
``ai-pipeline submit DIR --wait`` over N fresh documents and reports documents per second and the
CPU seconds per document used by each worker host's processes (read from /proc just before the
host is stopped). Runs at once = hosts × ``--worker-runs`` (the run queue's cap grows with the
hosts); the LLM-bound limit is runs × ``--llm-concurrency`` / latency.

    python benchmarks/scale_out.py [--hosts 1 2 3] [--documents 300] [--latency-ms 200]
        [--worker-runs 2] [--llm-concurrency 8] [--run-size 25] [--json]

Needs root (namespaces), socat, redis-server, PostgreSQL on 127.0.0.1:5432 and
``pip install -e ".[test]"``. Exit code 0 when every pass completed every document with exactly
one LLM request each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ai_pipeline_tests.dagster_procs import DagsterProcess, running  # noqa: E402
from ai_pipeline_tests.hosts import Host, Network  # noqa: E402
from ai_pipeline_tests.postgres import PG_USER, PostgresDatabases  # noqa: E402

DEPLOY = REPO / "deploy" / "scale-out"
API_KEY = "sim-bench-key"
MODEL = "sim-analyst-1"


def cpu_seconds(host: Host) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in host.pids():
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def linked_home(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "dagster.yaml").symlink_to(DEPLOY / "dagster.yaml")
    return folder


def one_pass(n_hosts: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    folder = root / f"hosts{n_hosts}"
    folder.mkdir()
    inbox = folder / "inbox"
    inbox.mkdir()
    for i in range(args.documents):
        (inbox / f"doc{i:05}.txt").write_text(
            f"Order {i} for Harbor Supplies (pass {n_hosts}) was delivered to Lisbon on time. "
            f"Customer Ana Ribeiro praised the packaging of shipment {i}.",
            encoding="utf-8",
        )
    dbs = PostgresDatabases()
    saved = dict(os.environ)
    try:
        with Network(n_hosts, folder) as network:
            address = network.address
            redis_port, pg_port = network.broker_and_postgres()
            runs = n_hosts * args.worker_runs
            config = SimulatorConfig(latency_ms=args.latency_ms, max_concurrency=4 * runs * 8)
            with SimulatorServer(config, host=address) as simulator:
                home = linked_home(folder / "main")
                os.environ.update(
                    DAGSTER_HOME=str(home),
                    DAGSTER_PG_HOST=address,
                    DAGSTER_PG_PORT=str(pg_port),
                    DAGSTER_PG_DB=dbs.create("dagster"),
                    DAGSTER_PG_USERNAME=PG_USER,
                    DAGSTER_PG_PASSWORD="",
                    AI_PIPELINE_CELERY_BROKER=f"redis://{address}:{redis_port}/0",
                    AI_PIPELINE_CELERY_BACKEND=f"redis://{address}:{redis_port}/1",
                    AI_PIPELINE_MAX_CONCURRENT_RUNS=str(runs),
                    AI_PIPELINE_DATABASE_URL=(
                        f"postgresql://{PG_USER}@{address}:{pg_port}/{dbs.create('results')}"
                    ),
                    AI_PIPELINE_BACKFILL_RUN_SIZE=str(args.run_size),
                    AI_PIPELINE_LLM_CONCURRENCY=str(args.llm_concurrency),
                    AI_PIPELINE_SETTLE_SECONDS="0",
                    OPENAI_BASE_URL=simulator.base_url,
                    OPENAI_API_KEY=API_KEY,
                    AI_PIPELINE_MODEL=MODEL,
                    AI_PIPELINE_WORKER_RUNS=str(args.worker_runs),
                    PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                )
                import dagster as dg

                with dg.DagsterInstance.get():
                    pass
                for host in network.hosts:
                    env = os.environ | {
                        "DAGSTER_HOME": str(linked_home(folder / host.name)),
                        "AI_PIPELINE_WORKER_NAME": f"worker-{host.name}",
                    }
                    host.start("worker", [str(DEPLOY / "worker.sh")], env)
                daemon = DagsterProcess.daemon(folder / "daemon.log")
                with running(daemon):
                    daemon.start()
                    deadline = time.monotonic() + 180
                    while not all(
                        " ready." in (folder / f"{h.name}-worker.log").read_text(errors="replace")
                        for h in network.hosts
                    ):
                        if time.monotonic() > deadline:
                            raise SystemExit("the workers did not start")
                        time.sleep(1)
                    time.sleep(3)  # the daemon's first heartbeat
                    cpu_before = {h.name: cpu_seconds(h) for h in network.hosts}
                    started = time.perf_counter()
                    out = subprocess.run(
                        [sys.executable, "-m", "ai_pipeline.cli", "submit", str(inbox)]
                        + ["--batch", f"bench{n_hosts}", "--wait", "--json"],
                        cwd=REPO,
                        capture_output=True,
                        text=True,
                    )
                    wall = time.perf_counter() - started
                    cpu = {h.name: cpu_seconds(h) - cpu_before[h.name] for h in network.hosts}
                    requests = simulator.stats()["total"]
                    with dg.DagsterInstance.get() as instance:
                        tags = [r.tags.get("ai_pipeline/worker_host") for r in instance.get_runs()]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        dbs.drop_all()
    summary = json.loads(out.stdout) if out.stdout.strip() else {}
    n = args.documents
    return {
        "hosts": n_hosts,
        "runs_at_once": runs,
        "llm_bound_docs_per_second": round(
            runs * args.llm_concurrency / (args.latency_ms / 1000), 1
        ),
        "succeeded": summary.get("succeeded"),
        "llm_requests": requests,
        "wall_seconds": round(wall, 1),
        "docs_per_second": round(n / wall, 2),
        "runs_per_host": {h: tags.count(h) for h in sorted({t for t in tags if t})},
        "cpu_seconds_per_document_per_host": {h: round(c / n, 4) for h, c in cpu.items()},
        "cpu_seconds_per_document_all_hosts": round(sum(cpu.values()) / n, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--worker-runs", type=int, default=2)
    parser.add_argument("--llm-concurrency", type=int, default=8)
    parser.add_argument("--run-size", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="aip-scale-out-"))
    passes = [one_pass(n, args, root) for n in args.hosts]
    report = {"command": " ".join(sys.argv), "cores": os.cpu_count(), "passes": passes}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for p in passes:
            print(json.dumps(p))
    ok = all(p["succeeded"] == args.documents == p["llm_requests"] for p in passes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
