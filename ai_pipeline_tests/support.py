"""Helpers the tests share: sample documents, ids, statuses, the pipeline's entry points, fakes.

Fixtures live in ``conftest.py``; everything a test module imports lives here, so no test module
imports from another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.defs.jobs import RANGE_END_TAG, RANGE_START_TAG
from ai_pipeline.defs.launch import Launcher
from ai_pipeline.defs.partitions import documents_partitions
from ai_pipeline.documents import content_id, normalise_text
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.settings import Settings
from ai_pipeline.store import Store, open_store
from ai_pipeline.tasks import ANALYSE_STEP, NOTIFY_STEP, task_id

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TEST_API_KEY = "sk-test-0123456789abcdef"
TEST_MODEL = "sim-analyst-1"
STATUS = dg.AssetPartitionStatus
RANGE_START, RANGE_END = RANGE_START_TAG, RANGE_END_TAG
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


# --- documents -----------------------------------------------------------------------------------


def make_inbox(folder: Path, files: dict[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return folder


def sample_text(i: int) -> str:
    """A small, distinct, valid English document that the simulator analyses cleanly."""
    return (
        f"Order {i} for Harbor Supplies was delivered to Lisbon on time. "
        f"Customer Ana Ribeiro praised the excellent packaging of shipment {i}. "
        "The team resolved every question quickly."
    )


def doc_id(text: str) -> str:
    """The document id of a text document with this content."""
    return content_id(normalise_text(text).encode("utf-8"))


def rejected_id(path: Path, data: bytes | None = None) -> str:
    """The document id of a file that could not be read: its name and its bytes."""
    data = path.read_bytes() if data is None else data
    return content_id(b"rejected\x00" + str(path).encode("utf-8") + b"\x00" + data)


def task_of(document_id: str) -> str:
    """The analysis task id of a document under the test model and the current prompt."""
    return task_id(document_id, ANALYSE_STEP, DOCUMENT_ANALYSIS.version, TEST_MODEL)


# --- the pipeline --------------------------------------------------------------------------------


def results_store() -> Store:
    """The results database the environment points at (as every command would open it)."""
    return open_store(Settings.load())


def launcher(instance: dg.DagsterInstance | None = None) -> Launcher:
    """The application layer for the test's instance (``DAGSTER_HOME``) and the code location."""
    from ai_pipeline.definitions import defs

    return Launcher(instance or dg.DagsterInstance.get(), defs)


def process_inbox(inbox: Path, **kwargs: Any) -> dict[str, Any]:
    """Register and analyse a folder through Dagster, as ``ai-pipeline run`` does."""
    return launcher().process_inbox(inbox, **kwargs)


def cli(*argv: str) -> int:
    """Run ``ai-pipeline ARGV`` in this process; returns the exit code."""
    from ai_pipeline.cli import main

    return main(list(argv))


def latest_materialization(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, document_id: str
) -> Any:
    """The event of one document's newest materialization of an asset."""
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[document_id]), limit=1
    ).records
    return record.event_log_entry


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """``ai-pipeline ARGV`` in this process: exit code and the JSON it printed."""
    capsys.readouterr()
    from ai_pipeline.cli import main

    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def statuses(instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys: list[str]) -> dict:
    return dict(instance.get_status_by_partition(asset_key, keys, documents_partitions) or {})


def point_llm_at(
    monkeypatch: pytest.MonkeyPatch, server: SimulatorServer, concurrency: int | None = None
) -> None:
    """The LLM settings of this process and of the processes it starts, pointing at ``server``."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", TEST_API_KEY)
    monkeypatch.setenv("AI_PIPELINE_MODEL", TEST_MODEL)
    if concurrency is not None:
        monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", str(concurrency))


@contextmanager
def own_simulator(
    monkeypatch: pytest.MonkeyPatch, *, latency_ms: int, concurrency: int, max_concurrency: int = 64
) -> Iterator[SimulatorServer]:
    """A simulator of the test's own (its latency, its counters), the LLM settings pointing at it
    with ``concurrency`` calls in flight per run."""
    config = SimulatorConfig(latency_ms=latency_ms, max_concurrency=max_concurrency)
    with SimulatorServer(config) as server:
        point_llm_at(monkeypatch, server, concurrency)
        yield server


def instance_yaml(*, accelerated: bool = False) -> str:
    """The checkout's dagster.yaml (which turns the accelerator on), or without the accelerator's
    storage sections: Dagster's own SQLite storage, as a team's instance has it."""
    from ai_pipeline.accelerator.sqlite import without_sqlite_storage

    text = (REPO / "dagster.yaml").read_text()
    return text if accelerated else without_sqlite_storage(text)


def instance_yaml_on_postgres(
    host: str, port: int | str, db_name: str, user: str = "postgres", *, accelerated: bool = False
) -> str:
    """The checkout's dagster.yaml with the instance's storage on this PostgreSQL database:
    dagster-postgres's own (``storage: postgres``), or the accelerator's."""
    from ai_pipeline.accelerator.postgres import storage_yaml

    database = {
        "hostname": host,
        "port": port,
        "db_name": db_name,
        "username": user,
        "scheme": "postgresql+psycopg2",
    }
    if accelerated:
        storage = storage_yaml(postgres_db=database)
    else:
        storage = "storage:\n  postgres:\n    postgres_db:\n" + "".join(
            f"      {key}: {value}\n" for key, value in database.items()
        )
    return instance_yaml() + "\n" + storage


def compute_log(instance: dg.DagsterInstance, run_id: str) -> str:
    """What the run's steps wrote to stderr, as Dagster captured it (the UI's compute log)."""
    out = []
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.LOGS_CAPTURED):
        assert record.dagster_event is not None
        file_key = record.dagster_event.event_specific_data.file_key  # type: ignore[union-attr]
        data = instance.compute_log_manager.get_log_data([run_id, "compute_logs", file_key])
        out.append((data.stderr or b"").decode("utf-8", "replace"))
    return "".join(out)


def user_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The log lines our code wrote in a run (Dagster's own events left out)."""
    return [r.user_message for r in instance.all_logs(run_id) if r.dagster_event is None]


# --- processes -----------------------------------------------------------------------------------


def kill_when(
    script: str, args: list[str], window: Callable[[], bool], tmp_path: Path, *, settle: float = 0
) -> None:
    """Run ``script`` in a child process and SIGKILL it once ``window()`` is true.

    The script monkeypatches one store method to stall, which holds the child inside the window
    (after one durable write, before the next); everything else it runs is the real code. The
    child's claims last 3 s, so that the run after the kill takes its documents over quickly.
    """
    path = tmp_path / "run_and_stall.py"
    path.write_text(script)
    proc = subprocess.Popen(
        [sys.executable, str(path), *args],
        env=os.environ | {"AI_PIPELINE_LEASE_SECONDS": "3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not window():
            assert proc.poll() is None, "the run ended before it could be killed"
            if time.monotonic() > deadline:
                pytest.fail("the run never reached the window it should be killed in")
            time.sleep(0.05)
        time.sleep(settle)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


# --- fakes for plain code ------------------------------------------------------------------------


class FakeTime:
    """A clock that moves only when the code under test sleeps; every sleep is recorded, none is
    real. ``extra`` is added to the clock on each sleep, to make a wait outlast a window."""

    def __init__(self, start: float = 10_000.0, extra: float = 0.0) -> None:
        self.now = start
        self.extra = extra
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.extra


class RecordingLog:
    """A log that keeps its lines, by level."""

    def __init__(self) -> None:
        self.infos: list[str] = []
        self.warnings: list[str] = []
        self.errors: list[str] = []

    def info(self, msg: str) -> None:
        self.infos.append(msg)

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)

    def error(self, msg: str) -> None:
        self.errors.append(msg)

    @property
    def lines(self) -> list[str]:
        return [*self.infos, *self.warnings, *self.errors]


def notice_key(document_id: str) -> str:
    """The Idempotency-Key of a document's completion notice: its notice task id."""
    return task_id(document_id, NOTIFY_STEP, DOCUMENT_ANALYSIS.version, TEST_MODEL)


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The documents of a status report (``status --json``, a run's outcome) by id."""
    return {d["document_id"]: d for d in report["documents"]}


def new_release(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """A new release of the built-in analysis in this process (e.g. ``version="v2"``): task ids
    built after follow it."""
    from ai_pipeline import analyses

    released = DOCUMENT_ANALYSIS.model_copy(update=changes)
    monkeypatch.setitem(analyses.BUILTINS, DOCUMENT_ANALYSIS.name, released)
