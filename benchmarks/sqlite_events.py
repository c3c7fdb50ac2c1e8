"""What one Dagster event write costs in the embedded default: Dagster's own SQLite event log
against the project's (``dagster.yaml``), side by side in one run.

Each gets a fresh ``DAGSTER_HOME`` of its own; the two write ``--events`` asset materializations
each (``report_runless_asset_event``, the write path of a run's ``AssetMaterialization``), in
alternating rounds so that a change in the machine's load weighs on both alike. It prints the
wall and CPU milliseconds per event of each, the SQLite connections each opened (counted by
SQLAlchemy's ``connect`` event) and the ratio.

    python benchmarks/sqlite_events.py [--events 200] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import git_commit, machine_info  # noqa: E402

PROJECT_SECTION = (
    "event_log_storage:\n"
    "  module: ai_pipeline.defs.sqlite_storage\n"
    "  class: EngineReusingSqliteEventLogStorage\n"
    "  config:\n"
    "    base_dir: {home}/storage\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=200, help="event writes per storage and round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import dagster as dg
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    kinds = {"dagster": "", "project": PROJECT_SECTION}
    instances: dict[str, Any] = {}
    opened = {kind: 0 for kind in kinds}
    wall = {kind: 0.0 for kind in kinds}
    cpu = {kind: 0.0 for kind in kinds}
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "commit": git_commit() or "unknown",
        "machine": machine_info(),
    }

    try:
        for kind, section in kinds.items():
            home = Path(tempfile.mkdtemp(prefix=f"aip-events-{kind}-"))
            (home / "dagster.yaml").write_text(
                section.format(home=home) + "telemetry:\n  enabled: false\n"
            )
            instances[kind] = dg.DagsterInstance.from_config(str(home))
        storages = {kind: instance.event_log_storage for kind, instance in instances.items()}
        assert type(storages["dagster"]) is SqliteEventLogStorage, type(storages["dagster"])
        assert type(storages["project"]) is not SqliteEventLogStorage

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            path = dbapi_connection.execute("PRAGMA database_list").fetchone()[2]
            for kind, instance in instances.items():
                if path.startswith(str(Path(instance.root_directory))):
                    opened[kind] += 1

        sa.event.listen(sa.engine.Engine, "connect", on_connect)
        for round_ in range(args.rounds):
            for kind, instance in instances.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                for i in range(args.events):
                    instance.report_runless_asset_event(
                        dg.AssetMaterialization("probe", metadata={"round": round_, "i": i})
                    )
                wall[kind] += time.perf_counter() - started
                cpu[kind] += time.process_time() - cpu_started
        for kind, instance in instances.items():
            written = instance.fetch_materializations(dg.AssetKey("probe"), limit=10_000).records
            assert len(written) == args.events * args.rounds, (kind, len(written))
    finally:
        for instance in instances.values():
            instance.dispose()
    writes = args.events * args.rounds
    for kind in kinds:
        report[kind] = {
            "events": writes,
            "wall_ms_per_event": round(wall[kind] / writes * 1000, 2),
            "cpu_ms_per_event_this_process": round(cpu[kind] / writes * 1000, 2),
            "connections_opened": opened[kind],
        }
    report["wall_ratio_dagster_over_project"] = round(wall["dagster"] / wall["project"], 2)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})"
        )
        for kind, label in (("dagster", "Dagster's SQLite"), ("project", "dagster.yaml's")):
            r = report[kind]
            print(
                f"  {label:<17} {r['wall_ms_per_event']:>7} ms/event wall, "
                f"{r['cpu_ms_per_event_this_process']:>5} ms CPU here, "
                f"{r['connections_opened']} connections for {r['events']} events"
            )
        print(f"  ratio (wall): {report['wall_ratio_dagster_over_project']}×")
        print(f"  load at the end {report['loadavg_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
