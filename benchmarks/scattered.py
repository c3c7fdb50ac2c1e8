"""A failed-only backfill of scattered failures against the first pass, under a real daemon.

A fresh DAGSTER_HOME (SQLite, ``max_concurrent_runs`` = ``--runs``), a real ``dagster-daemon``, the
bundled simulator in this process (latency L, ``--runs`` × per-run concurrency = C calls at once).
First pass: ``ai-pipeline submit DIR --batch … --wait`` over ``--documents`` documents, every
``--fail-every``-th of which gets a scripted 503 three times (its two retries included: it fails
NETWORK_TIMEOUT, retryable). Then the faults are cleared and the failed documents are rerun:

- ``--via cli``: ``ai-pipeline backfill --failed --wait``, as an operator types it;
- ``--via ui``: the backfill the UI's **Failed → Launch backfill** creates (the same
  ``PartitionBackfill`` constructor as its GraphQL mutation, for the partitions Dagster shows
  FAILED), waited for until its runs have ended every document. The ``backfill_planner``
  sensor plans it in runs of the run size and starts them, unless the daemon's 30 s backfill
  loop planned it first (Dagster's plan: one run per stretch of contiguous documents); the
  report says which (``planned_by``).

It reports, for both passes, wall seconds, seconds per document and runs, the failed-only pass's
seconds per document over the first pass's, its runs against ``ceil(failed / run size) +
max_concurrent_runs``, and the LLM requests of each pass (the rerun must make one per failed
document, none for the others).

    python benchmarks/scattered.py [--documents 1000] [--fail-every 20] [--latency-ms 1000]
        [--concurrency 16] [--runs 4] [--run-size 100] [--via cli|ui] [--stock] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (  # noqa: E402
    REPO,
    daemon_serving,
    dagster_daemon,
    document_id,
    instance_yaml,
    make_inbox,
    report_header,
)

API_KEY = "sim-bench-key"
MODEL = "sim-analyst-1"


def _cli(env: dict[str, str], *argv: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ai_pipeline.cli", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if not done.stdout.strip():
        raise SystemExit(
            f"FAILED: {' '.join(argv)} exited {done.returncode}: {done.stderr[-3000:]}"
        )
    return dict(json.loads(done.stdout))


def _ui_backfill(env: dict[str, str], timeout: float) -> dict[str, Any]:
    """What the UI's "Failed" backfill does, in this process against the benchmark's instance:
    a backfill of the partitions Dagster shows FAILED, created as the UI creates it."""
    os.environ.update(env)
    import dagster as dg

    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.assets import ANALYSIS_KEYS, ANALYSIS_RESULTS
    from ai_pipeline.defs.backfills import new_backfill_id, wait_for_backfill
    from ai_pipeline.defs.dagster_private import PartitionBackfill
    from ai_pipeline.defs.partitions import PARTITIONS_NAME, documents_partitions
    from ai_pipeline.settings import Settings
    from ai_pipeline.store import open_store

    with dg.DagsterInstance.get() as instance:
        keys = instance.get_dynamic_partitions(PARTITIONS_NAME)
        status = instance.get_status_by_partition(ANALYSIS_RESULTS, keys, documents_partitions)
        failed = [k for k, v in (status or {}).items() if v == dg.AssetPartitionStatus.FAILED]
        backfill_id = new_backfill_id()
        instance.add_backfill(
            PartitionBackfill.from_asset_partitions(
                backfill_id=backfill_id,
                asset_graph=defs.get_repository_def().asset_graph,
                partition_names=failed,
                asset_selection=list(ANALYSIS_KEYS),
                backfill_timestamp=time.time(),
                tags={},
                dynamic_partitions_store=instance,
                all_partitions=False,
                title=None,
                description=None,
                run_config=None,
            )
        )
        store = open_store(Settings.load())
        status_value = wait_for_backfill(
            instance,
            backfill_id,
            timeout=timeout,
            ended_in=lambda runs: store.documents.ended_in(failed, runs),
        )
        return {"backfill_id": backfill_id, "status": status_value, "selected": failed}


def _runs_of(env: dict[str, str], backfill_id: str | None) -> dict[str, Any]:
    """The runs Dagster launched for a backfill (None: every run of the instance): how many, how
    many of them this package planned (they carry its ``ai_pipeline/documents`` tag), and the
    epoch seconds of the first creation, the first and last start and the last end."""
    code = (
        "import dagster as dg, json, sys\n"
        "with dg.DagsterInstance.get() as i:\n"
        "    f = dg.RunsFilter(tags={'dagster/backfill': sys.argv[1]}) if sys.argv[1] else None\n"
        "    records = i.get_run_records(filters=f)\n"
        "    starts = [r.start_time for r in records if r.start_time]\n"
        "    ends = [r.end_time for r in records if r.end_time]\n"
        "    print(json.dumps({'runs': len(records),\n"
        "        'planned_here': sum('ai_pipeline/documents' in r.dagster_run.tags for r in records),\n"
        "        'working': sum('ai_pipeline/replaced_by' not in r.dagster_run.tags for r in records),\n"
        "        'created': min((r.create_timestamp.timestamp() for r in records), default=None),\n"
        "        'first_start': min(starts, default=None), 'last_start': max(starts, default=None),\n"
        "        'last_end': max(ends, default=None)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, backfill_id or ""],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def _since(start: float, at: float | str | None) -> float | None:
    """Seconds from epoch ``start`` to ``at`` (epoch seconds or an ISO time), or None."""
    if at is None:
        return None
    if isinstance(at, str):
        at = datetime.fromisoformat(at).timestamp()
    return round(at - start, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--fail-every", type=int, default=20)
    parser.add_argument("--latency-ms", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16, help="total LLM calls in flight")
    parser.add_argument("--runs", type=int, default=4, help="runs at once (max_concurrent_runs)")
    parser.add_argument(
        "--run-size",
        type=int,
        default=None,
        help="documents per backfill run (AI_PIPELINE_BACKFILL_RUN_SIZE); default: unset, so the "
        "product sizes each backfill's runs to fill the run slots",
    )
    parser.add_argument("--via", choices=["cli", "ui"], default="cli")
    parser.add_argument(
        "--stock",
        action="store_true",
        help="Dagster's own SQLite storage instead of the accelerator's (dagster.yaml)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from ai_pipeline.defs.backfills import backfill_run_size
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    root = Path(tempfile.mkdtemp(prefix="aip-scattered-"))
    report: dict[str, Any] = {
        **report_header(),
        "llm_bound_docs_per_second": args.concurrency / (args.latency_ms / 1000),
    }
    try:
        home = root / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(
            instance_yaml(args.runs, accelerated=not args.stock), encoding="utf-8"
        )
        inbox = make_inbox(root / "inbox", range(args.documents))
        failing = [document_id(i) for i in range(0, args.documents, args.fail_every)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
        config = SimulatorConfig(latency_ms=args.latency_ms, max_concurrency=2 * args.concurrency)
        with SimulatorServer(config) as simulator:
            env.update(
                DAGSTER_HOME=str(home),
                AI_PIPELINE_DATABASE_URL=f"sqlite:///{home / 'ai_pipeline.sqlite'}",
                AI_PIPELINE_SETTLE_SECONDS="0",
                AI_PIPELINE_LLM_CONCURRENCY=str(max(1, args.concurrency // args.runs)),
                **({"AI_PIPELINE_BACKFILL_RUN_SIZE": str(args.run_size)} if args.run_size else {}),
                OPENAI_BASE_URL=simulator.base_url,
                OPENAI_API_KEY=API_KEY,
                AI_PIPELINE_MODEL=MODEL,
            )
            simulator.set_faults(
                [{"kind": "status", "status": 503, "match": d, "times": 3} for d in failing]
            )
            with dagster_daemon(env, root / "daemon.log"):
                daemon_serving(home, env)
                started = time.perf_counter()
                first = _cli(env, "submit", str(inbox), "--batch", "scattered", "--wait", "--json")
                first_wall = time.perf_counter() - started
                first_runs = _runs_of(env, None)["runs"]
                requests_before = simulator.stats()["total"]
                simulator.set_faults([])
                started = time.perf_counter()
                started_at = time.time()
                if args.via == "cli":
                    rerun = _cli(env, "backfill", "--failed", "--wait", "--json")
                    selected = [d["document_id"] for d in rerun["selected"]]
                else:
                    rerun = _ui_backfill(env, timeout=3600)
                    selected = rerun["selected"]
                rerun_wall = time.perf_counter() - started
                runs = _runs_of(env, rerun["backfill_id"])
                stats = simulator.stats()
                rerun_requests = stats["total"] - requests_before
                asked = (
                    [r["at"] for r in stats["requests"][-rerun_requests:]] if rerun_requests else []
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    failed = len(selected)
    first_per_doc = first_wall / args.documents
    rerun_per_doc = rerun_wall / max(1, failed)
    # The rerun's run size: the one set, or the one the product chose for the failed documents.
    run_size = args.run_size or backfill_run_size(
        failed, args.runs, max(1, args.concurrency // args.runs)
    )
    bound = math.ceil(failed / max(1, run_size)) + args.runs
    report.update(
        {
            "first_pass": {
                "documents": args.documents,
                "failed": first["failed"],
                "wall_seconds": round(first_wall, 1),
                "seconds_per_document": round(first_per_doc, 4),
                "runs": first_runs,
            },
            "failed_only": {
                "via": args.via,
                "documents": failed,
                "status": rerun.get("status"),
                "wall_seconds": round(rerun_wall, 1),
                "seconds_per_document": round(rerun_per_doc, 4),
                "storage": "Dagster's own" if args.stock else "accelerated",
                "runs": runs["runs"],
                "working_runs": runs["working"],
                "runs_bound": bound,
                "planned_by": "this package" if runs["planned_here"] == runs["runs"] else "Dagster",
                "llm_requests": rerun_requests,
                # Seconds from the rerun's start: where its wall time goes.
                "timeline": {
                    "runs_created": _since(started_at, runs["created"]),
                    "first_run_started": _since(started_at, runs["first_start"]),
                    "last_run_started": _since(started_at, runs["last_start"]),
                    "first_request": _since(started_at, min(asked, default=None)),
                    "last_request": _since(started_at, max(asked, default=None)),
                    "last_run_ended": _since(started_at, runs["last_end"]),
                    "returned": round(rerun_wall, 2),
                },
            },
            "seconds_per_document_over_first_pass": round(rerun_per_doc / first_per_doc, 2),
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    problems = []
    if runs["working"] > bound:
        problems.append(f"{runs['working']} runs worked, over the bound of {bound}")
    if failed != len(failing) or first["failed"] != len(failing):
        problems.append(f"{first['failed']} failed in the first pass, {failed} selected")
    if rerun_requests != failed:
        problems.append(f"{rerun_requests} LLM requests for {failed} documents")
    report["problems"] = problems
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['command']}  (commit {report['commit']})")
        for section in ("first_pass", "failed_only"):
            for key, value in report[section].items():
                print(f"  {section:<12} {key:<22} {value}")
        print(
            f"  seconds per document over the first pass: {report['seconds_per_document_over_first_pass']}"
        )
        print(f"  load: start {report['machine'].get('loadavg')}, end {report['loadavg_end']}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
