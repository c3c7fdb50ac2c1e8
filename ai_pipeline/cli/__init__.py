"""``ai-pipeline``: run, watch and rehearse the pipeline from a terminal.

Commands are thin — parse, call one function of the application layer, print — one module per
group: ``process`` (demo, run, status), ``backfill`` (backfill, requeue), ``review``, ``batches``
(submit, batch, report), ``serve`` (the submission service), ``rehearsal`` (simulate-llm, receive-webhooks). Commands that process
documents go through Dagster against the project's instance (``DAGSTER_HOME``), so what they do
shows in the Dagster UI exactly like a sensor's runs.

Exit codes: 0 success, 1 some documents failed, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ai_pipeline.cli import backfill, batches, process, rehearsal, review, serve
from ai_pipeline.cli.common import EXIT_USAGE
from ai_pipeline.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ai-pipeline",
        description="Idempotent, retry-safe LLM analysis of document collections on Dagster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (process, backfill, review, batches, serve, rehearsal):
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as e:  # usage, configuration, a request that does not fit: one line
        print(f"ai-pipeline: error: {e}", file=sys.stderr)
        return EXIT_USAGE
