"""``ai-pipeline``: run, watch and rehearse the pipeline from a terminal.

Commands that process documents go through Dagster against the project's instance
(``DAGSTER_HOME``), so what they do shows in the Dagster UI exactly like a sensor's runs.

Exit codes: 0 success, 1 some documents failed, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEMO_API_KEY = "sim-demo-key"
DEMO_MODEL = "sim-analyst-1"
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class UsageError(Exception):
    """A usage or configuration problem: printed as one line, exit code 2."""


def _ensure_dagster_home() -> Path:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        if Path("dagster.yaml").is_file():
            home = os.getcwd()
            os.environ["DAGSTER_HOME"] = home
        else:
            raise UsageError(
                "DAGSTER_HOME is not set and there is no dagster.yaml here: set DAGSTER_HOME to "
                "the folder holding the instance's dagster.yaml (the checkout, for the embedded "
                "default)"
            )
    path = Path(home).resolve()
    if not path.is_dir():
        raise UsageError(f"DAGSTER_HOME={home} is not a directory")
    return path


def _instance() -> Any:
    import dagster as dg

    _ensure_dagster_home()
    return dg.DagsterInstance.get()


# --- processing ----------------------------------------------------------------------------------


def process_inbox(inbox: Path, *, quiet: bool = False, verbose: bool = False) -> dict[str, Any]:
    """Register the inbox's files and analyse every document not yet completed, via Dagster."""
    import dagster as dg

    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.assets import ANALYSIS_RESULTS
    from ai_pipeline.defs.jobs import ANALYSIS_JOB_NAME, range_tags
    from ai_pipeline.defs.partitions import documents_partitions
    from ai_pipeline.documents import list_files
    from ai_pipeline.intake import contiguous_ranges, register_files, unique_in_order
    from ai_pipeline.settings import Settings
    from ai_pipeline.states import State
    from ai_pipeline.store import get_store

    if not inbox.is_dir():
        raise UsageError(f"inbox {inbox} is not a directory")
    settings = Settings.load()
    instance = _instance()
    store = get_store(settings.database_url)
    paths = list_files([inbox])
    registered = register_files(store, paths, max_bytes=settings.max_document_bytes)
    document_ids = unique_in_order(r.document_id for r in registered)
    partition_name = documents_partitions.name
    assert partition_name is not None
    missing = [d for d in document_ids if not instance.has_dynamic_partition(partition_name, d)]
    if missing:
        instance.add_dynamic_partitions(partition_name, missing)
    states = {d["document_id"]: d["state"] for d in store.get_documents(document_ids)}
    # Done means done in both places: a run killed after a document's results were written but
    # before Dagster heard of it leaves the document COMPLETED here and unmaterialized there; a
    # rerun re-reports it from its checkpoints without an LLM call.
    in_dagster = (
        instance.get_status_by_partition(ANALYSIS_RESULTS, document_ids, documents_partitions) or {}
    )
    todo = [
        d
        for d in document_ids
        if states.get(d) != State.COMPLETED.value
        or in_dagster.get(d) != dg.AssetPartitionStatus.MATERIALIZED
    ]
    _say(
        quiet,
        f"{len(paths)} files → {len(document_ids)} documents "
        f"({len(paths) - len(document_ids)} duplicates), {len(todo)} to analyse",
    )
    job = defs.resolve_job_def(ANALYSIS_JOB_NAME)
    ordered = instance.get_dynamic_partitions(partition_name)
    ranges = contiguous_ranges(todo, ordered, settings.documents_per_run)
    runs = []
    for i, batch in enumerate(ranges, 1):
        _say(quiet, f"run {i}/{len(ranges)}: {len(batch)} documents …")
        result = job.execute_in_process(
            instance=instance,
            tags=range_tags(batch),
            raise_on_error=False,
            # The run's events are in the instance (and the UI); the terminal gets the table.
            run_config=None if verbose else QUIET_RUN_CONFIG,
        )
        runs.append({"run_id": result.run_id, "documents": len(batch), "success": result.success})
        _say(quiet, f"run {i}/{len(ranges)}: {'succeeded' if result.success else 'had failures'}")
    return {"inbox": str(inbox), "files": len(paths), "runs": runs, **_report(document_ids)}


def _report(document_ids: Sequence[str] | None = None) -> dict[str, Any]:
    from ai_pipeline.settings import Settings
    from ai_pipeline.store import get_store

    store = get_store(Settings.load().database_url)
    docs = store.get_documents(document_ids)
    sources = store.sources(document_ids)
    results = {r["document_id"]: r for r in store.get_results(document_ids)}
    rows = []
    for d in docs:
        result = results.get(d["document_id"])
        rows.append(
            {
                "document_id": d["document_id"],
                "source": d["source"],
                "sources": sources.get(d["document_id"], [d["source"]]),
                "state": d["state"],
                "category": d["category"],
                "attempts": d["attempts"],
                "error": d["last_error"] if d["state"] != "COMPLETED" else None,
                "summary": result["summary"] if result else None,
                "sentiment": result["sentiment"] if result else None,
                "updated_at": d["updated_at"].isoformat() if d["updated_at"] else None,
            }
        )
    by_state = Counter(r["state"] for r in rows)
    by_category = Counter(
        r["category"] for r in rows if r["category"] and r["state"] != "COMPLETED"
    )
    return {
        "documents": rows,
        "counts": {
            "total": len(rows),
            "by_state": dict(sorted(by_state.items())),
            "by_category": dict(sorted(by_category.items())),
        },
    }


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _clip(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(report: dict[str, Any]) -> None:
    print(f"{'DOCUMENT':<20}  {'STATE':<11}  {'CATEGORY':<19}  {'SOURCE':<36}  SUMMARY / ERROR")
    for r in report["documents"]:
        detail = r["summary"] if r["state"] == "COMPLETED" else r["error"]
        print(
            f"{r['document_id']:<20}  {r['state']:<11}  {r['category'] or '-':<19}  "
            f"{_clip(Path(r['source']).name, 36):<36}  {_clip(detail, 70)}"
        )
    counts = report["counts"]
    states = ", ".join(f"{k} {v}" for k, v in counts["by_state"].items()) or "none"
    print(f"\n{counts['total']} documents: {states}")
    if counts["by_category"]:
        print(
            "failed by category: " + ", ".join(f"{k} {v}" for k, v in counts["by_category"].items())
        )
    failed = [r for r in report["documents"] if r["state"] not in ("COMPLETED", "PENDING")]
    if failed:
        print("\nwhy:")
        for r in failed:
            print(f"  {r['document_id']}  {r['state']} {r['category'] or ''}: {r['error'] or ''}")


def _emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2, default=str))
    else:
        print_table(report)


def _exit_code(report: dict[str, Any]) -> int:
    return EXIT_OK if all(r["state"] == "COMPLETED" for r in report["documents"]) else EXIT_FAILED


# --- commands ------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    if not os.environ.get("OPENAI_API_KEY"):
        raise UsageError(
            "OPENAI_API_KEY is not set (use any value for a local endpoint that needs none)"
        )
    report = process_inbox(Path(args.inbox), quiet=args.json, verbose=args.verbose)
    _emit(args, report)
    return _exit_code(report)


def cmd_demo(args: argparse.Namespace) -> int:
    from ai_pipeline.simulator import SimulatorConfig, SimulatorServer

    inbox = Path(args.inbox)
    if not inbox.is_dir():
        raise UsageError(f"inbox {inbox} is not a directory (run the demo from the checkout)")
    with SimulatorServer(SimulatorConfig(latency_ms=args.latency_ms)) as simulator:
        _say(args.json, f"simulator listening on {simulator.base_url}")
        os.environ["OPENAI_BASE_URL"] = simulator.base_url
        os.environ["OPENAI_API_KEY"] = DEMO_API_KEY
        os.environ["AI_PIPELINE_MODEL"] = DEMO_MODEL
        report = process_inbox(inbox, quiet=args.json, verbose=args.verbose)
        report["llm_requests"] = simulator.stats()["total"]
    _emit(args, report)
    if not args.json:
        print(f"LLM calls made by this demo: {report['llm_requests']}")
    return _exit_code(report)


def cmd_status(args: argparse.Namespace) -> int:
    _ensure_dagster_home()
    report = _report()
    _emit(args, report)
    return EXIT_OK


def cmd_simulate_llm(args: argparse.Namespace) -> int:
    from ai_pipeline.simulator import FaultRule, SimulatorConfig, serve

    faults = []
    if args.faults:
        try:
            raw = json.loads(Path(args.faults).read_text("utf-8"))
            faults = [FaultRule.model_validate(f) for f in raw.get("faults", raw)]
        except (OSError, ValueError) as e:
            raise UsageError(f"--faults {args.faults}: {e}") from e
    config = SimulatorConfig(
        latency_ms=args.latency_ms,
        max_concurrency=args.max_concurrency,
        api_keys=set(args.api_key) if args.api_key else None,
        faults=faults,
    )
    serve(config, host=args.host, port=args.port)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ai-pipeline",
        description="Idempotent, retry-safe LLM analysis of document collections on Dagster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        help="analyse the sample inbox against the bundled simulator (offline)",
        description="Start the bundled LLM simulator, analyse the sample inbox through Dagster "
        "against the instance in DAGSTER_HOME, and print a table. Running it again makes no LLM "
        "call: every document is checkpointed.",
    )
    p.add_argument(
        "--inbox", default="examples/inbox", help="folder to analyse (default: %(default)s)"
    )
    p.add_argument(
        "--latency-ms", type=int, default=50, help="simulated LLM latency (default: %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", action="store_true", help="show Dagster's run log too")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "run",
        help="analyse a folder against the configured LLM endpoint",
        description="Register every file of INBOX as a document and analyse those not yet "
        "completed, through Dagster. Uses OPENAI_BASE_URL, OPENAI_API_KEY and AI_PIPELINE_MODEL. "
        "Exit code 0 when every document completed, 1 when some failed, 2 on a usage error.",
    )
    p.add_argument("--inbox", required=True, help="folder of documents (searched recursively)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", action="store_true", help="show Dagster's run log too")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "status",
        help="every document with its state and failure category",
        description="Report every known document: state, failure category, error, summary.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "simulate-llm",
        help="run the OpenAI-compatible simulator in the foreground",
        description="An OpenAI-compatible server (/v1/chat/completions, /v1/models) that answers "
        "with a deterministic analysis of the text it is sent, counts requests per "
        "Idempotency-Key (GET /_sim/stats) and injects faults on demand (POST /_sim/faults).",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument("--port", type=int, default=8765, help="port (default: %(default)s)")
    p.add_argument("--latency-ms", type=int, default=0, help="latency per request (default: 0)")
    p.add_argument(
        "--max-concurrency", type=int, default=64, help="requests served at once (default: 64)"
    )
    p.add_argument(
        "--api-key", action="append", help="accept only this key (repeatable; default: any)"
    )
    p.add_argument("--faults", help='JSON file with fault rules ({"faults": [...]})')
    p.set_defaults(func=cmd_simulate_llm)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as e:
        print(f"ai-pipeline: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:  # settings that do not parse
        from ai_pipeline.settings import SettingsError

        if isinstance(e, SettingsError):
            print(f"ai-pipeline: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
