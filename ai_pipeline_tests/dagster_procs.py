"""Real Dagster processes for the tests: ``dagster-daemon``, ``dagster-webserver``, ``dagster dev``.

Each runs from the repository on the project's workspace, in a session (and process group) of its
own, with this process's environment as it is at ``start`` (plus any extra variables), and writes
its output to a log file whose tail goes into failure messages. ``stop`` sends SIGTERM to the whole
group and fails, after a SIGKILL, only if a member is still *running* at the deadline: members that
end after their parent are re-parented to PID 1, which in this sandbox reaps them lazily, so they
may stay zombies for a while although they have exited (``os.killpg(pgid, 0)`` still succeeds
then); zombies are therefore never counted as alive, here or in ``processes_with_env``.

The fixtures that hand these processes to tests (``daemon`` in ``conftest.py``, ``webserver`` in
``defs/test_backfills.py``, ``dagster_dev`` in ``ui/test_browser.py``) end with ``running``: stop,
then, given the test's ``DAGSTER_HOME``, check that no process started for that instance is left
running, wherever it ended up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from ai_pipeline_tests.support import REPO

HOST = "127.0.0.1"
WORKSPACE = REPO / "workspace.yaml"
# How long ``wait_for`` waits by default.
DEADLINE_SECONDS = 180
# After SIGTERM: how long the process may take to exit, and then the rest of its group.
STOP_SECONDS = 30
# Seconds the test daemons' backfill loop pauses between iterations (Dagster's default is 30,
# a module constant that dagster 1.13.27 reads when the loop starts).
BACKFILL_LOOP_SECONDS = 3
DAEMON_WITH_BACKFILL_LOOP = """
import sys
import dagster._daemon.controller as controller
controller.DEFAULT_DAEMON_INTERVAL_SECONDS = {seconds}
from dagster._daemon.cli import main
sys.argv[0] = "dagster-daemon"
sys.exit(main())
"""
# The code locations of a web server and whether each has loaded.
CODE_LOCATIONS = """
{ workspaceOrError { ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename }
} } } }
"""


# --- processes in /proc ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, pgid, …"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live_pids() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process but this one that is not a zombie."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        stat = proc_stat(int(entry.name))
        if stat and stat[0] != "Z":
            yield int(entry.name), stat


def live_members(pgid: int) -> list[int]:
    """The processes of a group that are still running (zombies left out)."""
    return [pid for pid, stat in _live_pids() if int(stat[2]) == pgid]


def processes_with_env(name: str, value: str) -> list[int]:
    """Running processes (other than this one; zombies left out) whose environment has
    ``name=value``."""
    needle = b"\0" + f"{name}={value}".encode() + b"\0"
    found = []
    for pid, _ in _live_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + environ + b"\0":
            found.append(pid)
    return found


def describe(pids: Sequence[int]) -> str:
    """pid, parent, process group, state and command line of each process (for failure messages)."""
    lines = []
    for pid in pids:
        stat = proc_stat(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            cmd = "?"
        if stat:
            lines.append(f"  {pid} ppid={stat[1]} pgid={stat[2]} state={stat[0]}: {cmd[:200]}")
    return "\n".join(lines)


# --- one Dagster process --------------------------------------------------------------------------


class DagsterProcess:
    """A Dagster command run from the repository in a process group of its own."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        program = sys.executable if argv[0] == "python" else Path(sys.executable).with_name(argv[0])
        self.argv = [str(program), *argv[1:]]
        self.log_path = log_path
        self.port = port
        self.url = f"http://{HOST}:{port}" if port else ""
        self.env = dict(env or {})
        self.cwd = REPO
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    @classmethod
    def daemon(
        cls,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        backfill_loop_seconds: int = BACKFILL_LOOP_SECONDS,
        workspace: Path = WORKSPACE,
    ) -> DagsterProcess:
        """``dagster-daemon run``, its backfill loop pausing ``backfill_loop_seconds`` between
        iterations instead of Dagster's 30 (the only change: a test then waits seconds for a
        backfill instead of a minute; what an iteration does is the daemon's own code)."""
        script = DAEMON_WITH_BACKFILL_LOOP.format(seconds=backfill_loop_seconds)
        argv = ["python", "-c", script, "run", "-w", str(workspace)]
        return cls("dagster-daemon", argv, log_path, env=env)

    @classmethod
    def webserver(
        cls, log_path: Path, port: int | None = None, *, env: Mapping[str, str] | None = None
    ) -> DagsterProcess:
        """``dagster-webserver`` on a free port (or ``port``)."""
        port = port or free_port()
        argv = ["dagster-webserver", "-h", HOST, "-p", str(port), "-w", str(WORKSPACE)]
        return cls("dagster-webserver", argv, log_path, port=port, env=env)

    @classmethod
    def dev(
        cls, log_path: Path, port: int | None = None, *, env: Mapping[str, str] | None = None
    ) -> DagsterProcess:
        """``dagster dev`` (web server, daemon, code server) on a free port (or ``port``)."""
        port = port or free_port()
        argv = ["dagster", "dev", "-h", HOST, "-p", str(port), "-w", str(WORKSPACE)]
        return cls("dagster dev", argv, log_path, port=port, env=env)

    def start(self, *, ready_timeout: float | None = None) -> None:
        """Start it; with ``ready_timeout``, also wait that long for ``ready``."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=os.environ.copy() | self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A non-interactive parent may hand down "ignore SIGINT", and Dagster handles
                # SIGTERM as SIGINT: restore the default so that SIGTERM stops it.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        self.stopped = False
        if ready_timeout is not None:
            self.wait_ready(ready_timeout)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        assert self.proc is not None, f"{self.name} was not started"
        if self.proc.poll() is not None:
            pytest.fail(
                f"{self.name} exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"
            )

    def stop(self) -> None:
        """SIGTERM to the process group; fails (after SIGKILL) if the process has not exited
        ``STOP_SECONDS`` later, or a member of its group is still running (not a zombie)
        ``STOP_SECONDS`` after that, though told again every second (a member may have started
        after the first SIGTERM). Stopping what is stopped (or never started) does nothing."""
        if self.proc is None or self.stopped:
            return
        pgid = self.proc.pid
        before = describe(live_members(pgid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_SECONDS)
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline and live_members(pgid):
            # A member started while the group was shutting down (``dagster dev`` may start a
            # code server then) never saw the first SIGTERM: each round tells the group again.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            time.sleep(1.0)
        left = live_members(pgid)
        self.stopped = True
        if left or self.proc.poll() is None:
            after = describe(left)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"{self.name} outlived SIGTERM; its processes before SIGTERM:\n{before}\n"
                f"still running:\n{after}\nlog tail:\n{self.log_tail()}"
            )

    # --- web server (``webserver`` and ``dev``) ---

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60
        )
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return body["data"]  # type: ignore[no-any-return]

    def ready(self, *, locations_loaded: bool = False) -> bool:
        """Serving (``/server_info``); with ``locations_loaded``, every code location loaded too
        (a mutation needs its asset graph)."""
        assert self.url, f"{self.name} serves no HTTP"
        try:
            httpx.get(f"{self.url}/server_info", timeout=5).raise_for_status()
            if not locations_loaded:
                return True
            entries = self.graphql(CODE_LOCATIONS)["workspaceOrError"]["locationEntries"]
        except httpx.HTTPError:
            return False
        return bool(entries) and all(
            e["loadStatus"] == "LOADED"
            and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            for e in entries
        )

    def wait_ready(
        self, timeout: float = DEADLINE_SECONDS, *, locations_loaded: bool = False
    ) -> None:
        what = f"{self.name} to serve" + (" its code locations" if locations_loaded else "")
        wait_for(self, what, lambda: self.ready(locations_loaded=locations_loaded), timeout)


def wait_for(
    process: DagsterProcess,
    what: str,
    condition: Callable[[], Any],
    timeout: float = DEADLINE_SECONDS,
) -> Any:
    """Poll ``condition`` until it returns something true, and return that; fail at once if the
    process exits, and with its log tail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        process.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout} s waiting for {what}; {process.name} log tail:\n"
                f"{process.log_tail()}"
            )
        time.sleep(1.0)


@contextlib.contextmanager
def running(process: DagsterProcess, dagster_home: Path | None = None) -> Iterator[DagsterProcess]:
    """For a fixture: yields ``process`` (to be started by the test) and stops it at the end; with
    ``dagster_home``, then fails if any process with that ``DAGSTER_HOME`` is left running (its
    code server, a run worker, …, wherever it ended up)."""
    try:
        yield process
    finally:
        stopping, started = time.monotonic(), process.proc is not None and not process.stopped
        process.stop()
        if started:
            print(f"{process.name} stopped in {time.monotonic() - stopping:.1f} s")
        if dagster_home is not None:
            lingering = processes_with_env("DAGSTER_HOME", str(dagster_home))
            assert not lingering, (
                f"processes left behind:\n{describe(lingering)}\n"
                f"{process.name} log tail:\n{process.log_tail()}"
            )
