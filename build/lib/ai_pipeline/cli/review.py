"""The human review queue: ``review list``, ``review approve``, ``review reject``."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_OK,
    add_output_flags,
    categories,
    clip,
    emit,
    exit_code,
    launcher,
    print_json,
    store,
    user,
)
from ai_pipeline.review import MANUAL_OVERRIDE_SUCCESS
from ai_pipeline.store.rows import Decision


def cmd_review_list(args: argparse.Namespace) -> int:
    from ai_pipeline.review import open_items

    now = datetime.now(timezone.utc)
    items: list[dict[str, Any]] = [
        {
            "document_id": item.document_id,
            "task_id": item.task_id,
            "category": item.category.value,
            "error": item.error,
            "snapshot": item.snapshot.as_dict(),
            "age_seconds": int((now - item.created_at).total_seconds()),
            "created_at": item.created_at.isoformat(),
        }
        for item in open_items(store(), categories(args.category))
    ]
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


def cmd_review_approve(args: argparse.Namespace) -> int:
    decision = (
        Decision.ACCEPT_OUTPUT if args.accept_output else Decision.RETRY if args.retry else None
    )
    report = launcher(args).approve(
        args.document, decision=decision, by=args.by, note=args.note, verbose=args.verbose
    )
    emit(args, report)
    return exit_code(report)


def cmd_review_reject(args: argparse.Namespace) -> int:
    from ai_pipeline.review import reject

    rejection = reject(store(), args.document, reason=args.reason, by=args.by)
    if args.json:
        print_json(
            {
                "document_id": rejection.document_id,
                "message_zh": rejection.message_zh,
                "message_en": rejection.message_en,
            }
        )
    else:
        print(
            f"{rejection.document_id}: rejected; message to the submitter:\n"
            f"  {rejection.message_zh}\n  {rejection.message_en}"
        )
    return EXIT_OK


def add_commands(sub: Any) -> None:
    review = sub.add_parser(
        "review",
        help="the human review queue: list, approve, reject",
        description="Documents whose failure needs a person: bad input, model refusals and schema "
        "problems, hallucinations, downstream business rejections.",
    )
    actions = review.add_subparsers(dest="review_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "list",
        help="open items",
        description="List open review items: document, category, error, input snapshot, age.",
    )
    p.add_argument("--category", action="append", metavar="C", help="only this category")
    add_output_flags(p)
    p.set_defaults(func=cmd_review_list)

    p = actions.add_parser(
        "approve",
        help="re-submit a document under its original task id",
        description="Approve an item and re-submit the document through Dagster under its "
        "original task id. For a model-layer failure choose --accept-output (keep the stored "
        "output; the override is recorded with who and why) or --retry (discard that checkpoint "
        f"and call the model again). On success the history records {MANUAL_OVERRIDE_SUCCESS}.",
    )
    p.add_argument("document", metavar="DOC", help="the document id")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--accept-output", action="store_true", help="accept the stored output")
    mode.add_argument("--retry", action="store_true", help="call the model again")
    p.add_argument("--note", help="why (recorded)")
    p.add_argument("--by", default=user(), help="reviewer (default: $USER)")
    add_output_flags(p, verbose=True)
    p.set_defaults(func=cmd_review_approve)

    p = actions.add_parser(
        "reject",
        help="reject a document with a standard message to its submitter",
        description="Reject an item: the standard message «您的材料存在{R}问题，请修正后重新提交» "
        "(and an English twin) goes to the document's status and the submitter-messages outbox; "
        "nothing downstream is triggered.",
    )
    p.add_argument("document", metavar="DOC", help="the document id")
    p.add_argument("--reason", required=True, metavar="R", help="the problem, e.g. 文件损坏")
    p.add_argument("--by", default=user(), help="reviewer (default: $USER)")
    add_output_flags(p)
    p.set_defaults(func=cmd_review_reject)
