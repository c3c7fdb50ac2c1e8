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

import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from event_writes import alternate_rounds, finish, new_report, parse_args  # noqa: E402

PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


def main() -> int:
    args = parse_args(__doc__)

    import dagster as dg

    from ai_pipeline.accelerator.postgres import storage_yaml

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    names = {kind: f"aip_events_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("dagster", "pooled")}
    instances: dict[str, Any] = {}
    opened = {kind: 0 for kind in names}
    report = new_report()
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
        wall, cpu = alternate_rounds(instances, args.events, args.rounds)
    finally:
        for instance in instances.values():
            instance.dispose()
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    labels = {"dagster": "dagster-postgres", "pooled": "pooled (deploy/)"}
    writes = args.events * args.rounds
    finish(report, labels, writes, wall, cpu, opened, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
