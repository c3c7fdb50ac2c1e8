"""What the ``ai-pipeline`` commands share: the instance, the launcher, output and exit codes.

Exit codes: 0 success, 1 some documents failed (or were left unfinished), 2 a usage or
configuration error (also when a run stopped on a setting the endpoint refused: ``stopped``).

Dagster, the store and pandas are imported where a command needs them, not when the parser is
built: ``ai-pipeline --help`` answers in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category
from ai_pipeline.states import State

if TYPE_CHECKING:
    import dagster as dg

    from ai_pipeline.defs.launch import Launcher
    from ai_pipeline.spend import Budget
    from ai_pipeline.store import Store

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(InputError):
    """A usage or configuration problem: printed as one line, exit code 2."""


def ensure_dagster_home() -> Path:
    """``DAGSTER_HOME``, or the current folder when it holds a ``dagster.yaml`` (the checkout)."""
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


def instance() -> dg.DagsterInstance:
    """The Dagster instance of ``DAGSTER_HOME``, its storage (and the results database) created.

    Two first commands on a fresh ``DAGSTER_HOME`` would race to create the SQLite tables of the
    instance (and one would die on "table … already exists"): the first use is serialised by a lock
    file in ``DAGSTER_HOME``, held only while the storages are opened.
    """
    import fcntl

    import dagster as dg

    from ai_pipeline.settings import Settings
    from ai_pipeline.store import open_store

    home = ensure_dagster_home()
    with open(home / ".ai_pipeline.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        inst = dg.DagsterInstance.get()
        inst.get_runs(limit=1)  # opens (and on first use creates) the run and event storages
        inst.get_backfills(limit=1)
        open_store(Settings.load())
    return inst


def store() -> Store:
    """The results database of the configured instance."""
    from ai_pipeline.settings import Settings
    from ai_pipeline.store import open_store

    ensure_dagster_home()
    return open_store(Settings.load())


def launcher(args: argparse.Namespace) -> Launcher:
    """The launcher for this instance and the code location; progress goes to stderr unless
    ``--json`` asked for nothing but JSON."""
    from ai_pipeline.defs.launch import Launcher
    from ai_pipeline.defs.location import OWN, load_definitions
    from ai_pipeline.defs.site import site_named
    from ai_pipeline.settings import Settings

    settings = Settings.load()
    defs = load_definitions(settings.definitions or OWN)
    # The command's analysis (``--analysis``, set in the settings by ``ai_pipeline.cli``).
    site = site_named(defs, settings.declaration.name)
    inst = instance()
    if getattr(args, "json", False):
        return Launcher(inst, defs, site=site)
    console = Console(sys.stderr)
    return Launcher(inst, defs, progress=console.say, live=console.live, site=site)


def categories(values: list[str] | None) -> list[Category]:
    """``--category`` values as categories; an unknown one is a usage error naming the valid ones."""
    out = []
    for value in values or []:
        if value not in Category.__members__:
            raise UsageError(
                f"unknown category {value!r}; one of {', '.join(Category.__members__)}"
            )
        out.append(Category(value))
    return out


def user() -> str:
    """Who is at the terminal, for the records of reviews and requeues."""
    return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"


def add_output_flags(p: argparse.ArgumentParser, *, verbose: bool = False) -> None:
    """``--json`` (and ``--verbose``): every command that reports takes the same flags."""
    p.add_argument("--json", action="store_true", help="print JSON, nothing else on stdout")
    if verbose:
        p.add_argument("--verbose", action="store_true", help="show Dagster's run log too")


def _positive(kind: type) -> Any:
    def parse(raw: str) -> Any:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{raw} must be > 0")
        return value

    return parse


def add_budget_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--budget-tokens`` and ``--budget-usd``: no call is sent that would take ``what`` past
    either; the documents left are FAILED BUDGET_REACHED and continue in a later launch."""
    p.add_argument(
        "--budget-tokens",
        type=_positive(int),
        metavar="N",
        help=f"at most N tokens for {what} (each call reserves its estimate first)",
    )
    p.add_argument(
        "--budget-usd", type=_positive(float), metavar="USD", help=f"at most USD for {what}"
    )


def budget_of(args: argparse.Namespace) -> Budget | None:
    from ai_pipeline.spend import Budget

    return Budget.of(args.budget_tokens, args.budget_usd)


def print_spend(report: dict[str, Any]) -> None:
    spend, budget = report.get("spend"), report.get("budget")
    if spend:
        tokens = spend["prompt_tokens"] + spend["completion_tokens"]
        print(
            f"spent: {tokens:,} tokens over {spend['attempts']} LLM attempts, "
            f"${spend['cost_usd']:.4f}"
        )
    if budget:
        parts = []
        if budget["limit_tokens"] is not None:
            parts.append(f"{budget['spent_tokens']:,} of {budget['limit_tokens']:,} tokens")
        if budget["limit_usd"] is not None:
            parts.append(f"${budget['spent_usd']:.4f} of ${budget['limit_usd']:.4f}")
        print(f"budget {budget['key']}: " + ", ".join(parts) + " spent")


def add_wait_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--wait`` and ``--timeout`` for the commands that launch a backfill."""
    p.add_argument("--wait", action="store_true", help=f"wait for {what} to end, print the outcome")
    p.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits (1800)")


def add_via_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--via sync|batch``: how ``what`` is analysed."""
    p.add_argument(
        "--via",
        choices=("sync", "batch"),
        default="sync",
        help=f"how {what} is analysed: synchronous calls in a backfill's runs (sync, the "
        "default), or OpenAI's Batch API at half the price, answered within 24 hours (batch: "
        "needs OPENAI_API_KEY; the daemon's openai_batch_sensor follows the jobs and runs the "
        "answered documents with no call; documents that cannot go in a job go in a backfill)",
    )


def required_api_key() -> str:
    """The endpoint's key, for a command that calls it from this process or its runs."""
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise UsageError(
            "OPENAI_API_KEY is not set (use any value for a local endpoint that needs none)"
        )
    return key


def api_key_for(args: argparse.Namespace) -> str | None:
    """The endpoint's key when the command goes through the Batch API (``--via batch``)."""
    return os.environ.get("OPENAI_API_KEY") if getattr(args, "via", "sync") == "batch" else None


def print_backfills(out: dict[str, Any]) -> None:
    """A launch's backfills, one line each: id, part, documents, launched now or found running,
    and (waited for) the status it ended in."""
    statuses = out.get("statuses", {})
    for b in out.get("backfills", []):
        what = "launched" if b["launched"] else "still queued or running"
        part = f"part {b['part']}, " if b["part"] != "1/1" else ""
        end = f": {statuses[b['backfill_id']]}" if b["backfill_id"] in statuses else ""
        print(f"backfill {b['backfill_id']} ({part}{b['documents']} documents) {what}{end}")


def print_batch_api(out: dict[str, Any]) -> None:
    """What a launch ``--via batch`` sent, in a line or two."""
    sent = out.get("batch_api")
    if not sent:
        return
    ids = ", ".join(j["batch_id"] or j["intent_id"] for j in sent["jobs"]) or "none"
    print(
        f"Batch API: {sent['tasks']} documents in {len(sent['jobs'])} new jobs ({ids}), "
        f"{sent['in_open_jobs']} in open jobs already, {len(sent['left_to_sync'])} left to a "
        "backfill; see: ai-pipeline batch-api list"
    )
    if sent["over_budget"]:
        print(f"  {sent['over_budget']} not sent: over the budget ({sent['budget']})")


class Console:
    """Messages and a live progress line on a stream (stderr).

    On a terminal the live line is rewritten in place and cleared before a message; otherwise it
    is printed as a plain line at most every ``every`` seconds (a log file gets a line now and
    then, not a thousand).
    """

    def __init__(self, stream: TextIO, *, every: float = 10.0):
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._shown = False
        self._last = float("-inf")

    def say(self, message: str) -> None:
        self._clear()
        print(message, file=self.stream, flush=True)

    def live(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self._shown = True
        elif time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            print(line, file=self.stream, flush=True)

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = False


def say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def clip(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def print_table(report: dict[str, Any]) -> None:
    from ai_pipeline.reporting import describe_batch_api_wait

    print(f"{'DOCUMENT':<20}  {'STATE':<11}  {'CATEGORY':<19}  {'SOURCE':<36}  SUMMARY / ERROR")
    for r in report["documents"]:
        detail = r["summary"] if r["state"] == State.COMPLETED.value else r["error"]
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
    if counts.get("stale"):
        print(
            f"stale: {counts['stale']} analyses made under another prompt version or model "
            "(ai-pipeline backfill --stale makes them again)"
        )
    elsewhere = {d["document_id"]: d["run_id"] for d in report.get("in_progress_elsewhere", [])}
    in_batch_api = [r for r in report["documents"] if r.get("batch_api")]
    settled = (State.COMPLETED.value, State.PENDING.value)
    failed = [
        r
        for r in report["documents"]
        if r["state"] not in settled
        and r["document_id"] not in elsewhere
        and not r.get("batch_api")
    ]
    if failed:
        print("\nwhy:")
        for r in failed:
            print(f"  {r['document_id']}  {r['state']} {r['category'] or ''}: {r['error'] or ''}")
            if r["status_message"]:
                print(f"      rejected: {r['status_message']}")
    if in_batch_api:
        print(f"\nin the Batch API ({len(in_batch_api)}; run when their jobs are answered):")
        for r in in_batch_api:
            print(f"  {r['document_id']}  {r['state']}, {describe_batch_api_wait(r['batch_api'])}")
    if elsewhere:
        print(f"\nin progress in other runs ({len(elsewhere)}; left to them, not failed):")
        for document_id, run_id in elsewhere.items():
            print(f"  {document_id}  held by run {run_id}")
    if report.get("skipped"):
        print(f"\nskipped ({len(report['skipped'])} entries that are not documents):")
        for entry in report["skipped"]:
            print(f"  {entry['path']}: {entry['reason']}")
    if report.get("settling"):
        print(f"\nleft for the next run (changed too recently): {len(report['settling'])}")
        for path in report["settling"]:
            print(f"  {path}")
    if report.get("spend") or report.get("budget"):
        print()
        print_spend(report)


def emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print_json(report)
    else:
        print_table(report)


def exit_code(report: dict[str, Any]) -> int:
    """0 when every document completed, 1 when some did not; a run its settings stopped is a
    configuration error: ``UsageError`` with the message that says what to change (exit 2)."""
    stopped(report)
    done = all(r["state"] == State.COMPLETED.value for r in report["documents"])
    return EXIT_OK if done else EXIT_FAILED


def stopped(report: dict[str, Any]) -> None:
    """Raise ``UsageError`` when a run of the report stopped on a wrong setting."""
    if report.get("stopped"):
        raise UsageError(f"the run stopped, its documents left as they were: {report['stopped']}")
