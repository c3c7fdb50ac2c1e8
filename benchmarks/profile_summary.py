"""Where the main thread's wall time goes, from a py-spy profile of ``throughput.py``.

    pip install py-spy        # any environment; it profiles from outside the process
    py-spy record --idle --threads --rate 100 --format raw -o /tmp/spy.txt -- \\
        python benchmarks/throughput.py --baseline-documents 0
    python benchmarks/profile_summary.py /tmp/spy.txt

``--idle`` keeps the samples of a thread that waits (on the disk, on the network), so the shares are
shares of wall time, not of CPU time. Only samples inside ``timed_pass`` (the measured passes) are
bucketed; each sample goes to the first bucket that matches its stack, top to bottom.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# (label, every one of these substrings must be in the stack); the first match wins.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("intake: register_files (results DB, one transaction per file)", ("register_files",)),
    ("intake: has_dynamic_partition, one query per document", ("has_dynamic_partition",)),
    (
        "intake: add_dynamic_partitions / status / partition list",
        ("process_inbox", "dynamic_partition"),
    ),
    ("intake: get_status_by_partition", ("get_status_by_partition",)),
    (
        "create_run: ASSET_MATERIALIZATION_PLANNED events (one per asset x partition)",
        ("_log_asset_planned_events",),
    ),
    ("create_run: rest", ("create_run",)),
    ("asyncio loop: TaskLog line -> context.log -> event log write", ("run_batch", "TaskLog")),
    ("asyncio loop: results store (SQLite) calls", ("run_batch", "ai_pipeline/store/")),
    ("asyncio loop: idle in epoll (waiting for LLM replies)", ("run_batch", "select (selectors")),
    ("asyncio loop: rest (httpx, openai, checks)", ("run_batch",)),
    ("step: _target -> fetch_materializations per document", ("analyse_documents", "_target")),
    ("event write: AssetCheckEvaluation", ("handle_new_event", "asset_check_evaluation")),
    ("event write: AssetMaterialization", ("handle_new_event", "asset_materialization")),
    ("event write: rest (run/step lifecycle, logs)", ("handle_new_event",)),
    ("execute_in_process: rest (plan, resources, step machinery)", ("execute_in_process",)),
    ("process_inbox: rest (final report)", ("process_inbox",)),
]

# What the innermost frames are doing, across all buckets.
LEAVES: list[tuple[str, tuple[str, ...]]] = [
    ("sqlite3 commit (WAL write + fsync)", ("do_commit",)),
    ("sqlite3 connection close (last one checkpoints the WAL)", ("do_close",)),
    ("sqlite3 connect", ("DefaultDialect.connect",)),
    ("create_engine (Dagster's SQLite event log makes one per connection)", ("create_engine",)),
    ("sqlite3 execute", ("do_execute",)),
    ("SQLAlchemy statement compilation", ("compiler.py",)),
    ("idle in epoll", ("select (selectors",)),
]


def parse(path: str) -> tuple[Counter[str], list[tuple[list[str], int]]]:
    threads: Counter[str] = Counter()
    main: list[tuple[list[str], int]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            thread = re.sub(r"\s*\(\d+\)", "", frames[0]).replace("thread:", "").strip()
            threads[thread] += int(count)
            if "MainThread" in thread:
                main.append((frames[1:], int(count)))
    return threads, main


def classify(frames: list[str], rules: list[tuple[str, tuple[str, ...]]], tail: int = 0) -> str:
    text = ";".join(frames[-tail:] if tail else frames)
    for label, needles in rules:
        if all(n in text for n in needles):
            return label
    return "other"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    threads, samples = parse(argv[0])
    measured = [(f, n) for f, n in samples if any("timed_pass" in x for x in f)]
    total = sum(n for _, n in measured)
    if not total:
        print("no samples inside timed_pass: was the profile taken of throughput.py?")
        return 1
    print("samples per thread (with --idle, all threads are sampled all the time):")
    for thread, n in threads.most_common():
        print(f"  {n:8d}  {thread}")
    print(f"\nmain thread inside the measured passes: {total} samples = 100%\n")
    buckets: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, n in measured:
        buckets[classify(frames, BUCKETS)] += n
        leaves[classify(frames, LEAVES, tail=8)] += n
    for label, n in buckets.most_common():
        print(f"  {100 * n / total:5.1f}%  {label}")
    print("\nby innermost activity:\n")
    for label, n in leaves.most_common():
        print(f"  {100 * n / total:5.1f}%  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
