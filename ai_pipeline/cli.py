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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ai_pipeline.cli_common import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    emit,
    ensure_dagster_home,
    exit_code,
    instance,
    report_for,
    say,
)

DEMO_API_KEY = "sim-demo-key"
DEMO_MODEL = "sim-analyst-1"
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


# --- processing ----------------------------------------------------------------------------------


def register_inbox(inbox: Path, *, quiet: bool = False) -> tuple[int, list[str]]:
    """Register every file of ``inbox`` as a document and a partition; (files, document ids)."""
    from ai_pipeline.defs.partitions import PARTITIONS_NAME
    from ai_pipeline.documents import list_files
    from ai_pipeline.intake import register_files, unique_in_order
    from ai_pipeline.settings import Settings
    from ai_pipeline.store import get_store

    if not inbox.is_dir():
        raise UsageError(f"inbox {inbox} is not a directory")
    settings = Settings.load()
    inst = instance()
    paths = list_files([inbox])
    registered = register_files(
        get_store(settings.database_url), paths, max_bytes=settings.max_document_bytes
    )
    document_ids = unique_in_order(r.document_id for r in registered)
    name = PARTITIONS_NAME
    missing = [d for d in document_ids if not inst.has_dynamic_partition(name, d)]
    if missing:
        inst.add_dynamic_partitions(name, missing)
    say(
        quiet,
        f"{len(paths)} files → {len(document_ids)} documents "
        f"({len(paths) - len(document_ids)} duplicates)",
    )
    return len(paths), document_ids


def not_done(document_ids: Sequence[str]) -> list[str]:
    """The documents not completed, here or in Dagster.

    Done means done in both places: a run killed after a document's results were written but before
    Dagster heard of it leaves the document COMPLETED here and unmaterialized there; a rerun
    re-reports it from its checkpoints without an LLM call.
    """
    import dagster as dg

    from ai_pipeline.defs.assets import ANALYSIS_RESULTS
    from ai_pipeline.defs.partitions import documents_partitions
    from ai_pipeline.settings import Settings
    from ai_pipeline.states import State
    from ai_pipeline.store import get_store

    store = get_store(Settings.load().database_url)
    docs = {d["document_id"]: d for d in store.get_documents(document_ids)}
    states = {d: doc["state"] for d, doc in docs.items()}
    # A document a reviewer rejected is settled: it is reported, never analysed again.
    document_ids = [d for d in document_ids if not (d in docs and docs[d]["status_message"])]
    in_dagster = (
        instance().get_status_by_partition(ANALYSIS_RESULTS, document_ids, documents_partitions)
        or {}
    )
    return [
        d
        for d in document_ids
        if states.get(d) != State.COMPLETED.value
        or in_dagster.get(d) != dg.AssetPartitionStatus.MATERIALIZED
    ]


def execute(
    document_ids: Sequence[str], *, quiet: bool = False, verbose: bool = False
) -> list[dict[str, Any]]:
    """Analyse documents in this process through Dagster, in range runs of contiguous partitions."""
    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.jobs import ANALYSIS_JOB_NAME, range_tags
    from ai_pipeline.defs.partitions import PARTITIONS_NAME
    from ai_pipeline.intake import contiguous_ranges
    from ai_pipeline.settings import Settings

    inst = instance()
    job = defs.resolve_job_def(ANALYSIS_JOB_NAME)
    ordered = inst.get_dynamic_partitions(PARTITIONS_NAME)
    ranges = contiguous_ranges(document_ids, ordered, Settings.load().documents_per_run)
    runs = []
    for i, batch in enumerate(ranges, 1):
        say(quiet, f"run {i}/{len(ranges)}: {len(batch)} documents …")
        result = job.execute_in_process(
            instance=inst,
            tags=range_tags(batch),
            raise_on_error=False,
            # The run's events are in the instance (and the UI); the terminal gets the table.
            run_config=None if verbose else QUIET_RUN_CONFIG,
        )
        runs.append({"run_id": result.run_id, "documents": len(batch), "success": result.success})
        say(quiet, f"run {i}/{len(ranges)}: {'succeeded' if result.success else 'had failures'}")
    return runs


def process_inbox(inbox: Path, *, quiet: bool = False, verbose: bool = False) -> dict[str, Any]:
    """Register the inbox's files and analyse every document not yet completed, via Dagster."""
    files, document_ids = register_inbox(inbox, quiet=quiet)
    todo = not_done(document_ids)
    say(quiet, f"{len(todo)} to analyse")
    runs = execute(todo, quiet=quiet, verbose=verbose)
    return {"inbox": str(inbox), "files": files, "runs": runs, **report_for(document_ids)}


# --- commands ------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    if not os.environ.get("OPENAI_API_KEY"):
        raise UsageError(
            "OPENAI_API_KEY is not set (use any value for a local endpoint that needs none)"
        )
    report = process_inbox(Path(args.inbox), quiet=args.json, verbose=args.verbose)
    emit(args, report)
    return exit_code(report)


def cmd_demo(args: argparse.Namespace) -> int:
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    inbox = Path(args.inbox)
    if not inbox.is_dir():
        raise UsageError(f"inbox {inbox} is not a directory (run the demo from the checkout)")
    with SimulatorServer(SimulatorConfig(latency_ms=args.latency_ms)) as simulator:
        say(args.json, f"simulator listening on {simulator.base_url}")
        os.environ["OPENAI_BASE_URL"] = simulator.base_url
        os.environ["OPENAI_API_KEY"] = DEMO_API_KEY
        os.environ["AI_PIPELINE_MODEL"] = DEMO_MODEL
        report = process_inbox(inbox, quiet=args.json, verbose=args.verbose)
        report["llm_requests"] = simulator.stats()["total"]
    emit(args, report)
    if not args.json:
        print(f"LLM calls made by this demo: {report['llm_requests']}")
    return exit_code(report)


def cmd_status(args: argparse.Namespace) -> int:
    ensure_dagster_home()
    report = report_for()
    emit(args, report)
    return EXIT_OK


def cmd_simulate_llm(args: argparse.Namespace) -> int:
    from ai_pipeline.rehearsal.faults import FaultRule, SimulatorConfig
    from ai_pipeline.rehearsal.simulator import serve

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

    from ai_pipeline.operate import add_commands

    add_commands(sub)
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
