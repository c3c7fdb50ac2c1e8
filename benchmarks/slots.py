"""Whether a run keeps its LLM slots busy: the batch engine alone, its calls timed at the client.

``Analyser`` + ``run_batch`` (no Dagster) over N documents on a fresh SQLite results database,
against the bundled simulator in a process of its own with latency L, C calls in flight. Two
variants, interleaved, on the same machine in one run:

- ``window``: as shipped — at most two documents per slot are worked on at once
  (``ai_pipeline.window``);
- ``all at once``: every document of the batch admitted at the start (a window as large as the
  batch), as the engine did before.

For each it prints the wall time against the LLM-bound N×L/C, when the second call went out (the
first goes alone, to prove the endpoint), the mean and median time a slot stays idle between a
reply and the next call it carries, and the mean call time as the client sees it.

    python benchmarks/slots.py [--documents 2500] [--latency-ms 250] [--concurrency 4]
                               [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from claims import register_sample_documents  # noqa: E402

from ai_pipeline.batch import run_batch  # noqa: E402
from ai_pipeline.engine import Analyser  # noqa: E402
from ai_pipeline.llm import LLMClient  # noqa: E402
from ai_pipeline.retry import NullLog  # noqa: E402
from ai_pipeline.store import Store  # noqa: E402


def serve(urls: Any, latency_ms: int) -> None:
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    with SimulatorServer(SimulatorConfig(latency_ms=latency_ms)) as server:
        urls.put(server.base_url)
        while True:
            time.sleep(3600)


def one_pass(base_url: str, n: int, concurrency: int, window: int | None, tmp: Path) -> dict:
    store = Store(f"sqlite:///{tmp / f'slots-{time.monotonic_ns()}.sqlite'}")
    try:
        ids = register_sample_documents(store, n)
        client = LLMClient(
            base_url=base_url, api_key="bench", model="sim-analyst-1", max_concurrency=concurrency
        )
        sent: list[float] = []
        answered: list[float] = []
        durations: list[float] = []
        create = client._client.chat.completions.create

        async def timed_create(*args: Any, **kwargs: Any) -> Any:
            at = time.perf_counter()
            sent.append(at)
            try:
                return await create(*args, **kwargs)
            finally:
                answered.append(time.perf_counter())
                durations.append(answered[-1] - at)

        client._client.chat.completions.create = timed_create  # type: ignore[method-assign]
        analyser = Analyser(store, client, store.results, log=NullLog(), run_id="bench-run")
        started = time.perf_counter()
        done = sum(1 for _ in run_batch(analyser, ids, window=window))
        wall = time.perf_counter() - started
        assert done == n and store.results.count() == n, (done, store.results.count())
    finally:
        store.db.dispose()
    sent.sort()
    answered.sort()
    # The k-th reply frees a slot; the call sent next after the first C fills it.
    idle = [sent[i + concurrency] - answered[i] for i in range(n - concurrency)]
    return {
        "wall_seconds": round(wall, 2),
        "second_call_after_seconds": round(sent[1] - started, 3),
        "slot_idle_ms_mean": round(1000 * statistics.mean(idle), 2),
        "slot_idle_ms_median": round(1000 * statistics.median(idle), 2),
        "call_ms_mean": round(1000 * statistics.mean(durations), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=2500)
    parser.add_argument("--latency-ms", type=int, default=250)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="passes per variant, interleaved")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n, c, latency = args.documents, args.concurrency, args.latency_ms
    ideal = n * latency / 1000 / c
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    report: dict[str, Any] = {
        "documents": n,
        "latency_ms": latency,
        "concurrency": c,
        "ideal_seconds": ideal,
        "commit": commit,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "load_at_start": os.getloadavg(),
        "variants": {},
    }
    urls: Any = multiprocessing.Queue()
    simulator = multiprocessing.Process(target=serve, args=(urls, latency), daemon=True)
    simulator.start()
    try:
        base_url = urls.get(timeout=60)
        passes: dict[str, list[dict]] = {"window": [], "all at once": []}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                for name, window in (("window", None), ("all at once", n)):
                    passes[name].append(one_pass(base_url, n, c, window, Path(tmp)))
    finally:
        simulator.kill()
    for name, results in passes.items():
        median = {k: statistics.median(r[k] for r in results) for k in results[0]}
        median["efficiency"] = round(ideal / median["wall_seconds"], 4)
        report["variants"][name] = median
    report["wall_ratio_all_at_once_to_window"] = round(
        report["variants"]["all at once"]["wall_seconds"]
        / report["variants"]["window"]["wall_seconds"],
        3,
    )
    report["load_at_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{n} documents, latency {latency} ms, {c} in flight: LLM-bound {ideal:.1f} s")
    print(f"commit {commit}, load {report['load_at_start']} at the start")
    for name, r in report["variants"].items():
        print(
            f"  {name:12} wall {r['wall_seconds']:8.2f} s ({100 * r['efficiency']:.1f} %), "
            f"second call after {r['second_call_after_seconds']:.3f} s, slot idle "
            f"{r['slot_idle_ms_mean']:.2f} ms mean / {r['slot_idle_ms_median']:.2f} median, "
            f"a call {r['call_ms_mean']:.1f} ms"
        )
    print(f"  all at once / window: {report['wall_ratio_all_at_once_to_window']}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
