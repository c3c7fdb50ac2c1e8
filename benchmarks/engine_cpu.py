"""The batch engine's CPU per document, without Dagster: one checkout against others, in turns.

Each pass is a process of its own running one checkout's ``Analyser`` + ``run_batch`` over N
short documents on a fresh SQLite results database, against the bundled simulator (in a process
of its own, latency L) with C calls in flight. The pass reports the CPU seconds of its process per
document (the engine's threads: its event loop, the LLM client, the results database) and, with
``--count``, the statements and commits it sent the results database per document, by statement
(a second pass, as counting costs CPU itself). The checkouts take turns, ``--rounds`` times, so
that a change in the machine's load weighs on all alike; the report gives each checkout's median
and the ratio of each to the first.

    python benchmarks/engine_cpu.py [--documents 2000] [--latency-ms 50] [--concurrency 16]
        [--rounds 3] [--count] [--json] [CHECKOUT ...]

With no CHECKOUT it measures this one. A checkout is a directory holding ``ai_pipeline`` (e.g. a
``git worktree add /tmp/base <commit>``); it is put first on ``PYTHONPATH`` of its passes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import REPO, report_header  # noqa: E402

# One pass, run as ``python -c`` in the checkout's environment; prints its figures as JSON.
_PASS = r"""
import collections, json, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from claims import register_sample_documents

from ai_pipeline.batch import run_batch
from ai_pipeline.engine import Analyser
from ai_pipeline.llm import LLMClient
from ai_pipeline.retry import NullLog
from ai_pipeline.store import Store

base_url, n, concurrency, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
store = Store(f"sqlite:///{Path(tempfile.mkdtemp()) / 'results.sqlite'}")
ids = register_sample_documents(store, n)
statements = collections.Counter()
commits = 0
if count:
    from sqlalchemy import event

    @event.listens_for(store.db.engine, "before_cursor_execute")
    def _statement(conn, cursor, statement, params, context, executemany):
        statements[" ".join(statement.split()[:3])] += 1

    @event.listens_for(store.db.engine, "commit")
    def _commit(conn):
        global commits
        commits += 1

client = LLMClient(base_url=base_url, api_key="bench", model="sim-analyst-1", max_concurrency=concurrency)
analyser = Analyser(store, client, store.results, log=NullLog(), run_id="bench-run")
cpu, wall = time.process_time(), time.perf_counter()
done = sum(1 for _ in run_batch(analyser, ids))
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({
    "documents": done,
    "results": store.results.count(),
    "cpu_ms_per_document": 1000 * cpu / n,
    "wall_seconds": wall,
    "statements_per_document": sum(statements.values()) / n if count else None,
    "commits_per_document": commits / n if count else None,
    "by_statement": {k: v / n for k, v in statements.most_common()} if count else None,
}))
"""


def run_pass(checkout: Path, code: str, *argv: str) -> dict[str, Any]:
    """Run ``code`` with ``argv`` as ``python -c`` in a checkout's directory, the checkout first on
    its ``PYTHONPATH`` and no ``AI_PIPELINE_`` setting of this process; the JSON object its last
    line prints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=checkout, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"FAILED: a pass of {checkout}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def in_turns(
    checkouts: list[Path],
    rounds: int,
    one_pass: Callable[[Path], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str] | None,
) -> dict[Path, list[dict[str, Any]]]:
    """Each checkout's passes, the checkouts taking turns ``rounds`` times, so that the machine's
    changes of load weigh on all alike; with ``describe``, a line on each pass as it ends."""
    passes: dict[Path, list[dict[str, Any]]] = {c: [] for c in checkouts}
    for round_ in range(rounds):
        for checkout in checkouts:
            figures = one_pass(checkout)
            passes[checkout].append(figures)
            if describe is not None:
                print(f"round {round_ + 1} {checkout}: {describe(figures)}", flush=True)
    return passes


def finish_report(
    report: dict[str, Any],
    problems: list[str],
    as_json: bool,
    describe: Callable[[dict[str, Any]], str],
    preface: Sequence[str] = (),
) -> int:
    """Print a side-by-side report (``report["checkouts"]``: each checkout's entry) as JSON, or as
    ``preface`` then a line per checkout (its path, commit and ``describe(entry)``), with the
    load at the end and the problems; the exit status: 1 when there are problems."""
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["problems"] = problems
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for line in preface:
            print(line)
        for checkout, entry in report["checkouts"].items():
            print(f"{checkout} ({entry['commit']}): {describe(entry)}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def one_pass(checkout: Path, base_url: str, args: argparse.Namespace, count: bool) -> dict:
    return run_pass(
        checkout,
        _PASS,
        str(checkout / "benchmarks"),  # its claims.py puts the checkout first on the path
        base_url,
        str(args.documents),
        str(args.concurrency),
        "1" if count else "0",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, help="default: this checkout")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", action="store_true", help="also count the statements")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts] or [REPO]

    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    report: dict[str, Any] = {**report_header(), "checkouts": {}}
    config = SimulatorConfig(latency_ms=args.latency_ms, max_concurrency=4 * args.concurrency)
    problems = []
    with SimulatorServer(config) as simulator:
        passes = in_turns(
            checkouts,
            args.rounds,
            lambda checkout: one_pass(checkout, simulator.base_url, args, count=False),
            None
            if args.json
            else lambda f: f"{f['cpu_ms_per_document']:.2f} ms of CPU per document",
        )
        counted = {c: one_pass(c, simulator.base_url, args, True) for c in checkouts if args.count}
    first = statistics.median(p["cpu_ms_per_document"] for p in passes[checkouts[0]])
    for checkout in checkouts:
        median = statistics.median(p["cpu_ms_per_document"] for p in passes[checkout])
        entry: dict[str, Any] = {
            "commit": commit_of(checkout),
            "cpu_ms_per_document": [round(p["cpu_ms_per_document"], 2) for p in passes[checkout]],
            "median_cpu_ms_per_document": round(median, 2),
            "ratio_to_first": round(median / first, 3),
        }
        if checkout in counted:
            c = counted[checkout]
            entry.update(
                statements_per_document=round(c["statements_per_document"], 2),
                commits_per_document=round(c["commits_per_document"], 2),
                by_statement={k: round(v, 2) for k, v in c["by_statement"].items()},
            )
        report["checkouts"][str(checkout)] = entry
        if any(
            p["documents"] != args.documents or p["results"] != args.documents
            for p in passes[checkout]
        ):
            problems.append(f"{checkout}: not every document got its result row")
    return finish_report(
        report,
        problems,
        args.json,
        lambda entry: (
            f"median {entry['median_cpu_ms_per_document']} ms per document, "
            f"{entry['ratio_to_first']}× the first"
            + (
                f"; {entry['statements_per_document']} statements, "
                f"{entry['commits_per_document']} commits per document"
                if "statements_per_document" in entry
                else ""
            )
        ),
    )


def commit_of(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "ai_pipeline"],
        cwd=checkout,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    raise SystemExit(main())
