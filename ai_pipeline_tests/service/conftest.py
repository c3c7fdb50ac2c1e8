"""The submission service under a real uvicorn server (``ai-pipeline serve`` in a process of its
own), on the test's instance and results database, with two tenants and an operator."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.dagster_procs import DagsterProcess, free_port, running, wait_for

if TYPE_CHECKING:
    from ai_pipeline.store import Store

TENANTS = {
    "acme": ["acme-key-1", "acme-key-2"],
    "globex": ["globex-key"],
}
OPERATOR_KEY = "operator-key"


def auth(tenant: str, *, key: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANTS[tenant][key]}"}


def write_tenants_file(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tenants file of ``TENANTS`` and the operator key, named by AI_PIPELINE_TENANTS_FILE."""
    lines = ["tenants:"]
    for tenant, keys in TENANTS.items():
        lines += [f"  {tenant}:", f"    keys: [{', '.join(keys)}]"]
    lines += ["operators:", f"  keys: [{OPERATOR_KEY}]"]
    path = folder / "tenants.yaml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AI_PIPELINE_TENANTS_FILE", str(path))
    return path


@pytest.fixture
def tenants_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_tenants_file(tmp_path, monkeypatch)


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
    group) at the end. Its public URL is where the tests reach it, unless ``args`` say otherwise
    (``--public-url``, given again, wins)."""
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
        "--public-url",
        f"http://127.0.0.1:{port}",
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


def submit_text(url: str, tenant: str, text: str, name: str = "doc.txt") -> str:
    """Submit ``text`` as the tenant's document; its task id."""
    response = httpx.post(
        f"{url}/api/v1/tasks",
        json={"text": text, "name": name},
        headers=auth(tenant),
        timeout=30,
    )
    assert response.status_code in (200, 202), response.text
    return str(response.json()["task_id"])


def failed_into_review(
    tenant: str,
    task: str,
    error: str = "the endpoint refused it (400)",
    store: Store | None = None,
) -> str:
    """What a run does to a submitted task whose input the endpoint refuses, without the run:
    its document FAILED (INPUT_QUALITY_ISSUE) and in front of a person, in ``store`` (default:
    the results database the environment points at). Its document id."""
    from ai_pipeline.failures import Category
    from ai_pipeline.review import send_to_review
    from ai_pipeline.states import State
    from ai_pipeline_tests.support import results_store

    store = store or results_store()
    submitted = store.tasks.get(tenant, task)
    assert submitted is not None
    document_id = submitted.document_id
    for state in (State.QUEUED, State.RUNNING):
        store.documents.transition(document_id, state)
    category = Category.INPUT_QUALITY_ISSUE
    store.documents.transition(document_id, State.FAILED, category=category, error=error)
    doc = store.documents.load(document_id)
    assert doc is not None
    send_to_review(store, doc, category, error, task)
    return document_id


def pdf_with_page(width: float, height: float, text: str = "Tall thin page") -> bytes:
    """A one-page PDF (a few hundred bytes) whose page box is ``width`` × ``height`` points,
    with a line of text (so that it is a readable document)."""
    stream = f"BT /F1 1 Tf 0 2 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] "
        "/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".encode(),
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)
