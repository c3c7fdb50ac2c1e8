"""``canary``: the current analysis version tried on a sample of stale documents, compared with
today's results and priced for the whole ``backfill --stale``, before it is paid for."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from ai_pipeline.cli.common import (
    EXIT_OK,
    UsageError,
    add_output_flags,
    clip,
    print_json,
    required_api_key,
)


def cmd_canary(args: argparse.Namespace) -> int:
    from ai_pipeline.canary import run_canary
    from ai_pipeline.defs.resources import LLMResource
    from ai_pipeline.settings import Settings
    from ai_pipeline.spend import Meter, Prices
    from ai_pipeline.store import open_store

    if args.sample < 1:
        raise UsageError(f"--sample {args.sample}: try at least one document")
    key = required_api_key()
    settings = Settings.load()
    store = open_store(settings)
    meter = Meter(store, Prices.of(settings), completion_reserve=settings.completion_reserve_tokens)
    llm = LLMResource(api_key=key, analysis=settings.analysis).client(meter=meter)

    async def canary() -> dict[str, Any]:
        try:
            return await run_canary(
                store, llm, settings, size=args.sample, seed=args.seed, tolerance=args.tolerance
            )
        finally:
            await llm.aclose()

    report = asyncio.run(canary())
    if args.json:
        print_json(report)
    else:
        print("\n".join(describe(report)))
    return EXIT_OK


def describe(report: dict[str, Any], *, examples: bool = True) -> list[str]:
    """A canary's report as lines for a terminal."""
    current = report["current"]
    lines = [
        f"canary of prompt {current['prompt_version']}, model {current['model']}: "
        f"{report['sample']} of {report['stale']} stale documents (seed {report['seed']}); "
        f"{report['sample_calls']} calls, {report['sample_tokens']:,} tokens, "
        f"${report['sample_cost_usd']:.4f}",
        "",
        f"{'FIELD':<24}  AGREEMENT",
    ]
    for name, field in report["fields"].items():
        share = field["agreement"]
        lines.append(f"{name:<24}  {'-' if share is None else f'{share:.0%}'}")
    sections = report.get("sections")
    if sections:
        lines.append(
            f"per {sections['label']} ({sections['compared']} compared; "
            f"{sections['recut_documents']} documents cut otherwise than before):"
        )
        for name, field in sections["fields"].items():
            share = field["agreement"]
            lines.append(f"  {name:<22}  {'-' if share is None else f'{share:.0%}'}")
    if report.get("confidence_shift") is not None:
        lines.append(f"confidence: {report['confidence_shift']:+.3f} on average")
    if report["failures"]:
        failed = ", ".join(f"{c} {n}" for c, n in sorted(report["failures"].items()))
        lines.append(f"failed under the new version: {failed}")
    if examples:
        shown = [
            (name, e)
            for fields in (report["fields"], (sections or {}).get("fields", {}))
            for name, field in fields.items()
            for e in field["examples"]
        ]
        if shown:
            lines.append("largest disagreements:")
        for name, e in shown:
            lines.append(
                f"  {name}  {clip(e['source'].rsplit('/', 1)[-1], 30)}: "
                f"{clip(repr(e['old']), 40)} -> {clip(repr(e['new']), 40)}"
            )
    projected = report["projected"]
    lines.append(
        f"projected `backfill --stale`: {projected['documents']} more documents, "
        f"${projected['cost_usd']:.4f}, about {_duration(projected['seconds'])}"
        + (" (the sample's documents cost nothing again)" if report["sample"] else "")
    )
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "canary",
        help="try the current analysis version on a sample of stale documents, before paying",
        description="Analyse a deterministic sample of the completed documents whose results an "
        "earlier prompt version or model made, under the current version, without replacing "
        "their results; compare the answers field by field with today's; price the whole "
        "`backfill --stale` from the sample. The sample's answers are checkpoints: the backfill "
        "reuses them, and the same canary again costs nothing.",
    )
    p.add_argument(
        "--sample", type=int, default=20, metavar="N", help="documents to try (default: 20)"
    )
    p.add_argument("--seed", type=int, default=0, help="which sample (default: 0)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="how far two numbers may differ and still agree (default: 0.05)",
    )
    add_output_flags(p)
    p.set_defaults(func=cmd_canary)
