"""What the two event-write benchmarks share (``pg_events.py``, ``sqlite_events.py``): writing
asset materializations through two instances in alternating rounds, and the report."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from throughput import report_header


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=200, help="event writes per storage and round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def new_report() -> dict[str, Any]:
    return report_header()


def alternate_rounds(
    instances: dict[str, Any], events: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """``events`` materializations through each instance per round, the instances taking turns so
    that a change in the machine's load weighs on all alike; the wall and CPU seconds of each."""
    import dagster as dg

    wall = {kind: 0.0 for kind in instances}
    cpu = {kind: 0.0 for kind in instances}
    for round_ in range(rounds):
        for kind, instance in instances.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            for i in range(events):
                instance.report_runless_asset_event(
                    dg.AssetMaterialization("probe", metadata={"round": round_, "i": i})
                )
            wall[kind] += time.perf_counter() - started
            cpu[kind] += time.process_time() - cpu_started
    return wall, cpu


def finish(
    report: dict[str, Any],
    labels: dict[str, str],
    writes: int,
    wall: dict[str, float],
    cpu: dict[str, float],
    opened: dict[str, int],
    *,
    as_json: bool,
) -> None:
    """Per-event figures for each storage in ``labels`` (the first against the second as the
    ratio), then the report printed as a table or as JSON."""
    first, second = list(labels)
    for kind in labels:
        report[kind] = {
            "events": writes,
            "wall_ms_per_event": round(wall[kind] / writes * 1000, 2),
            "cpu_ms_per_event_this_process": round(cpu[kind] / writes * 1000, 2),
            "connections_opened": opened[kind],
        }
    ratio_key = f"wall_ratio_{first}_over_{second}"
    report[ratio_key] = round(wall[first] / wall[second], 2)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['command']}  (commit {report['commit']}, load {report['machine']['loadavg']})")
    for kind, label in labels.items():
        r = report[kind]
        print(
            f"  {label:<17} {r['wall_ms_per_event']:>7} ms/event wall, "
            f"{r['cpu_ms_per_event_this_process']:>5} ms CPU here, "
            f"{r['connections_opened']} connections for {r['events']} events"
        )
    print(f"  ratio (wall): {report[ratio_key]}×")
    print(f"  load at the end {report['loadavg_end']}")
