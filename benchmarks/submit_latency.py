"""How fast ``POST /api/v1/tasks`` answers, with the run queue idle and with it full.

In temporary folders: a fresh DAGSTER_HOME (the checkout's ``dagster.yaml``: four runs at once),
the bundled simulator over HTTP in this process with a slow LLM (``--latency-ms``, so runs stay
busy), ``ai-pipeline serve`` as its own process under uvicorn, and a real ``dagster-daemon``.

1. *Idle*: ``--submissions`` documents submitted one after another, timed at the client, while
   no daemon runs (nothing is queued or running).
2. *Queued*: the daemon starts with one document per run; once runs are QUEUED behind the four
   running ones, ``--submissions`` more are timed the same way.

Both sets of latencies (median, 95th percentile, maximum) are measured in this one run, side by
side, with the ratio queued / idle; the acceptance asks for under 200 ms while runs are queued.
Exit code 0 when every submission got 202, 1 otherwise.

    python benchmarks/submit_latency.py [--submissions 30] [--latency-ms 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (  # noqa: E402
    REPO,
    background,
    dagster_daemon,
    document_text,
    git_commit,
    machine_info,
)

KEY = "bench-tenant-key"
MODEL = "sim-analyst-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed_submissions(url: str, first: int, n: int) -> list[float]:
    import httpx

    latencies = []
    with httpx.Client(timeout=30) as client:
        for i in range(first, first + n):
            started = time.perf_counter()
            response = client.post(
                f"{url}/api/v1/tasks",
                json={"text": document_text(i), "name": f"doc-{i}.txt"},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            latencies.append(time.perf_counter() - started)
            if response.status_code != 202:
                raise SystemExit(f"FAILED: submission {i}: {response.status_code} {response.text}")
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=30)
    parser.add_argument("--latency-ms", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import dagster as dg
    import httpx

    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    root = Path(tempfile.mkdtemp(prefix="aip-submit-"))
    home = root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text(), encoding="utf-8")
    tenants = root / "tenants.yaml"
    tenants.write_text(f"tenants:\n  bench:\n    keys: [{KEY}]\n", encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with SimulatorServer(SimulatorConfig(latency_ms=args.latency_ms)) as simulator:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
        env.update(
            DAGSTER_HOME=str(home),
            AI_PIPELINE_TENANTS_FILE=str(tenants),
            AI_PIPELINE_DOCUMENTS_PER_RUN="1",
            AI_PIPELINE_LLM_CONCURRENCY="1",
            OPENAI_BASE_URL=simulator.base_url,
            OPENAI_API_KEY="sim-bench-key",
            AI_PIPELINE_MODEL=MODEL,
        )
        serve_argv = [sys.executable, "-m", "ai_pipeline.cli", "serve", "--port", str(port)]
        with background(serve_argv, env, root / "serve.log") as serve:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/openapi.json", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or serve.poll() is not None:
                    raise SystemExit(f"FAILED: the service did not start; see {root}/serve.log")
                time.sleep(0.5)
            timed_submissions(url, 10**6, 3)  # warm: first connections, first queries
            idle = timed_submissions(url, 0, args.submissions)
            with dagster_daemon(env, root / "daemon.log"):
                os.environ["DAGSTER_HOME"] = str(home)
                with dg.DagsterInstance.get() as instance:
                    queued_filter = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])
                    deadline = time.monotonic() + 300
                    while len(instance.get_runs(filters=queued_filter)) < 4:
                        if time.monotonic() > deadline:
                            raise SystemExit("FAILED: no runs queued within 300 s")
                        time.sleep(1)
                    before = len(instance.get_runs(filters=queued_filter))
                    queued = timed_submissions(url, 10**5, args.submissions)
                    after = len(instance.get_runs(filters=queued_filter))
    result: dict[str, Any] = {
        "commit": git_commit(),
        "machine": machine_info(),
        "submissions_each": args.submissions,
        "llm_latency_ms": args.latency_ms,
        "idle": summary(idle),
        "queued": summary(queued),
        "runs_queued_before_and_after": [before, after],
    }
    result["ratio_median_queued_to_idle"] = round(
        result["queued"]["median_ms"] / result["idle"]["median_ms"], 2
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for phase in ("idle", "queued"):
            s = result[phase]
            print(
                f"{phase:>6}: median {s['median_ms']} ms, p95 {s['p95_ms']} ms, "
                f"max {s['max_ms']} ms ({args.submissions} submissions)"
            )
        print(
            f"queued / idle median: {result['ratio_median_queued_to_idle']}×; runs QUEUED "
            f"before/after the timed submissions: {before}/{after}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
