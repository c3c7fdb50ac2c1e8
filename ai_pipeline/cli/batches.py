"""Batches and the report: ``submit``, ``batch``, ``report``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_budget_flags,
    add_output_flags,
    add_via_flag,
    add_wait_flags,
    api_key_for,
    budget_of,
    launcher,
    print_backfills,
    print_batch_api,
    print_json,
    print_spend,
    stopped,
    store,
)


def _print_batch(summary: dict[str, Any]) -> None:
    print(
        f"total {summary['total']}, succeeded {summary['succeeded']}, failed {summary['failed']}, "
        f"pending {summary['pending']}"
    )
    for d, f in summary["failures"].items():
        print(f"  {d}  {f['category']}: {f['error']}")
    print_spend(summary)


def _backfills(out: dict[str, Any]) -> str:
    ids = out["backfill_ids"]
    return f"backfill {ids[0]} is" if len(ids) == 1 else f"{len(ids)} backfills are"


def cmd_submit(args: argparse.Namespace) -> int:
    from ai_pipeline.defs.relaunch import submit_batch

    out = submit_batch(
        launcher(args),
        Path(args.inbox),
        args.batch,
        wait=args.wait,
        timeout=args.timeout,
        budget=budget_of(args),
        via=args.via,
        api_key=api_key_for(args),
    )
    if args.json:
        print_json(out)
    else:
        if out["already_running"]:
            print(
                f"batch {out['batch_id']} ({args.batch}): {out['total']} documents; its "
                f"{_backfills(out)} still queued or running, nothing new launched"
            )
        else:
            print(
                f"batch {out['batch_id']} ({args.batch}): {out['total']} documents, "
                f"{out['pending_at_submit']} submitted for analysis"
            )
        print_batch_api(out)
        print_backfills(out)
        if out["backfill_ids"]:
            print(f"follow it with: ai-pipeline batch {out['batch_id']}")
        _print_batch(out)
    if "status" in out:
        # Waited for: 1 when a document of the batch failed or is still not done, like run and
        # backfill --wait.
        if out["pending"] and not args.json:
            print(
                f"{out['pending']} documents of the batch are not done (see: ai-pipeline batch "
                f"{out['batch_id']}; ai-pipeline backfill --failed reruns what failed)"
            )
        stopped(out)
        return EXIT_FAILED if out["failed"] or out["pending"] else EXIT_OK
    return EXIT_OK


def cmd_batch(args: argparse.Namespace) -> int:
    from ai_pipeline.defs.relaunch import batch_report

    summary = batch_report(launcher(args), args.batch_id)
    if args.json:
        print_json(summary)
    else:
        print(f"batch {summary['batch_id']} ({summary['name']})")
        _print_batch(summary)
        for b in summary["backfills"]:
            print(f"  backfill {b['backfill_id']}  {b['status']:<17} {b['title']}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from ai_pipeline.reporting import build_report, to_markdown

    report = build_report(store())
    if args.json:
        print_json(report)
    else:
        print(to_markdown(report))
    return EXIT_OK


def cmd_trace(args: argparse.Namespace) -> int:
    from ai_pipeline.reporting import describe_batch_api_wait

    story = launcher(args).trace(args.id)
    if args.json:
        print_json(story)
        return EXIT_OK
    spend = story["spend"]
    print(
        f"document {story['document_id']}  {story['state']}"
        + (f" {story['category']}" if story["category"] else "")
        + f"  ({', '.join(story['sources'])})"
    )
    if story.get("batch_api"):
        print(describe_batch_api_wait(story["batch_api"]))
    print(
        f"spent {spend['prompt_tokens'] + spend['completion_tokens']} tokens "
        f"({spend['cached_tokens']} cached prompt, {spend['reasoning_tokens']} reasoning) over "
        f"{spend['attempts']} LLM attempts, ${spend['cost_usd']:.6f}"
    )
    for e in story["events"]:
        where = " ".join(f"{k}={e[k]}" for k in ("run_id", "task_id") if e.get(k) and k in e)
        print(f"{e['at'][:23]}  {e['kind']:<13}  {e['detail']}" + (f"  [{where}]" if where else ""))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a folder as a named batch (a Dagster backfill)",
        description="Register the folder's files and launch a backfill for the documents not yet "
        "completed: several, titled by part, when there are more than AI_PIPELINE_BACKFILL_DOCUMENTS "
        "(10,000). The batch id is derived from the sorted document ids, so submitting the same "
        "documents again names the same batch and resumes only what is pending; a part whose "
        "backfill is still queued or running gets nothing new.",
    )
    p.add_argument("inbox", metavar="DIR", help="folder of documents (searched recursively)")
    p.add_argument("--batch", required=True, metavar="NAME", help="a name for people")
    add_budget_flags(p, "the batch (every run of it, now and later)")
    add_via_flag(p, "the batch's pending documents")
    add_wait_flags(p, "its backfills")
    add_output_flags(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "batch",
        help="a batch's totals: succeeded, failed, pending, failed ids, its backfills",
        description="Report a submitted batch: total / succeeded / failed / pending, why each "
        "failed document failed, and each of its backfills (id, status, title: the pages to open "
        "in the UI).",
    )
    p.add_argument("batch_id", metavar="BATCH_ID", help="the batch id submit printed")
    add_output_flags(p)
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser(
        "trace",
        help="a document's whole story in time order, from its id or a task id",
        description="Everything known of one document, oldest first: its registration and "
        "aliases, each run, every LLM attempt (outcome, tokens, cost), each retry and failure "
        "with its category and layer, the checks, the checkpoints, review decisions, messages "
        "and notices. ID is a document id or any of its task ids.",
    )
    p.add_argument("id", metavar="ID", help="a document id or any of its task ids")
    add_output_flags(p)
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser(
        "report",
        help="the failure report",
        description="Counts by state and category, failures by day, success rate, tokens and "
        "estimated cost (the same data as the failure_report asset).",
    )
    add_output_flags(p)
    p.set_defaults(func=cmd_report)
