"""What a deployment costs when nothing happens: ``dagster-daemon`` and its code server at rest.

Each pass starts a real ``dagster-daemon`` of one checkout (its ``workspace.yaml``, from its own
directory, the checkout first on ``PYTHONPATH``) on a fresh ``DAGSTER_HOME`` holding that
checkout's ``dagster.yaml`` (the embedded default, SQLite), waits until the daemon runs the code
location's sensors, lets it settle, then reads the CPU time of the daemon and of the processes under
it (its code server) from ``/proc`` over ``--seconds``. Nothing is submitted: what it measures is the
daemon's loops and the sensors' ticks (the backfill planner's every 2 s, the submissions sensor's
every 5 s, the others' every 20–30 s), which go on all day in a deployment. The checkouts take turns
``--rounds`` times; the report gives each one's median share of one core per process, and the ratio
of its total to the first checkout's.

    python benchmarks/idle.py [--seconds 60] [--rounds 2] [--json] [CHECKOUT ...]

With no CHECKOUT it measures this one; a checkout is a directory holding ``ai_pipeline`` (e.g. a
``git worktree add /tmp/base <commit>``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cpu import commit_of, finish_report, in_turns  # noqa: E402
from throughput import (  # noqa: E402
    REPO,
    _beside_python,
    background,
    daemon_serving,
    report_header,
)

SETTLE_SECONDS = 15.0
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds so far of ``root_pid`` (the daemon) and of every process under it (its code
    server), by role."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    seconds: dict[str, float] = {}
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = "daemon" if pid == root_pid else "code server"
        seconds[role] = (
            seconds.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND
        )
        stack.extend(children.get(pid, []))
    return seconds


@contextmanager
def daemon_of(checkout: Path, home: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A ``dagster-daemon`` of ``checkout`` on ``home``, running the code location's sensors;
    stopped (its process group) after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_PIPELINE_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(home),
        PYTHONPATH=os.pathsep.join(p for p in (str(checkout), env.get("PYTHONPATH")) if p),
        AI_PIPELINE_DATABASE_URL=f"sqlite:///{home / 'ai_pipeline.sqlite'}",
        AI_PIPELINE_INBOX=str(home / "inbox"),
        # Never called: nothing is submitted.
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        OPENAI_API_KEY="idle-bench-key",
    )
    argv = [_beside_python("dagster-daemon"), "run", "-w", str(checkout / "workspace.yaml")]
    with background(argv, env, log, cwd=checkout) as daemon:
        daemon_serving(home, env, timeout=180.0)
        yield daemon


def one_pass(checkout: Path, seconds: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="aip-idle-"))
    try:
        home = root / "home"
        (home / "inbox").mkdir(parents=True)
        shutil.copy(checkout / "dagster.yaml", home / "dagster.yaml")
        with daemon_of(checkout, home, root / "daemon.log") as daemon:
            time.sleep(SETTLE_SECONDS)
            before, started = cpu_seconds(daemon.pid), time.monotonic()
            time.sleep(seconds)
            after, wall = cpu_seconds(daemon.pid), time.monotonic() - started
            if daemon.poll() is not None:
                raise SystemExit(f"FAILED: the daemon of {checkout} exited ({daemon.returncode})")
        share = {role: 100 * (after[role] - before.get(role, 0.0)) / wall for role in after}
        return {"wall_seconds": round(wall, 1), "percent_of_a_core": share}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def describe(figures: dict[str, Any]) -> str:
    share = figures["percent_of_a_core"]
    return ", ".join(f"{role} {value:.2f} %" for role, value in sorted(share.items())) + (
        f" of a core (total {sum(share.values()):.2f} %)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, help="default: this checkout")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured, each pass")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts] or [REPO]
    passes = in_turns(
        checkouts,
        args.rounds,
        lambda checkout: one_pass(checkout, args.seconds),
        None if args.json else describe,
    )
    report: dict[str, Any] = {**report_header(), "checkouts": {}}
    totals = {
        c: statistics.median(sum(p["percent_of_a_core"].values()) for p in passes[c])
        for c in checkouts
    }
    for checkout in checkouts:
        roles = sorted({role for p in passes[checkout] for role in p["percent_of_a_core"]})
        report["checkouts"][str(checkout)] = {
            "commit": commit_of(checkout),
            "median_percent_of_a_core": {
                role: round(
                    statistics.median(
                        p["percent_of_a_core"].get(role, 0.0) for p in passes[checkout]
                    ),
                    2,
                )
                for role in roles
            },
            "median_total_percent_of_a_core": round(totals[checkout], 2),
            "ratio_to_first": round(totals[checkout] / totals[checkouts[0]], 3)
            if totals[checkouts[0]]
            else None,
            "passes": passes[checkout],
        }
    return finish_report(
        report,
        [],
        args.json,
        lambda entry: (
            ", ".join(f"{r} {v:.2f} %" for r, v in entry["median_percent_of_a_core"].items())
            + f" of a core; total {entry['median_total_percent_of_a_core']:.2f} %, "
            f"{entry['ratio_to_first']}× the first"
        ),
        preface=[f"at rest, {args.seconds:.0f} s a pass, {args.rounds} rounds (medians):"],
    )


if __name__ == "__main__":
    raise SystemExit(main())
