"""schemathesis against the served OpenAPI: no generated request gets a 5xx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ai_pipeline_tests.dagster_procs import DagsterProcess
from ai_pipeline_tests.service.conftest import auth

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.mark.slow
def test_no_generated_request_gets_a_server_error(service: DagsterProcess, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    (header,) = auth("acme").items()
    out = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{service.url}/openapi.json",
            "--header",
            f"{header[0]}: {header[1]}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "40",
            "--seed",
            "20261201",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "Selected: 5/5" in out.stdout, out.stdout[-3000:]
