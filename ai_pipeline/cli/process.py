"""Processing commands: ``demo``, ``run``, ``status``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_OK,
    UsageError,
    add_budget_flags,
    add_output_flags,
    budget_of,
    emit,
    exit_code,
    launcher,
    required_api_key,
    say,
)
from ai_pipeline.failures import RUN_FAULTS, Category
from ai_pipeline.states import State

DEMO_API_KEY = "sim-demo-key"
DEMO_MODEL = "sim-analyst-1"


def cmd_run(args: argparse.Namespace) -> int:
    required_api_key()
    report = launcher(args).process_inbox(
        Path(args.inbox), verbose=args.verbose, budget=budget_of(args)
    )
    emit(args, report)
    left = left_by_the_run(report)
    if left:
        faults = sorted({d["category"] or d["state"] for d in left})
        print(
            f"ai-pipeline: {len(left)} documents are not finished for a fault of the run, not "
            f"theirs ({', '.join(faults)}): `ai-pipeline run --inbox {args.inbox}` again "
            "finishes them (`ai-pipeline status` says why for each)",
            file=sys.stderr,
        )
    return exit_code(report)


def left_by_the_run(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The documents of a ``run`` report that another ``run`` finishes: never started, or
    stopped by the run's end or its database; not those another run holds, nor a setting's."""
    elsewhere = {d["document_id"] for d in report.get("in_progress_elsewhere", [])}
    unstarted = (State.PENDING.value, State.QUEUED.value, State.RUNNING.value)
    return [
        d
        for d in report["documents"]
        if d["document_id"] not in elsewhere
        and (
            (d["state"] in unstarted and d["category"] is None)
            or (
                d["category"] is not None
                and Category(d["category"]) in RUN_FAULTS
                and d["state"] != State.DEAD_LETTER.value
            )
        )
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    from ai_pipeline import analyses
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer
    from ai_pipeline.settings import Settings

    analysis = Settings.load().analysis
    # Each built-in analysis has its sample folder: examples/inbox, examples/<name>.
    default = "examples/inbox" if analysis == analyses.DEFAULT.name else f"examples/{analysis}"
    inbox = Path(args.inbox or default)
    if not inbox.is_dir():
        raise UsageError(f"inbox {inbox} is not a directory (run the demo from the checkout)")
    with SimulatorServer(SimulatorConfig(latency_ms=args.latency_ms)) as simulator:
        say(args.json, f"simulator listening on {simulator.base_url}")
        # The demo's run goes through the same settings as any other: the simulator is the endpoint.
        os.environ["OPENAI_BASE_URL"] = simulator.base_url
        os.environ["OPENAI_API_KEY"] = DEMO_API_KEY
        os.environ["AI_PIPELINE_MODEL"] = DEMO_MODEL
        report: dict[str, Any] = launcher(args).process_inbox(inbox, verbose=args.verbose)
        report["llm_requests"] = simulator.stats()["total"]
    emit(args, report)
    if not args.json:
        print(f"LLM calls made by this demo: {report['llm_requests']}")
    return exit_code(report)


def cmd_status(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError(f"--limit must be ≥ 0, not {args.limit}")
    if args.state:
        unknown = [s for s in args.state if s not in State.__members__]
        if unknown:
            raise UsageError(f"unknown state {unknown[0]!r}; one of {', '.join(State.__members__)}")
        states: list[State] | None = [State(s) for s in args.state]
    elif args.all:
        states = None
    else:
        states = [s for s in State if s != State.COMPLETED]
    limit = None if args.all else args.limit
    report = launcher(args).status(states=states, limit=limit)
    emit(args, report)
    if report["omitted"] and not args.json:
        print(f"({report['omitted']} more not shown: --limit N, --state STATE or --all)")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="analyse the sample inbox against the bundled simulator (offline)",
        description="Start the bundled LLM simulator, analyse the sample inbox through Dagster "
        "against the instance in DAGSTER_HOME, and print a table. Running it again makes no LLM "
        "call: every document is checkpointed.",
    )
    p.add_argument(
        "--inbox",
        help="folder to analyse (default: examples/inbox, or examples/<analysis> for another "
        "built-in analysis)",
    )
    p.add_argument(
        "--latency-ms", type=int, default=50, help="simulated LLM latency (default: %(default)s)"
    )
    add_output_flags(p, verbose=True)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "run",
        help="analyse a folder against the configured LLM endpoint",
        description="Register every file of INBOX as a document and analyse those not yet "
        "completed, through Dagster. Uses OPENAI_BASE_URL, OPENAI_API_KEY and AI_PIPELINE_MODEL. "
        "Exit code 0 when every document completed, 1 when some failed, 2 on a usage error.",
    )
    p.add_argument("--inbox", required=True, help="folder of documents (searched recursively)")
    add_budget_flags(p, "this command (all its runs)")
    add_output_flags(p, verbose=True)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "status",
        help="documents by state and failure category; those not completed listed",
        description="Count every known document by state and failure category, and list the "
        "documents not completed (the most recently changed first, at most --limit): state, "
        "failure category, error. --state lists the documents in these states, --all every "
        "document.",
    )
    p.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        help="list the documents in this state (repeatable), e.g. FAILED, COMPLETED",
    )
    p.add_argument(
        "--limit", type=int, default=50, help="list at most this many documents (default: 50)"
    )
    p.add_argument("--all", action="store_true", help="list every document, in any state")
    add_output_flags(p)
    p.set_defaults(func=cmd_status)
