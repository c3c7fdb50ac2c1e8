"""Scale: the bookkeeping at 100,000 documents (no LLM work), through the real commands and daemon.

Two parts, each on a fresh DAGSTER_HOME in a temporary folder (the checkout is not touched):

1. *Commands.* An inbox of N generated documents; each command runs as a user runs it (a new
   ``ai-pipeline`` process) and is timed: ``submit`` (registration, partitions, the backfills —
   one per part of at most 10,000 documents; no daemon runs, so they stay queued), the same
   ``submit`` again (must launch nothing: its backfills are still queued), then, after the
   results database is set to a realistic mix (90 % COMPLETED, 5 % FAILED as NETWORK_TIMEOUT,
   the rest pending), ``status`` (default), ``report``, ``batch`` and ``backfill --failed
   --dry-run``. Then ``dagster-webserver`` serves that instance and headless Chromium (Debian's,
   through Playwright) times the pages a user opens: the partitions view of ``analysis_results``
   until its status counts show, the backfills list until the batch's first backfill shows, and
   that backfill's page until its header shows and until its per-asset table does, each within
   ``--ui-timeout`` (``--skip-ui``: not these).
2. *Sensor.* An inbox of N files registered by the inbox sensor under a real ``dagster-daemon``
   (run queue closed: ``max_concurrent_runs: 0``, so the runs it requests stay queued and what is
   measured is intake alone). It waits until all N documents are registered and reports every
   tick: how many, the longest (evaluation to end, as Dagster records it), and any that failed.

    python benchmarks/scale.py [--documents 100000] [--sensor-documents N] [--max-files 500]
                               [--sensor-interval 5] [--skip-commands] [--skip-sensor]
                               [--skip-ui] [--ui-timeout 240] [--json]

Exit code 0 when every check holds (re-submit launched nothing, every document registered, no
tick failed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (  # noqa: E402
    REPO,
    dagster_daemon,
    instance_yaml,
    make_inbox,
    report_header,
)

CLI = [sys.executable, "-m", "ai_pipeline.cli"]


def fresh_home(root: Path, *, max_concurrent_runs: int = 4) -> Path:
    home = root / "dagster_home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(instance_yaml(max_concurrent_runs), encoding="utf-8")
    return home


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
    env.setdefault("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")  # as the README says
    env.update(
        DAGSTER_HOME=str(home),
        AI_PIPELINE_DATABASE_URL=f"sqlite:///{home / 'ai_pipeline.sqlite'}",
        AI_PIPELINE_SETTLE_SECONDS="0",
        OPENAI_API_KEY="sim-scale-key",
        **extra,
    )
    return env


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Run one command, as a user would; its wall seconds and its JSON output."""
    start = time.perf_counter()
    out = subprocess.run(
        [*CLI, *argv, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600
    )
    seconds = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise SystemExit(
            f"FAILED: ai-pipeline {' '.join(argv)} exited {out.returncode}:\n{out.stderr[-3000:]}"
        )
    return seconds, json.loads(out.stdout)


def mix_states(database: Path) -> dict[str, int]:
    """90 % COMPLETED, 5 % FAILED (NETWORK_TIMEOUT), the rest left pending, by rowid."""
    with sqlite3.connect(database) as conn:
        conn.execute(
            "UPDATE documents SET state = CASE WHEN rowid % 20 = 0 THEN 'FAILED' "
            "WHEN rowid % 20 = 1 THEN state ELSE 'COMPLETED' END, "
            "category = CASE WHEN rowid % 20 = 0 THEN 'NETWORK_TIMEOUT' END, "
            "last_error = CASE WHEN rowid % 20 = 0 THEN 'timed out (scale benchmark)' END"
        )
        return dict(conn.execute("SELECT state, count(*) FROM documents GROUP BY state"))


def ui_pages(
    home: Path,
    env: dict[str, str],
    backfill_ids: list[str],
    timeout_s: float,
    partitions_shown: str = "Missing",
) -> dict[str, float | str]:
    """Seconds until each page shows what a user opened it for, in a fresh browser per page (no
    cache), against ``dagster-webserver`` on this instance; "not shown within X s" when it did
    not within ``timeout_s``. The partitions page is timed until its count of the status
    ``partitions_shown`` ("Missing", "Materialized") shows. A backfill's page (the batch's
    first) is timed twice: until its
    header's partition count shows, and until its content — the per-asset table of partitions
    targeted, in progress, succeeded, failed — does (what an operator follows a batch by); then,
    for ``POLL_WATCH_S`` more, the GraphQL answers the page polls for are weighed: the largest,
    in kB (``ui_backfill_largest_answer_kb``)."""
    import re

    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    sys.path.insert(0, str(REPO))  # the test helpers' package, beside the product's
    from ai_pipeline_tests.browser import chromium_missing, chromium_page
    from ai_pipeline_tests.dagster_procs import DagsterProcess

    if chromium_missing():
        raise SystemExit(f"FAILED: {chromium_missing()} (or run with --skip-ui)")
    first = backfill_ids[0]
    pages = {
        "ui_partitions_page_s": (
            "/assets/analysis_results?view=partitions",
            lambda page: page.get_by_text(re.compile(rf"^{partitions_shown} \(")).first,
        ),
        "ui_backfills_page_s": (
            "/overview/backfills",
            lambda page: page.get_by_text(first).first,
        ),
        "ui_backfill_header_s": (
            f"/runs/b/{first}",
            lambda page: page.get_by_text(re.compile(r"^[\d,]+ partitions$")).first,
        ),
        "ui_backfill_content_s": (
            f"/runs/b/{first}",
            lambda page: page.get_by_text(re.compile(r"^\d+% completed$")).first,
        ),
    }
    timeout_ms = int(timeout_s * 1000)
    web = DagsterProcess.webserver(home.parent / "webserver.log", env=env)
    out: dict[str, float | str] = {}
    try:
        web.start()
        web.wait_ready(300, locations_loaded=True)
        for key, (path, shown) in pages.items():
            with chromium_page(home.parent / f"chromium-{key}", timeout_ms) as page:
                answers: list[Any] = []
                page.on("response", functools.partial(list.append, answers))
                start = time.perf_counter()
                page.goto(f"{web.url}{path}")
                try:
                    expect(shown(page)).to_be_visible(timeout=timeout_ms)
                    out[key] = round(time.perf_counter() - start, 2)
                except (AssertionError, PlaywrightTimeout):
                    out[key] = f"not shown within {timeout_s:g} s"
                if key == "ui_backfill_content_s":
                    out["ui_backfill_largest_answer_kb"] = largest_graphql_answer_kb(page, answers)
    finally:
        web.stop()
    return out


# Seconds a backfill's page is watched after it showed, to weigh what it polls for.
POLL_WATCH_S = 10


def largest_graphql_answer_kb(page: Any, answers: list[Any]) -> float:
    """The largest GraphQL answer the page received, ``POLL_WATCH_S`` from now, in kB."""
    page.wait_for_timeout(POLL_WATCH_S * 1000)
    sizes = [0]
    for answer in list(answers):
        if "/graphql" in answer.url:
            try:
                sizes.append(len(answer.body()))
            except Exception:  # an answer the browser dropped (a poll cut short): no body
                continue
    return round(max(sizes) / 1000, 1)


def launched(submitted: dict[str, Any]) -> list[str]:
    """The backfills a ``submit`` names: all its chunks' (``backfill_ids``), or its one."""
    return list(submitted.get("backfill_ids") or [submitted["backfill_id"]])


def commands(root: Path, n: int, ui_timeout: float | None) -> dict[str, Any]:
    home = fresh_home(root / "commands")
    env = environment(home)
    inbox = make_inbox(root / "commands" / "inbox", range(n))
    out: dict[str, Any] = {}
    out["submit_s"], first = timed(["submit", str(inbox), "--batch", "scale"], env)
    out["resubmit_s"], again = timed(["submit", str(inbox), "--batch", "scale"], env)
    out["backfills"] = len(launched(first))
    out["resubmit_launched_nothing"] = bool(
        again["already_running"] and launched(again) == launched(first)
    )
    out["states"] = mix_states(home / "ai_pipeline.sqlite")
    out["status_s"], status = timed(["status"], env)
    out["status_listed"] = len(status["documents"])
    out["report_s"], report = timed(["report"], env)
    out["batch_s"], _ = timed(["batch", first["batch_id"]], env)
    out["backfill_dry_run_s"], plan = timed(["backfill", "--failed", "--dry-run"], env)
    out["backfill_selected"] = len(plan["selected"])
    if ui_timeout is not None:
        out.update(ui_pages(home, env, launched(first), ui_timeout))
    out["checks"] = {
        "registered": first["total"] == n,
        "resubmit_launched_nothing": out["resubmit_launched_nothing"],
        "report_counts_all": report["documents"] == n,
        "plan_selects_the_failed": len(plan["selected"]) == out["states"].get("FAILED", 0),
    }
    return out


def sensor_ticks(home: Path) -> list[Any]:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.get() as instance:
        states = [s for s in instance.all_instigator_state() if s.name == "inbox_sensor"]
        if not states:
            return []
        (state,) = states
        return list(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100000))


def registered(database: Path) -> int:
    if not database.exists():
        return 0
    try:
        with sqlite3.connect(database, timeout=30) as conn:
            return int(conn.execute("SELECT count(*) FROM documents").fetchone()[0])
    except sqlite3.OperationalError:  # the tables are not there yet
        return 0


def sensor(
    root: Path,
    n: int,
    max_files: int,
    interval: int,
    timeout: float,
    documents_per_run: int | None = None,
) -> dict[str, Any]:
    home = fresh_home(root / "sensor", max_concurrent_runs=0)
    inbox = make_inbox(root / "sensor" / "inbox", range(n))
    env = environment(
        home,
        AI_PIPELINE_INBOX=str(inbox),
        AI_PIPELINE_SENSOR_INTERVAL=str(interval),
        AI_PIPELINE_SENSOR_MAX_FILES=str(max_files),
    )
    if documents_per_run is not None:
        env["AI_PIPELINE_DOCUMENTS_PER_RUN"] = str(documents_per_run)
    start = time.perf_counter()
    with dagster_daemon(env, root / "sensor" / "daemon.log") as daemon:
        while registered(home / "ai_pipeline.sqlite") < n:
            if time.perf_counter() - start > timeout:
                break
            if daemon.poll() is not None:
                raise SystemExit(f"FAILED: dagster-daemon exited {daemon.returncode}")
            time.sleep(2)
        drained_s = time.perf_counter() - start
        drained_at = time.time()
        # The tick that registered the last files still launches its runs: let it end.
        settle_deadline = time.monotonic() + 120
        while time.monotonic() < settle_deadline and any(
            t.status.value == "STARTED" for t in sensor_ticks(home)
        ):
            time.sleep(1)
    ticks = sensor_ticks(home)
    durations = [t.end_timestamp - t.timestamp for t in ticks if t.end_timestamp]
    statuses: dict[str, int] = {}
    for t in ticks:
        statuses[t.status.value] = statuses.get(t.status.value, 0) + 1
    count = registered(home / "ai_pipeline.sqlite")
    ticks.sort(key=lambda t: t.timestamp)
    # A tick that began after every file was registered is cut short by stopping the daemon.
    after = [t for t in ticks if t.timestamp >= drained_at]
    ticks = [t for t in ticks if t.timestamp < drained_at]
    errors = [
        f"tick {i} of {len(ticks)}: {t.error.message.strip()[:300]}"
        for i, t in enumerate(ticks, 1)
        if t.error is not None
    ]
    return {
        "documents_registered": count,
        "drained_s": round(drained_s, 1),
        "ticks": len(ticks),
        "ticks_after_the_last_file_left_out": len(after),
        "tick_statuses": statuses,
        "longest_tick_s": round(max(durations), 2) if durations else None,
        "median_tick_s": round(sorted(durations)[len(durations) // 2], 2) if durations else None,
        "runs_requested": sum(len(t.run_ids) for t in ticks),
        "tick_errors": errors[:3],
        "checks": {
            "all_registered": count == n,
            "no_tick_failed": statuses.get("FAILURE", 0) == 0,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--sensor-documents", type=int, help="default: --documents")
    parser.add_argument("--max-files", type=int, default=500, help="AI_PIPELINE_SENSOR_MAX_FILES")
    parser.add_argument("--sensor-interval", type=int, default=5, help="seconds between ticks")
    parser.add_argument("--sensor-timeout", type=float, default=3600)
    parser.add_argument(
        "--documents-per-run",
        type=int,
        help="AI_PIPELINE_DOCUMENTS_PER_RUN for the sensor (default: unset, the product's choice)",
    )
    parser.add_argument("--skip-commands", action="store_true")
    parser.add_argument("--skip-sensor", action="store_true")
    parser.add_argument("--skip-ui", action="store_true", help="no page timings in a browser")
    parser.add_argument(
        "--ui-timeout", type=float, default=240, help="seconds a page may take to show (240)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = report_header()
    root = Path(tempfile.mkdtemp(prefix="aip-scale-"))
    try:
        if not args.skip_commands:
            report["commands"] = commands(
                root, args.documents, None if args.skip_ui else args.ui_timeout
            )
        if not args.skip_sensor:
            report["sensor"] = sensor(
                root,
                args.sensor_documents or args.documents,
                args.max_files,
                args.sensor_interval,
                args.sensor_timeout,
                args.documents_per_run,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    checks = {
        f"{part}.{name}": ok
        for part in ("commands", "sensor")
        for name, ok in report.get(part, {}).get("checks", {}).items()
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(
            f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})"
        )
        for part in ("commands", "sensor"):
            for key, value in report.get(part, {}).items():
                if key != "checks":
                    print(f"  {part:<8}  {key:<26} {value}")
        print(f"  load at the end {report['loadavg_end']}")
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
