"""The submission service under a real uvicorn server (``ai-pipeline serve`` in a process of its
own), on the test's instance and results database, with two tenants and an operator."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.dagster_procs import DagsterProcess, free_port, running, wait_for

TENANTS = {
    "acme": ["acme-key-1", "acme-key-2"],
    "globex": ["globex-key"],
}
OPERATOR_KEY = "operator-key"


def auth(tenant: str, *, key: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANTS[tenant][key]}"}


@pytest.fixture
def tenants_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lines = ["tenants:"]
    for tenant, keys in TENANTS.items():
        lines += [f"  {tenant}:", f"    keys: [{', '.join(keys)}]"]
    lines += ["operators:", f"  keys: [{OPERATOR_KEY}]"]
    path = tmp_path / "tenants.yaml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AI_PIPELINE_TENANTS_FILE", str(path))
    return path


@pytest.fixture
def serve_args() -> list[str]:
    """More arguments of ``ai-pipeline serve``; a test parametrizes it to start the service
    otherwise (``@pytest.mark.parametrize("serve_args", [[...]])``)."""
    return []


@pytest.fixture
def service(
    serve_args: list[str],
    tmp_path: Path,
    dagster_home: Path,
    tenants_file: Path,
    simulator: SimulatorServer,
    daemon: DagsterProcess,
) -> Iterator[DagsterProcess]:
    """``ai-pipeline serve`` on a free port, serving (its OpenAPI answers); stopped at the end,
    before the daemon fixture (which the test may start) checks that nothing of the instance is
    left running. It starts with the LLM settings of the runs (the model is part of every task id
    it hands out), as a deployment does."""
    with serving(tmp_path / "serve.log", serve_args) as server:
        yield server


@contextmanager
def serving(log: Path, args: Sequence[str] = ()) -> Iterator[DagsterProcess]:
    """An ``ai-pipeline serve`` process on a free port, once it serves; stopped (with its process
    group) at the end."""
    port = free_port()
    argv = [
        "python",
        "-m",
        "ai_pipeline.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    process = DagsterProcess("ai-pipeline serve", argv, log, port=port)
    # Its own process group must be gone after (``stop``); what else ran for the instance is the
    # daemon fixture's to check, after this one.
    with running(process) as server:
        server.start()

        def serves() -> bool:
            try:
                return httpx.get(f"{server.url}/openapi.json", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(server, "the service to serve", serves, timeout=60)
        yield server
