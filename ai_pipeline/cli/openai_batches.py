"""OpenAI's Batch API from a terminal: ``batch-api submit | follow | list | show | cancel``.

A group of its own, apart from ``submit``/``batch`` (named sets of documents run by Dagster): these
commands send analysis requests through the Batch API at its price (``ai_pipeline.openai_batch``)
and follow the jobs until every line is a checkpoint or a classified failure. The runs that then
validate and store the documents find the checkpoints and make no call.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_budget_flags,
    add_output_flags,
    budget_of,
    ensure_dagster_home,
    print_json,
)
from ai_pipeline.errors import InputError


def _jobs() -> Any:
    from ai_pipeline.openai_batch.operations import open_jobs
    from ai_pipeline.settings import Settings

    ensure_dagster_home()
    settings = Settings.load()
    api_key = os.environ.get("OPENAI_API_KEY")
    if not api_key:
        raise InputError("OPENAI_API_KEY is not set: the Batch API needs the endpoint's key")
    return open_jobs(settings, api_key), settings


def _print_job(job: dict[str, Any]) -> None:
    counts = job["request_counts"]
    done = "" if counts["total"] is None else f" {counts['completed']}/{counts['total']} done"
    failed = f", {counts['failed']} failed" if counts["failed"] else ""
    lines = ", ".join(f"{n} {state}" for state, n in sorted(job["lines"].items()))
    print(
        f"{job['intent_id']}  {job['status']:<11}  batch {job['batch_id'] or '-'}  "
        f"{job['tasks']} tasks{done}{failed}  [{lines}]"
    )
    if job["error"]:
        print(f"    {job['error']}")


def cmd_submit(args: argparse.Namespace) -> int:
    from ai_pipeline.openai_batch.operations import submit

    jobs, settings = _jobs()
    out = submit(jobs, settings.analysis_model, args.document_ids or None, budget=budget_of(args))
    if args.json:
        print_json(out)
        return EXIT_OK
    print(
        f"{out['tasks']} tasks sent in {len(out['jobs'])} Batch API jobs; "
        f"{out['already_done']} already answered, {out['in_open_jobs']} in open jobs"
    )
    for job in out["jobs"]:
        _print_job(job)
    for document_id, why in out["not_batchable"].items():
        print(f"  not batched: {document_id}: {why}")
    for task, why in out["gave_up"].items():
        print(f"  given up: {task}: {why}")
    if out["over_budget"]:
        print(f"  {out['over_budget']} tasks not sent: over the budget ({out['budget']})")
    if out["jobs"]:
        print("follow them with: ai-pipeline batch-api follow")
    return EXIT_OK


def cmd_follow(args: argparse.Namespace) -> int:
    from ai_pipeline.openai_batch.operations import follow

    jobs, _ = _jobs()
    out = follow(jobs, max_jobs=args.max_jobs)
    if args.json:
        print_json(out)
        return EXIT_OK
    print(
        f"{out['advanced']} jobs looked at: {out['answered']} lines answered, "
        f"{out['failed']} failed, {out['expired']} expired"
    )
    for job in out["finished"]:
        _print_job(job)
    if out["open"]:
        print(f"{len(out['open'])} jobs still open:")
        for job in out["open"]:
            _print_job(job)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from ai_pipeline.openai_batch.operations import job_report

    jobs, _ = _jobs()
    found = [job_report(jobs.store, job) for job in jobs.store.openai_batches.recent(args.limit)]
    if args.json:
        print_json(found)
    else:
        for job in found:
            _print_job(job)
    return EXIT_OK


def _find(jobs: Any, ident: str) -> Any:
    batches = jobs.store.openai_batches
    job = batches.get(ident) or batches.by_batch_id(ident)
    if job is None:
        raise InputError(f"no Batch API job {ident!r} (an intent id or a batch id)")
    return job


def cmd_show(args: argparse.Namespace) -> int:
    from ai_pipeline.openai_batch.operations import job_report

    jobs, _ = _jobs()
    out = job_report(jobs.store, _find(jobs, args.id), with_lines=True)
    if args.json:
        print_json(out)
        return EXIT_OK
    _print_job(out)
    for line in out["line_details"]:
        why = f"  {line['category'] or ''} {line['error'] or ''}".rstrip()
        print(f"  {line['task_id']}  {line['state']}{why}")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from ai_pipeline.openai_batch.operations import job_report

    jobs, _ = _jobs()
    job = jobs.cancel(_find(jobs, args.id).intent_id)
    out = job_report(jobs.store, job)
    if args.json:
        print_json(out)
    else:
        _print_job(out)
    return EXIT_OK if job.status.value in ("cancelling", "cancelled", "abandoned") else EXIT_FAILED


def add_commands(sub: Any) -> None:
    group = sub.add_parser(
        "batch-api",
        help="analyse through OpenAI's Batch API at its price: submit, follow, list, show, cancel",
        description="Send analysis requests through OpenAI's Batch API (half the price, answers "
        "within 24 hours) and follow them: each answered line becomes its task's checkpoint, so "
        "the runs that validate and store the documents make no call. Every step can be taken "
        "again after a crash without a second batch or a second charge.",
    )
    commands = group.add_subparsers(dest="batch_api_command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "submit",
        help="send documents' analysis requests as Batch API jobs",
        description="Plan and send jobs for the documents given (default: every registered "
        "document that is pending, queued or failed): their tasks without a checkpoint and in no "
        "open job, at most 50,000 lines and 200 MB a file.",
    )
    p.add_argument("document_ids", nargs="*", metavar="DOCUMENT_ID")
    add_budget_flags(p, "these jobs (reserved at the batch price as they are planned)")
    add_output_flags(p)
    p.set_defaults(func=cmd_submit)

    p = commands.add_parser(
        "follow",
        help="one bounded pass over the open jobs: upload, create, poll, ingest",
        description="Take each unfinished job as far as it can go now (oldest first).",
    )
    p.add_argument("--max-jobs", type=int, default=20, help="jobs looked at (default: 20)")
    add_output_flags(p)
    p.set_defaults(func=cmd_follow)

    p = commands.add_parser("list", help="recent jobs, newest first")
    p.add_argument("--limit", type=int, default=50, help="how many (default: 50)")
    add_output_flags(p)
    p.set_defaults(func=cmd_list)

    p = commands.add_parser("show", help="a job and each of its lines")
    p.add_argument("id", metavar="ID", help="the job's intent id or its batch id")
    add_output_flags(p)
    p.set_defaults(func=cmd_show)

    p = commands.add_parser(
        "cancel", help="cancel a job (what was answered before is still ingested)"
    )
    p.add_argument("id", metavar="ID", help="the job's intent id or its batch id")
    add_output_flags(p)
    p.set_defaults(func=cmd_cancel)
