"""What one Dagster event write costs on PostgreSQL: dagster-postgres's storage against the pooled
storage of ``deploy/dagster.yaml``, side by side in one run.

Each storage gets a fresh database of its own on the local server; the two write ``--events``
asset materializations each (``report_runless_asset_event``, the same write path as a run's
``AssetMaterialization``), in alternating rounds so that a change in the machine's load weighs
on both alike. It prints the wall and CPU milliseconds per event of each, the connections each
opened (counted by SQLAlchemy's ``connect`` event) and the ratio.

    python benchmarks/pg_events.py [--events 200] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import git_commit, machine_info  # noqa: E402

PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=200, help="event writes per storage and round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import dagster as dg

    from ai_pipeline.defs.pg_storage import storage_yaml

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    names = {kind: f"aip_events_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("dagster", "pooled")}
    instances: dict[str, Any] = {}
    opened = {kind: 0 for kind in names}
    wall = {kind: 0.0 for kind in names}
    cpu = {kind: 0.0 for kind in names}
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "commit": git_commit() or "unknown",
        "machine": machine_info(),
    }
    try:
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        for kind, name in names.items():
            home = Path(tempfile.mkdtemp(prefix=f"aip-events-{kind}-"))
            url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
            section = (
                storage_yaml(postgres_url=url)
                if kind == "pooled"
                else f"storage:\n  postgres:\n    postgres_url: {url}\n"
            )
            (home / "dagster.yaml").write_text(section + "telemetry:\n  enabled: false\n")
            instance = dg.DagsterInstance.from_config(str(home))
            engine = instance.event_log_storage._engine  # type: ignore[attr-defined]  # noqa: SLF001

            def count(*_: object, kind: str = kind) -> None:
                opened[kind] += 1

            sa.event.listen(engine, "connect", count)
            instances[kind] = instance
        for round_ in range(args.rounds):
            for kind, instance in instances.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                for i in range(args.events):
                    instance.report_runless_asset_event(
                        dg.AssetMaterialization("probe", metadata={"round": round_, "i": i})
                    )
                wall[kind] += time.perf_counter() - started
                cpu[kind] += time.process_time() - cpu_started
    finally:
        for instance in instances.values():
            instance.dispose()
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    writes = args.events * args.rounds
    for kind in names:
        report[kind] = {
            "events": writes,
            "wall_ms_per_event": round(wall[kind] / writes * 1000, 2),
            "cpu_ms_per_event_this_process": round(cpu[kind] / writes * 1000, 2),
            "connections_opened": opened[kind],
        }
    report["wall_ratio_dagster_over_pooled"] = round(wall["dagster"] / wall["pooled"], 2)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})"
        )
        for kind, label in (("dagster", "dagster-postgres"), ("pooled", "pooled (deploy/)")):
            r = report[kind]
            print(
                f"  {label:<17} {r['wall_ms_per_event']:>7} ms/event wall, "
                f"{r['cpu_ms_per_event_this_process']:>5} ms CPU here, "
                f"{r['connections_opened']} connections for {r['events']} events"
            )
        print(f"  ratio (wall): {report['wall_ratio_dagster_over_pooled']}×")
        print(f"  load at the end {report['loadavg_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
