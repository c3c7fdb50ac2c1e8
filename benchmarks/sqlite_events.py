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

import sys
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from event_writes import alternate_rounds, finish, new_report, parse_args  # noqa: E402

PROJECT_SECTION = (
    "event_log_storage:\n"
    "  module: ai_pipeline.accelerator.sqlite\n"
    "  class: EngineReusingSqliteEventLogStorage\n"
    "  config:\n"
    "    base_dir: {home}/storage\n"
)


def main() -> int:
    args = parse_args(__doc__)

    import dagster as dg
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    kinds = {"dagster": "", "project": PROJECT_SECTION}
    instances: dict[str, Any] = {}
    opened = {kind: 0 for kind in kinds}
    report = new_report()

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
        wall, cpu = alternate_rounds(instances, args.events, args.rounds)
        for kind, instance in instances.items():
            written = instance.fetch_materializations(dg.AssetKey("probe"), limit=10_000).records
            assert len(written) == args.events * args.rounds, (kind, len(written))
    finally:
        for instance in instances.values():
            instance.dispose()
    labels = {"dagster": "Dagster's SQLite", "project": "dagster.yaml's"}
    writes = args.events * args.rounds
    finish(report, labels, writes, wall, cpu, opened, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
