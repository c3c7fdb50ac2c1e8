"""Rerunning what failed: ``backfill --failed`` and ``requeue`` (out of the dead letter)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_budget_flags,
    add_output_flags,
    add_via_flag,
    add_wait_flags,
    api_key_for,
    budget_of,
    categories,
    exit_code,
    launcher,
    print_backfills,
    print_batch_api,
    print_json,
    print_table,
    say,
    store,
    user,
)
from ai_pipeline.failures import Category

NEEDS_PERSON = ", ".join(c.value for c in Category if c.needs_person)


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError as e:
        raise UsageError(f"--since {value!r} is not an ISO date or time (e.g. 2026-11-28)") from e
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def cmd_backfill(args: argparse.Namespace) -> int:
    from ai_pipeline.defs import relaunch

    if args.failed == args.stale:
        raise UsageError("say what to backfill: --failed or --stale (one of them)")
    if args.stale and (args.category or args.since or budget_of(args)):
        raise UsageError(
            "--category, --since and --budget-* are for failed documents: use them with --failed"
        )
    if args.max_usd is not None and not args.stale:
        raise UsageError("--max-usd is for --stale (a canary's projection): use --budget-usd")
    if args.stale:
        stale_launcher = launcher(args)
        canary = _canary_first(args, stale_launcher)
        out = relaunch.backfill_stale(
            stale_launcher,
            dry_run=args.dry_run,
            wait=args.wait,
            timeout=args.timeout,
            via=args.via,
            api_key=api_key_for(args),
        )
        out["canary"] = canary
    else:
        out = relaunch.backfill_failed(
            launcher(args),
            categories=categories(args.category),
            since=_since(args.since),
            dry_run=args.dry_run,
            wait=args.wait,
            timeout=args.timeout,
            budget=budget_of(args),
            via=args.via,
            api_key=api_key_for(args),
        )
    if args.json:
        print_json(out)
    else:
        verb = "would rerun" if args.dry_run else "rerunning"
        print(f"{verb} {len(out['selected'])} documents; {len(out['skipped'])} left out")
        for d in out["selected"]:
            print(f"  + {d['document_id']}  {d['category'] or '-':<20} {Path(d['source']).name}")
        for d in out["skipped"]:
            print(f"  - {d['document_id']}  {d['skipped']}")
        print_batch_api(out)
        print_backfills(out)
        if out["backfill_id"]:
            print("the daemon runs them; see the UI's Backfills page")
        if "status" in out:
            print_table(out)
    return exit_code(out) if "status" in out else EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    from ai_pipeline.outcomes import requeue

    s = store()
    code = EXIT_OK
    for document_id in args.documents:
        try:
            requeued = requeue(s, document_id, by=args.by)
        except KeyError:
            print(f"ai-pipeline: {document_id}: no such document")
            code = EXIT_USAGE
            continue
        if requeued:
            print(f"{document_id}: requeued (attempts reset); the next backfill picks it up")
        else:
            doc = s.documents.get(document_id)
            state = doc.state.value if doc else "unknown"
            print(f"{document_id}: {state}, not in the dead letter; left as it is")
    return code


def _canary_first(args: argparse.Namespace, stale_launcher: Any) -> dict[str, Any] | None:
    """The last canary of the current version, said before a stale backfill starts; with
    ``--max-usd``, a projection over it refuses the backfill (and no canary refuses it too)."""
    from ai_pipeline.canary import last_canary
    from ai_pipeline.cli.canary import describe

    canary = last_canary(stale_launcher.store, stale_launcher.settings)
    if canary is None:
        if args.max_usd is not None:
            raise UsageError(
                "--max-usd needs a canary of the current version to price the backfill: run "
                "`ai-pipeline canary --sample N` first"
            )
        say(args.json, "no canary of the current version (`ai-pipeline canary` prices it first)")
        return None
    for line in describe(canary, examples=False):
        say(args.json, line)
    projected = canary["projected"]["cost_usd"]
    if args.max_usd is not None and projected > args.max_usd:
        raise UsageError(
            f"the canary projects ${projected:.4f} for this backfill, over --max-usd "
            f"{args.max_usd}: nothing launched"
        )
    return canary


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "backfill",
        help="rerun failed (or stale) documents as a Dagster backfill",
        description="Select documents that failed (in Dagster or here), by category and time, and "
        "launch a real Dagster backfill for them (the daemon runs it; it shows on the UI's "
        f"Backfills page; more than AI_PIPELINE_BACKFILL_DOCUMENTS, 10,000, are several, titled by "
        "part). By default the categories that need a person are left out "
        f"({NEEDS_PERSON}), and so are BUDGET_REACHED ones unless selected by --category with "
        "a budget (--budget-tokens/--budget-usd, shared by all the backfill's runs); DEAD_LETTER "
        "documents always are. --stale selects instead the "
        "completed documents analysed under another prompt version or model than now: each "
        "makes one new call, and its earlier analysis is kept in the results history.",
    )
    p.add_argument("--failed", action="store_true", help="select failed documents")
    p.add_argument(
        "--stale",
        action="store_true",
        help="select documents analysed under another prompt version or model",
    )
    p.add_argument("--category", action="append", metavar="C", help="only this category")
    p.add_argument("--since", metavar="T", help="only documents that failed at or after T (ISO)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, launch nothing")
    p.add_argument(
        "--max-usd",
        type=float,
        metavar="USD",
        help="with --stale: launch nothing when the current version's canary projects more",
    )
    add_budget_flags(p, "the backfill (all its runs together)")
    add_via_flag(p, "the selected documents")
    add_wait_flags(p, "its backfills")
    add_output_flags(p)
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser(
        "requeue",
        help="take documents out of the dead letter",
        description="Move DEAD_LETTER documents back to QUEUED with their attempts reset, so that "
        "the next backfill (the CLI's or the nightly schedule's) picks them up.",
    )
    p.add_argument("documents", nargs="+", metavar="DOC", help="document ids")
    p.add_argument("--by", default=user(), help="who requeues (default: $USER)")
    p.set_defaults(func=cmd_requeue)
