"""Does declaring an analysis cost anything per document? The production path (``production.py``)
with the built-in ``document_analysis`` and with a declared copy of it, alternately, side by side.

The copy (``DECLARED``, below) is what a team's declaration is to the machinery: another name, task
ids with a fingerprint of the declaration, its own results table — the same instructions and
output model, so the simulator's work is the same. Each round runs both, in alternating order;
the report gives each figure's median and the ratio declared / built-in.

    python benchmarks/declared.py [--rounds 3] [--documents 300] [--latency-ms 1000]
        [--concurrency 16] [--runs 4]

Exit code 0 when every pass completed every document with one request each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from ai_pipeline.analyses import DOCUMENT_ANALYSIS

HERE = Path(__file__).resolve().parent
DECLARED = DOCUMENT_ANALYSIS.model_copy(update={"name": "declared_analysis", "fingerprint": True})
FIGURES = ("docs_per_second", "cpu_seconds_per_document", "efficiency")


def one(args: argparse.Namespace, analysis: str | None) -> dict[str, float]:
    argv = [
        sys.executable,
        str(HERE / "production.py"),
        "--documents", str(args.documents),
        "--latency-ms", str(args.latency_ms),
        "--concurrency", str(args.concurrency),
        "--runs", str(args.runs),
        "--json",
    ]  # fmt: skip
    if analysis:
        argv += ["--analysis", analysis]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"production.py failed ({analysis or 'built-in'}):\n{done.stderr[-2000:]}")
    main = json.loads(done.stdout)["main"]
    return {k: float(main[k]) for k in FIGURES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--latency-ms", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    declared = "declared:DECLARED"
    seen: dict[str, list[dict[str, float]]] = {"built-in": [], "declared": []}
    for i in range(args.rounds):
        order = [("built-in", None), ("declared", declared)]
        for name, analysis in order if i % 2 == 0 else reversed(order):
            seen[name].append(one(args, analysis))
            print(f"round {i + 1} {name}: {seen[name][-1]}", file=sys.stderr)
    print(f"{'figure':<28}{'built-in':>12}{'declared':>12}{'declared/built-in':>20}")
    for figure in FIGURES:
        a = statistics.median(r[figure] for r in seen["built-in"])
        b = statistics.median(r[figure] for r in seen["declared"])
        print(f"{figure:<28}{a:>12.4f}{b:>12.4f}{b / a if a else float('nan'):>20.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
