"""The connections a deployment opens to PostgreSQL at rest: one checkout against others, in turns.

Each pass runs one checkout's ``dagster-daemon`` (its code server runs the code location's sensors)
on an instance whose storage is ``deploy/dagster.yaml``'s pooled PostgreSQL storage, in a database
of its own, and the results database beside it. Once the daemon evaluates the sensors, it counts the
sessions the server opened for that database during ``--seconds`` (``pg_stat_database.sessions``):
each one a server process forked, authenticated and shown the catalog. Nothing is submitted; what
it measures is what the daemon, its code server and their sensors cost by themselves.

    python benchmarks/pg_sessions.py [--seconds 60] [--rounds 2] [--json] [CHECKOUT ...]

With no CHECKOUT it measures this one. A checkout is a directory holding ``ai_pipeline`` (e.g. a
``git worktree add /tmp/base <commit>``); its passes run its own code, from its directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cpu import commit_of, finish_report, in_turns, run_pass  # noqa: E402
from throughput import REPO, report_header  # noqa: E402

# One pass, run as ``python -c`` in the checkout's environment; prints its figures as JSON.
_PASS = r"""
import json, os, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import sqlalchemy as sa
from production import pg_database
from throughput import dagster_daemon, daemon_serving, instance_yaml

seconds = float(sys.argv[2])
url, drop = pg_database()
engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))


def sessions() -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        )).scalar_one())


try:
    with tempfile.TemporaryDirectory(prefix="aip-sessions-") as root:
        home = Path(root) / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(instance_yaml(4, url), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
        env.update(
            DAGSTER_HOME=str(home),
            AI_PIPELINE_DATABASE_URL=url,
            OPENAI_BASE_URL="http://127.0.0.1:9/v1",
            OPENAI_API_KEY="sessions-bench",
        )
        with dagster_daemon(env, Path(root) / "daemon.log"):
            waited = daemon_serving(home, env)
            time.sleep(5)  # its first ticks, which build what a process keeps
            before, began = sessions(), time.monotonic()
            time.sleep(seconds)
            after, ended = sessions(), time.monotonic()
    # The count's own session was opened before the first count and kept for the second.
    opened = after - before
    print(json.dumps({
        "seconds": round(ended - began, 1),
        "sessions": opened,
        "sessions_per_minute": round(60 * opened / (ended - began), 1),
        "daemon_serving_after_seconds": round(waited, 1),
    }))
finally:
    engine.dispose()
    drop()
"""


def one_pass(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    return run_pass(checkout, _PASS, str(checkout / "benchmarks"), str(args.seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, help="default: this checkout")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts] or [REPO]

    report: dict[str, Any] = {**report_header(), "checkouts": {}}
    passes = in_turns(
        checkouts,
        args.rounds,
        lambda checkout: one_pass(checkout, args),
        None if args.json else lambda f: f"{f['sessions']} sessions in {f['seconds']} s",
    )
    for checkout in checkouts:
        rates = [p["sessions_per_minute"] for p in passes[checkout]]
        report["checkouts"][str(checkout)] = {
            "commit": commit_of(checkout),
            "sessions_per_minute": rates,
            "median_sessions_per_minute": statistics.median(rates),
        }
    return finish_report(
        report,
        [],
        args.json,
        lambda entry: f"median {entry['median_sessions_per_minute']} new sessions a minute at rest",
    )


if __name__ == "__main__":
    raise SystemExit(main())
