"""Helpers shared by the ``ai-pipeline`` commands: the instance, the store, output and exit codes.

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


class UsageError(Exception):
    """A usage or configuration problem: printed as one line, exit code 2."""


def ensure_dagster_home() -> Path:
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


def instance() -> Any:
    import dagster as dg

    ensure_dagster_home()
    return dg.DagsterInstance.get()


def report_for(document_ids: Sequence[str] | None = None) -> dict[str, Any]:
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
                "status_message": d["status_message"],
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


def say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def clip(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(report: dict[str, Any]) -> None:
    print(f"{'DOCUMENT':<20}  {'STATE':<11}  {'CATEGORY':<19}  {'SOURCE':<36}  SUMMARY / ERROR")
    for r in report["documents"]:
        detail = r["summary"] if r["state"] == "COMPLETED" else r["error"]
        print(
            f"{r['document_id']:<20}  {r['state']:<11}  {r['category'] or '-':<19}  "
            f"{clip(Path(r['source']).name, 36):<36}  {clip(detail, 70)}"
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
            if r["status_message"]:
                print(f"      rejected: {r['status_message']}")


def emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print_json(report)
    else:
        print_table(report)


def exit_code(report: dict[str, Any]) -> int:
    return EXIT_OK if all(r["state"] == "COMPLETED" for r in report["documents"]) else EXIT_FAILED


def store() -> Any:
    """The results database of the configured instance."""
    from ai_pipeline.settings import Settings
    from ai_pipeline.store import get_store

    ensure_dagster_home()
    return get_store(Settings.load().database_url)


def print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=str))
