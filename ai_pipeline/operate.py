"""The operating commands of ``ai-pipeline``: backfills, dead letter, review queue, report, batches.

Split from ``ai_pipeline.cli`` (which holds the processing commands, the parser and the shared
helpers) to keep each file readable; every command here is registered by ``add_commands``.
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ai_pipeline.cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    clip,
    emit,
    exit_code,
    instance,
    print_json,
    print_table,
    report_for,
    say,
    store,
)

MODEL_LAYER = ("SCHEMA_VIOLATION", "LOW_CONFIDENCE", "MODEL_REFUSAL", "MODEL_HALLUCINATION")
REJECTION_ZH = "您的材料存在{reason}问题，请修正后重新提交"
REJECTION_EN = "Your submission has a problem ({reason}). Please correct it and submit it again."


def _user() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError as e:
        raise UsageError(f"--since {value!r} is not an ISO date or time (e.g. 2026-11-28)") from e
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


# --- backfill, requeue ---------------------------------------------------------------------------


def cmd_backfill(args: argparse.Namespace) -> int:
    from ai_pipeline.defs.backfills import launch_backfill, plan_failed_backfill, wait_for_backfill
    from ai_pipeline.failures import Category

    if not args.failed:
        raise UsageError("say what to backfill: --failed (the only selection there is)")
    for c in args.category or []:
        if c not in Category.__members__:
            raise UsageError(f"unknown category {c!r}; one of {', '.join(Category.__members__)}")
    inst = instance()
    plan = plan_failed_backfill(inst, store(), categories=args.category, since=_since(args.since))
    out: dict[str, Any] = {
        "dry_run": args.dry_run,
        "selected": plan.selected,
        "skipped": plan.skipped,
        "backfill_id": None,
    }
    if not args.dry_run and plan.selected:
        title = "failed documents" + (f" ({', '.join(args.category)})" if args.category else "")
        out["backfill_id"] = launch_backfill(inst, plan.document_ids, title=title)
        if args.wait:
            say(args.json, f"backfill {out['backfill_id']} launched; waiting for the daemon …")
            out["status"] = wait_for_backfill(inst, out["backfill_id"], timeout=args.timeout)
            out.update(report_for(plan.document_ids))
    if args.json:
        print_json(out)
    else:
        verb = "would rerun" if args.dry_run else "rerunning"
        print(f"{verb} {len(plan.selected)} documents; {len(plan.skipped)} left out")
        for d in plan.selected:
            print(f"  + {d['document_id']}  {d['category'] or '-':<20} {Path(d['source']).name}")
        for d in plan.skipped:
            print(f"  - {d['document_id']}  {d['skipped']}")
        if out["backfill_id"]:
            print(f"backfill {out['backfill_id']} launched (the daemon runs it; see Backfills)")
        if "status" in out:
            print(f"backfill {out['backfill_id']}: {out['status']}")
            print_table(out)
    return exit_code(out) if "status" in out else EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    from ai_pipeline.states import State

    s = store()
    code = EXIT_OK
    for document_id in args.documents:
        doc = s.get_document(document_id)
        if doc is None:
            print(f"ai-pipeline: {document_id}: no such document")
            code = EXIT_USAGE
        elif doc["state"] != State.DEAD_LETTER.value:
            print(f"{document_id}: {doc['state']}, not in the dead letter; left as it is")
        else:
            s.transition(document_id, State.QUEUED, reset_attempts=True)
            s.add_history(document_id, "REQUEUED", f"by {args.by}")
            print(f"{document_id}: requeued (attempts reset); the next backfill picks it up")
    return code


# --- the review queue ----------------------------------------------------------------------------


def cmd_review_list(args: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
    items = []
    for item in store().review_items("open"):
        if args.category and item["category"] not in args.category:
            continue
        created = item["created_at"]
        created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
        items.append(
            {
                "document_id": item["document_id"],
                "task_id": item["task_id"],
                "category": item["category"],
                "error": item["error"],
                "snapshot": item["snapshot"],
                "age_seconds": int((now - created).total_seconds()),
                "created_at": created.isoformat(),
            }
        )
    if args.json:
        print_json({"items": items, "count": len(items)})
        return EXIT_OK
    if not items:
        print("the review queue is empty")
    for item in items:
        snap = item["snapshot"]
        print(
            f"{item['document_id']}  {item['category']}  {Path(snap['source']).name}  "
            f"{snap['size_bytes']} bytes  {item['age_seconds'] // 60} min old"
        )
        print(f"    error: {item['error']}")
        if snap.get("first_characters"):
            print(f"    text:  {clip(snap['first_characters'], 100)}")
    return EXIT_OK


def _open_item(document_id: str) -> dict[str, Any]:
    item = store().get_review(document_id)
    if item is None or item["status"] != "open":
        raise UsageError(f"{document_id} has no open review item (see: ai-pipeline review list)")
    return item


def cmd_review_approve(args: argparse.Namespace) -> int:
    from ai_pipeline.cli import execute
    from ai_pipeline.pipeline import ANALYSE_STEP

    s = store()
    item = _open_item(args.document)
    doc = s.get_document(args.document)
    assert doc is not None
    if item["category"] in MODEL_LAYER and not (args.accept_output or args.retry):
        raise UsageError(
            f"{item['category']} is a model-layer failure: choose --accept-output (keep the stored "
            "output despite the failed check) or --retry (call the model again, same task id)"
        )
    if doc["rejected_reason"]:
        raise UsageError(
            f"{doc['source']} could not be read ({doc['rejected_reason']}): fix the file and "
            "submit it again (new content is a new document), or reject the item"
        )
    task = item["task_id"]
    if args.accept_output:
        if s.get_checkpoint(task) is None:
            raise UsageError(f"{args.document} has no stored output to accept (task {task})")
        s.add_override(task, args.document, args.by, args.note)
        decision = "accept_output"
    else:
        # Counted as an attempt like any other call; the task id stays the same.
        if item["category"] in MODEL_LAYER and s.delete_checkpoint(task):
            s.add_history(args.document, "CHECKPOINT_DISCARDED", f"{ANALYSE_STEP} {task}")
        decision = "retry"
    s.decide_review(
        args.document, status="approved", decision=decision, decided_by=args.by, note=args.note
    )
    s.add_history(args.document, "REVIEW_APPROVED", f"{decision} by {args.by}", task_id=task)
    say(args.json, f"approved ({decision}); re-submitting {args.document} under task {task}")
    runs = execute([args.document], quiet=args.json, verbose=args.verbose)
    report = {"runs": runs, **report_for([args.document])}
    report["history"] = [
        {"event": h["event"], "detail": h["detail"], "at": h["at"]}
        for h in s.history(args.document)
    ]
    emit(args, report)
    return exit_code(report)


def cmd_review_reject(args: argparse.Namespace) -> int:
    from ai_pipeline.states import State

    s = store()
    _open_item(args.document)
    doc = s.get_document(args.document)
    assert doc is not None
    zh = REJECTION_ZH.format(reason=args.reason)
    en = REJECTION_EN.format(reason=args.reason)
    s.decide_review(
        args.document, status="rejected", decision="reject", decided_by=args.by, note=args.reason
    )
    s.add_message(args.document, doc["source"], args.reason, zh, en)
    # The state stays (a same-state transition); only the message a person reads changes.
    s.transition(args.document, State(doc["state"]), status_message=f"{zh} / {en}")
    s.add_history(args.document, "REVIEW_REJECTED", f"by {args.by}: {args.reason}")
    if args.json:
        print_json({"document_id": args.document, "message_zh": zh, "message_en": en})
    else:
        print(f"{args.document}: rejected; message to the submitter:\n  {zh}\n  {en}")
    return EXIT_OK


# --- report, batches -----------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    from ai_pipeline.reporting import build_report, to_markdown

    report = build_report(store())
    if args.json:
        print_json(report)
    else:
        print(to_markdown(report))
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    from ai_pipeline.cli import not_done, register_inbox
    from ai_pipeline.defs.backfills import launch_backfill, wait_for_backfill
    from ai_pipeline.intake import batch_key

    _, document_ids = register_inbox(Path(args.inbox), quiet=args.json)
    if not document_ids:
        raise UsageError(f"{args.inbox} holds no files")
    batch_id = batch_key(document_ids)
    store().save_batch(batch_id, args.batch, document_ids)
    pending = not_done(document_ids)
    out: dict[str, Any] = {"pending_at_submit": len(pending), "backfill_id": None}
    if pending:
        out["backfill_id"] = launch_backfill(
            instance(), pending, title=f"batch {args.batch}", tags={"ai_pipeline/batch": batch_id}
        )
        if args.wait:
            say(args.json, f"backfill {out['backfill_id']} launched; waiting for the daemon …")
            out["status"] = wait_for_backfill(instance(), out["backfill_id"], timeout=args.timeout)
    out.update(batch_summary(batch_id))
    if args.json:
        print_json(out)
    else:
        print(
            f"batch {batch_id} ({args.batch}): {out['total']} documents, "
            f"{len(pending)} submitted for analysis"
        )
        if out["backfill_id"]:
            print(f"backfill {out['backfill_id']}; follow it with: ai-pipeline batch {batch_id}")
        _print_batch(out)
    if "status" in out:
        # Waited for: 1 when a document of the batch failed, like run and backfill --wait.
        return EXIT_FAILED if out["failed"] else EXIT_OK
    return EXIT_OK


def batch_summary(batch_id: str) -> dict[str, Any]:
    s = store()
    batch = s.get_batch(batch_id)
    if batch is None:
        raise UsageError(f"no batch {batch_id}")
    ids = batch["document_ids"]
    docs = {d["document_id"]: d for d in s.get_documents(ids)}
    failed = [d for d in ids if docs[d]["state"] in ("FAILED", "DEAD_LETTER")]
    succeeded = [d for d in ids if docs[d]["state"] == "COMPLETED"]
    return {
        "batch_id": batch_id,
        "name": batch["name"],
        "total": len(ids),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "pending": len(ids) - len(succeeded) - len(failed),
        "failed_ids": failed,
        "failures": {
            d: {"category": docs[d]["category"], "error": docs[d]["last_error"]} for d in failed
        },
    }


def _print_batch(summary: dict[str, Any]) -> None:
    print(
        f"total {summary['total']}, succeeded {summary['succeeded']}, failed {summary['failed']}, "
        f"pending {summary['pending']}"
    )
    for d, f in summary["failures"].items():
        print(f"  {d}  {f['category']}: {f['error']}")


def cmd_batch(args: argparse.Namespace) -> int:
    summary = batch_summary(args.batch_id)
    if args.json:
        print_json(summary)
    else:
        print(f"batch {summary['batch_id']} ({summary['name']})")
        _print_batch(summary)
    return EXIT_OK


def cmd_receive_webhooks(args: argparse.Namespace) -> int:
    from ai_pipeline.rehearsal.receiver import serve
    from ai_pipeline.rehearsal.receiver_state import ReceiverConfig

    serve(ReceiverConfig(state_file=args.state_file), host=args.host, port=args.port)
    return EXIT_OK


# --- the parser ----------------------------------------------------------------------------------


def add_commands(sub: Any) -> None:
    """Register the operating commands on the ``ai-pipeline`` sub-parser."""
    p = sub.add_parser(
        "backfill",
        help="rerun failed documents as a Dagster backfill",
        description="Select documents that failed (in Dagster or here), by category and time, and "
        "launch a real Dagster backfill for them (the daemon runs it; it shows on the UI's "
        "Backfills page). By default the categories that need a person are left out "
        "(INPUT_QUALITY_ISSUE, SCHEMA_VIOLATION, LOW_CONFIDENCE, MODEL_REFUSAL, "
        "MODEL_HALLUCINATION, BUSINESS_REJECTED); DEAD_LETTER documents always are.",
    )
    p.add_argument("--failed", action="store_true", help="select failed documents (required)")
    p.add_argument("--category", action="append", metavar="C", help="only this category")
    p.add_argument("--since", metavar="T", help="only documents that failed at or after T (ISO)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, launch nothing")
    p.add_argument("--wait", action="store_true", help="wait for the backfill, print the outcome")
    p.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits (1800)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser(
        "requeue",
        help="take documents out of the dead letter",
        description="Move DEAD_LETTER documents back to QUEUED with their attempts reset, so that "
        "the next backfill (the CLI's or the nightly schedule's) picks them up.",
    )
    p.add_argument("documents", nargs="+", metavar="DOC", help="document ids")
    p.add_argument("--by", default=_user(), help="who requeues (default: $USER)")
    p.set_defaults(func=cmd_requeue)

    review = sub.add_parser(
        "review",
        help="the human review queue: list, approve, reject",
        description="Documents whose failure needs a person: bad input, model refusals and schema "
        "problems, hallucinations, downstream business rejections.",
    )
    actions = review.add_subparsers(dest="review_command", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="open items", description="List open review items.")
    p.add_argument("--category", action="append", metavar="C", help="only this category")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_review_list)

    p = actions.add_parser(
        "approve",
        help="re-submit a document under its original task id",
        description="Approve an item and re-submit the document through Dagster under its "
        "original task id. For a model-layer failure choose --accept-output (keep the stored "
        "output; the override is recorded with who and why) or --retry (discard that checkpoint "
        "and call the model again). On success the history records MANUAL_OVERRIDE_SUCCESS.",
    )
    p.add_argument("document", metavar="DOC")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--accept-output", action="store_true", help="accept the stored output")
    mode.add_argument("--retry", action="store_true", help="call the model again")
    p.add_argument("--note", help="why (recorded)")
    p.add_argument("--by", default=_user(), help="reviewer (default: $USER)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--verbose", action="store_true", help="show Dagster's run log too")
    p.set_defaults(func=cmd_review_approve)

    p = actions.add_parser(
        "reject",
        help="reject a document with a standard message to its submitter",
        description="Reject an item: the standard message «您的材料存在{R}问题，请修正后重新提交» "
        "(and an English twin) goes to the document's status and the submitter-messages outbox; "
        "nothing downstream is triggered.",
    )
    p.add_argument("document", metavar="DOC")
    p.add_argument("--reason", required=True, metavar="R", help="the problem, e.g. 文件损坏")
    p.add_argument("--by", default=_user(), help="reviewer (default: $USER)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_review_reject)

    p = sub.add_parser(
        "report",
        help="the failure report",
        description="Counts by state and category, failures by day, success rate, tokens and "
        "estimated cost (the same data as the failure_report asset).",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "submit",
        help="submit a folder as a named batch (a Dagster backfill)",
        description="Register the folder's files and launch a backfill for the documents not yet "
        "completed. The batch id is derived from the sorted document ids, so submitting the same "
        "documents again names the same batch and resumes only what is pending.",
    )
    p.add_argument("inbox", metavar="DIR")
    p.add_argument("--batch", required=True, metavar="NAME", help="a name for people")
    p.add_argument("--wait", action="store_true", help="wait for the backfill to end")
    p.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits (1800)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "batch",
        help="a batch's totals: succeeded, failed, pending, failed ids",
        description="Report a submitted batch: total / succeeded / failed / pending, and why each "
        "failed document failed.",
    )
    p.add_argument("batch_id", metavar="BATCH_ID")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser(
        "receive-webhooks",
        help="run the reference idempotent webhook receiver in the foreground",
        description="A downstream that implements idempotency: the first notice under an "
        "Idempotency-Key gets 201, the same key again 409. For rehearsals of exactly-once "
        "notifications (point AI_PIPELINE_WEBHOOK_URL at http://HOST:PORT/notices).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8766, help="port (default: %(default)s)")
    p.add_argument("--state-file", help="SQLite file that keeps accepted keys across restarts")
    p.set_defaults(func=cmd_receive_webhooks)
