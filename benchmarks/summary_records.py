"""What the backfill daemon's read of new materializations costs: Dagster's own
``get_asset_event_summary_records`` against the project's event logs' (``dagster.yaml``), side by
side in one run on the same database.

The daemon reads every materialization written since its last look, a thousand rows a page
(``MATERIALIZATION_CHUNK_SIZE``), once for each asset of each backfill still open. This writes
``--documents`` documents' materializations of two assets through the embedded default's event log
(in groups, as a run's step does), then pages through one asset's rows that way with both
implementations in alternating rounds, checks that they give the same records, and prints the CPU
microseconds per row of each and the ratio.

    python benchmarks/summary_records.py [--documents 20000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import report_header  # noqa: E402

ASSETS = ("document_text", "llm_analysis")
PAGE = 1000


def _write(instance: Any, documents: int) -> None:
    import dagster as dg
    from dagster._core.events import DagsterEventType, StepMaterializationData

    from ai_pipeline_tests.step_events import step_event

    storage = instance.event_log_storage
    for start in range(0, documents, 500):
        with storage.grouped_writes():
            for i in range(start, min(start + 500, documents)):
                for asset in ASSETS:
                    data = StepMaterializationData(
                        dg.AssetMaterialization(asset, partition=f"doc-{i:06d}")
                    )
                    instance.handle_new_event(
                        step_event(
                            DagsterEventType.ASSET_MATERIALIZATION, data, run_id=f"run-{i // 2500}"
                        )
                    )


def _page_through(read: Any, asset_key: Any) -> list[Any]:
    from dagster import DagsterEventType

    records: list[Any] = []
    after = 0
    while True:
        page = read(
            DagsterEventType.ASSET_MATERIALIZATION,
            asset_key=asset_key,
            after_storage_id=after,
            limit=PAGE,
            ascending=True,
        )
        if not page:
            return records
        records.extend(page)
        after = page[-1].storage_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import dagster as dg
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    report = report_header()
    home = Path(tempfile.mkdtemp(prefix="aip-summary-"))
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)  # where dagster.yaml's storages keep their files
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            storage = instance.event_log_storage
            _write(instance, args.documents)
            key = dg.AssetKey(ASSETS[1])
            reads = {
                "dagster": lambda *a, **k: SqlEventLogStorage.get_asset_event_summary_records(
                    storage, *a, **k
                ),
                "project": storage.get_asset_event_summary_records,
            }
            answers = {kind: _page_through(read, key) for kind, read in reads.items()}
            assert answers["dagster"] == answers["project"], "the records differ"
            assert len(answers["project"]) == args.documents, len(answers["project"])
            cpu = {kind: 0.0 for kind in reads}
            for _ in range(args.rounds):
                for kind, read in reads.items():
                    started = time.process_time()
                    _page_through(read, key)
                    cpu[kind] += time.process_time() - started
    finally:
        shutil.rmtree(home, ignore_errors=True)

    rows = args.documents * args.rounds
    for kind in reads:
        report[kind] = {"rows": rows, "cpu_us_per_row": round(cpu[kind] / rows * 1e6, 2)}
    report["cpu_ratio_dagster_over_project"] = round(cpu["dagster"] / cpu["project"], 2)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})")
    for kind, label in (("dagster", "Dagster's"), ("project", "the project's")):
        print(f"  {label:<14} {report[kind]['cpu_us_per_row']:>7} µs of CPU a row")
    print(f"  ratio          {report['cpu_ratio_dagster_over_project']}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
