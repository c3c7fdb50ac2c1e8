"""The Batch API path at scale, under a real ``dagster-daemon``, with every actor SIGKILLed once
at each phase of its job and a fault mix on the lines.

A fresh DAGSTER_HOME (SQLite, queued runs), a real ``dagster-daemon`` whose ``openai_batch_sensor``
ticks every ``--interval`` seconds, the bundled simulator in this process (its batches take
``--batch-seconds`` and expire after ``--window-seconds``), and ``ai-pipeline submit DIR --via batch
--wait`` as a user types it, over ``--documents`` documents of which

- 5 % have their line fail retryably once (HTTP 503): they must go into one follow-up job;
- 2 % have their line expire once (the first batch ends ``expired``): they go into a follow-up job
  too (the default; ``expired_to_sync`` is the other choice);
- 1 % get a refusal (a line that answers, and whose run's checks send it to review) and 0.5 % a
  non-retryable line failure (HTTP 400): each lands in its category.

A gate in front of the simulator holds the first ``POST /v1/batches`` (the file is uploaded, the
batch not created), then the answer to the second (the batch exists, nobody recorded it), then the
answer to a poll; at each, the submitting process and the daemon's process group (its code server,
where the sensor runs) are SIGKILLed, and both are started again. A watcher kills the daemon once
more in the middle of an ingestion (some lines of a job settled, not all). The report says what
the simulator saw — uploads and batches per job, lines per task, chat calls — and what the results
database holds: every document's state and category, results rows, the LLM attempts per task, and
what they cost at the batch price against the synchronous one.

    python benchmarks/batch_api.py [--documents 1000] [--batch-seconds 20] [--window-seconds 30]
        [--interval 2] [--json]

Exit code 0 when every guarantee held: one upload and one batch per job, no line settled twice,
no task paid twice, no chat call, each faulted document where its fault sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (  # noqa: E402
    REPO,
    document_id,
    instance_yaml,
    make_inbox,
    report_header,
)

API_KEY = "sim-bench-key"
MODEL = "sim-analyst-1"
PHASES = ("uploaded", "created", "polled", "ingesting")
# Which documents get which fault, by index: disjoint sets.
FAULTS = (
    ("retryable 503", lambda i: i % 20 == 1, {"kind": "status", "status": 503, "times": 1}),
    ("expired", lambda i: i % 50 == 2, {"kind": "expire", "times": 1}),
    ("refusal", lambda i: i % 100 == 3, {"kind": "refuse"}),
    ("refused line (400)", lambda i: i % 200 == 5, {"kind": "status", "status": 400}),
)


class Gate:
    """The simulator's ASGI app behind a gate that stops the world at three moments: before the
    first batch is created, after the second is, and after a poll of it. At each the gate says
    which (``hit``), waits for ``release`` and lets the exchange go on (or, the first time, answers
    503 without creating anything: its client is dead by then)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hit: str | None = None
        self.hit_event = threading.Event()
        self.release = threading.Event()
        self.creates = 0
        self.polled = False
        self.lock = threading.Lock()

    async def _stop(self, phase: str) -> None:
        with self.lock:
            self.hit, self.release = phase, threading.Event()
        self.hit_event.set()
        while not self.release.is_set():
            await asyncio.sleep(0.05)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if method == "POST" and path == "/v1/batches":
            self.creates += 1
            if self.creates == 1:
                await self._stop("uploaded")
                await send({"type": "http.response.start", "status": 503, "headers": []})
                return await send({"type": "http.response.body", "body": b"{}"})
            if self.creates == 2:
                return await self.app(scope, receive, self._held(send, "created"))
        polls = method == "GET" and path.startswith("/v1/batches/batch_")
        if polls and self.creates >= 2 and not self.polled:
            self.polled = True
            return await self.app(scope, receive, self._held(send, "polled"))
        return await self.app(scope, receive, send)

    def _held(self, send: Any, phase: str) -> Any:
        async def held(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                await self._stop(phase)
            await send(message)

        return held


class Actors:
    """The daemon and the ``submit --wait`` that waits on it; both killed and started again."""

    def __init__(self, env: dict[str, str], inbox: Path, root: Path) -> None:
        self.env, self.inbox, self.root = env, inbox, root
        self.daemon: subprocess.Popen[bytes] | None = None
        self.submit: subprocess.Popen[str] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        daemon = Path(sys.executable).with_name("dagster-daemon")
        with open(self.root / f"daemon-{self.starts}.log", "wb") as log:
            self.daemon = subprocess.Popen(
                [str(daemon), "run", "-w", str(REPO / "workspace.yaml")],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        argv = [sys.executable, "-m", "ai_pipeline.cli", "submit", str(self.inbox)]
        argv += ["--batch", "acceptance", "--via", "batch", "--wait", "--timeout", "3600"]
        with open(self.root / f"submit-{self.starts}.err", "w") as err:
            self.submit = subprocess.Popen(
                [*argv, "--json"], cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=err,
                text=True, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        for process in (self.submit, self.daemon):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def outcome(self, timeout: float) -> dict[str, Any]:
        """What the last ``submit --wait`` printed: one killed meanwhile was started again."""
        deadline = time.monotonic() + timeout
        while True:
            submit = self.submit
            assert submit is not None
            out, _ = submit.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if submit.returncode != -signal.SIGKILL:
                return json.loads(out) if out.strip() else {"error": f"exit {submit.returncode}"}
            while self.submit is submit:  # killed: its successor is on its way
                time.sleep(0.05)


def kill_mid_ingestion(store: Any, actors: Actors, done: threading.Event, log: list[str]) -> None:
    """Kill the daemon once while a job's lines are being settled: some are, some are not."""
    from ai_pipeline.store.openai_batches import LineState

    while not done.is_set():
        for job in store.openai_batches.unfinished():
            if not job.status.remote_ended:
                continue
            states = Counter(line.state for line in store.openai_batches.lines(job.intent_id))
            pending = states[LineState.PENDING]
            if 0 < pending < sum(states.values()):
                actors.kill()
                log.append(f"ingesting: killed with {pending} of {sum(states.values())} pending")
                actors.start()
                return
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--batch-seconds", type=float, default=20.0)
    parser.add_argument("--window-seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=int, default=2, help="the sensor's interval")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder, for logs")
    args = parser.parse_args()

    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer
    from ai_pipeline.store import Store

    root = Path(tempfile.mkdtemp(prefix="aip-batch-api-"))
    report: dict[str, Any] = report_header()
    ids = [document_id(i) for i in range(args.documents)]
    faulted = {name: [d for i, d in enumerate(ids) if hit(i)] for name, hit, _ in FAULTS}
    rules = [
        {**rule, "match": d} for name, _, rule in FAULTS for d in faulted[name]
    ]  # fmt: skip
    try:
        home = root / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(instance_yaml(4), encoding="utf-8")
        inbox = make_inbox(root / "inbox", range(args.documents))
        import dagster as dg

        # The instance's storage made once, before two processes would race to make it.
        os.environ["DAGSTER_HOME"] = str(home)
        dg.DagsterInstance.get().dispose()
        database_url = f"sqlite:///{home / 'ai_pipeline.sqlite'}"
        config = SimulatorConfig(
            batch_seconds=args.batch_seconds, batch_window_seconds=args.window_seconds
        )
        simulator = SimulatorServer(config)
        gate = Gate(simulator.app)
        simulator.app = gate
        with simulator:
            simulator.set_faults(rules)
            env = {k: v for k, v in os.environ.items() if not k.startswith("AI_PIPELINE_")}
            env.update(
                DAGSTER_HOME=str(home),
                AI_PIPELINE_DATABASE_URL=database_url,
                AI_PIPELINE_SETTLE_SECONDS="0",
                AI_PIPELINE_BATCH_API_INTERVAL=str(args.interval),
                OPENAI_BASE_URL=simulator.base_url,
                OPENAI_API_KEY=API_KEY,
                AI_PIPELINE_MODEL=MODEL,
            )
            actors, kills = Actors(env, inbox, root), []
            started = time.perf_counter()
            actors.start()
            for phase in PHASES[:3]:
                if not gate.hit_event.wait(timeout=600):
                    raise RuntimeError(f"the gate never saw {phase}")
                gate.hit_event.clear()
                actors.kill()
                kills.append(f"{gate.hit}: killed at {time.perf_counter() - started:.1f} s")
                gate.release.set()
                actors.start()
            store, done = Store(database_url), threading.Event()
            watcher = threading.Thread(
                target=kill_mid_ingestion, args=(store, actors, done, kills), daemon=True
            )
            watcher.start()
            outcome = actors.outcome(timeout=3600)
            wall = time.perf_counter() - started
            done.set()
            watcher.join()
            actors.kill()
            stats = simulator.stats()
        report.update(kills=kills, wall_seconds=round(wall, 1), submit=outcome)
        problems = check(report, store, stats, ids, faulted)
        store.db.dispose()
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    report["problems"] = problems
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(f"{report['command']}  (commit {report['commit']})")
        for key in ("kills", "wall_seconds", "submit", "simulator", "jobs", "documents", "spend"):
            print(f"  {key}: {json.dumps(report.get(key), default=str)}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def check(
    report: dict[str, Any],
    store: Any,
    stats: dict[str, Any],
    ids: list[str],
    faulted: dict[str, list[str]],
) -> list[str]:
    """What the simulator and the results database say, into the report; the guarantees broken."""
    from ai_pipeline.store.openai_batches import LineState

    jobs = store.openai_batches.recent(limit=1000)
    lines = store.openai_batches.lines_of_documents(ids)
    per_task = Counter(line.task_id for line in lines)
    answered = Counter(line.task_id for line in lines if line.state == LineState.ANSWERED)
    rows = store.documents.rows(ids)
    states = Counter((r.state.value, r.category.value if r.category else None) for r in rows)
    attempts = store.spend.attempts(ids)
    paid = Counter(a["task_id"] for a in attempts)
    endpoints = stats.get("by_endpoint", {})
    report["simulator"] = {
        "files.create": endpoints.get("files.create", 0),
        "batches.create": endpoints.get("batches.create", 0),
        "batch_lines": stats.get("batch_lines"),
        "chat_calls": stats.get("total"),
    }
    report["jobs"] = [
        {"tasks": j.task_count, "status": j.status.value, "remote": j.remote_status} for j in jobs
    ]
    report["documents"] = {f"{s} {c or ''}".strip(): n for (s, c), n in states.items()}
    total = store.spend.total()
    report["spend"] = {"attempts": total.attempts, "cost_usd": round(total.cost_usd, 6)}
    report["results_rows"] = len(store.results.get(ids))

    problems = []
    sent_jobs = [j for j in jobs if j.batch_id is not None]
    if report["simulator"]["batches.create"] != len(sent_jobs):
        problems.append(
            f"{report['simulator']['batches.create']} batches for {len(sent_jobs)} jobs"
        )
    if report["simulator"]["files.create"] != len(sent_jobs):
        problems.append(f"{report['simulator']['files.create']} uploads for {len(sent_jobs)} jobs")
    # A task the batch gave up on (a line refused for good) gets an ordinary run, which
    # classifies it as a call would: one chat call each, none for any other document.
    gave_up = len(faulted["refused line (400)"])
    if (stats.get("total") or 0) > gave_up:
        problems.append(f"{stats['total']} chat calls, {gave_up} due (the tasks given up on)")
    if any(n > 1 for n in answered.values()):
        problems.append("a task answered by two lines")
    if any(n > 1 for n in paid.values()):
        problems.append(f"{sum(1 for n in paid.values() if n > 1)} tasks paid twice")
    again = {line.document_id for line in lines if per_task[line.task_id] > 1}
    expected_again = set(faulted["retryable 503"]) | set(faulted["expired"])
    if again != expected_again:
        problems.append(f"{len(again)} documents went into a second job, {len(expected_again)} due")
    if len(sent_jobs) != 2:
        problems.append(f"{len(sent_jobs)} jobs sent, 2 due (the first and one follow-up)")
    completed = states.get(("COMPLETED", None), 0)
    due = len(ids) - len(faulted["refusal"]) - len(faulted["refused line (400)"])
    if completed != due or report["results_rows"] != due:
        problems.append(f"{completed} COMPLETED and {report['results_rows']} rows, {due} due")
    return problems


if __name__ == "__main__":
    raise SystemExit(main())
