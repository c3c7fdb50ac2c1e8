"""Several "hosts" on one machine, for the scale-out tests: network namespaces joined by veth pairs.

``Network(n)`` makes, in this (the main) namespace, a bridge with one address — the only address
the hosts can reach — and ``n`` hosts: each a network namespace whose end of a veth pair has an
address on that bridge's subnet and nothing else (its own loopback aside). Whatever a test wants
the hosts to reach (a broker, PostgreSQL, the LLM simulator) listens on ``network.address``;
``forward`` makes a service of the main namespace's loopback (the machine's PostgreSQL) reachable
there through ``socat``. ``Host.start`` runs a command in the host's namespace under a host name of
its own (``unshare --uts``), in a process group of its own.

``Network.remove`` (also run by the context manager when the test fails) ends every process the
network started and every process left in a host's namespace, then deletes the namespaces, the
veth pairs and the bridge; ``leftovers()`` tells what is still there. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ai_pipeline_tests.dagster_procs import free_port, live_members
from ai_pipeline_tests.postgres import PG_HOST, PG_PORT

# 10.251.<k>.0/24, k from this process id: tests of two pytest workers get different subnets.
SUBNET_PREFIX = "10.251"
STOP_SECONDS = 20


def unavailable_reason() -> str | None:
    """None when this process can make namespaces (root, ``ip``, ``unshare``, ``socat``)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "socat"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], check=check, capture_output=True, text=True)


class Process:
    """A command started in a process group (and session) of its own, its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]):
        self.name = name
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        self.log_path = log_path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` to the group; SIGKILL to what is left of it after ``STOP_SECONDS``."""
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline and (self.alive() or live_members(pgid)):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class Host:
    """One host: a network namespace with one address on the network's bridge."""

    def __init__(self, network: Network, index: int) -> None:
        self.network = network
        self.index = index
        self.name = f"host{index}"
        self.namespace = f"{network.tag}h{index}"
        self.veth = f"{network.tag}v{index}"  # the main namespace's end
        self.peer = f"{network.tag}p{index}"  # the host's end
        self.address = f"{network.subnet}.{10 + index}"
        self.processes: list[Process] = []

    def create(self) -> None:
        _ip("netns", "add", self.namespace)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        _ip("link", "set", self.peer, "netns", self.namespace)
        _ip("link", "set", self.veth, "master", self.network.bridge)
        _ip("link", "set", self.veth, "up")
        inside = ("netns", "exec", self.namespace, "ip")
        _ip(*inside, "addr", "add", f"{self.address}/24", "dev", self.peer)
        _ip(*inside, "link", "set", self.peer, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Process:
        """``argv`` in this host's namespace, its host name ``self.name``."""
        wrapped = [
            "ip",
            "netns",
            "exec",
            self.namespace,
            "unshare",
            "--uts",
            "sh",
            "-c",
            f'hostname {self.name} && exec "$@"',
            "sh",
            *argv,
        ]
        process = Process(name, wrapped, self.network.folder / f"{self.name}-{name}.log", env)
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process in this host's namespace (``ip netns pids``)."""
        out = _ip("netns", "pids", self.namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def kill(self) -> None:
        """The host vanishes, as on a power loss: its link is cut first, so no peer hears its
        connections close (the broker, PostgreSQL and the simulator keep them half-open), then
        every process in its namespace is SIGKILLed."""
        _ip("link", "set", self.veth, "down", check=False)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        for process in self.processes:
            process.stop()
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.namespace, check=False)


class Network:
    """A bridge in the main namespace (``address``) and ``hosts`` namespaces joined to it."""

    def __init__(self, hosts: int, folder: Path) -> None:
        k = os.getpid() % 250 + 1
        self.tag = f"aip{os.getpid() % 100000}"
        self.subnet = f"{SUBNET_PREFIX}.{k}"
        self.address = f"{self.subnet}.1"
        self.bridge = f"{self.tag}br"
        self.folder = folder
        self.hosts = [Host(self, i + 1) for i in range(hosts)]
        self.processes: list[Process] = []

    def __enter__(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                host.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Process:
        """A process of the main namespace that ``remove`` ends."""
        process = Process(name, argv, self.folder / f"main-{name}.log", env)
        self.processes.append(process)
        return process

    def forward(self, port: int, target: str) -> Process:
        """``address:port`` forwarded to ``target`` (``host:port``) of the main namespace."""
        return self.start(
            f"socat-{port}",
            ["socat", f"TCP-LISTEN:{port},bind={self.address},fork,reuseaddr", f"TCP:{target}"],
            os.environ,
        )

    def broker_and_postgres(self) -> tuple[int, int]:
        """What every host of a scale-out reaches on the bridge: a Redis started here as the
        Celery broker and backend, and the local PostgreSQL forwarded; their ports, once both
        answer."""
        redis_port, pg_port = free_port(), free_port()
        self.start(
            "redis",
            [
                "redis-server",
                *("--bind", self.address, "--port", str(redis_port), "--protected-mode", "no"),
                *("--save", "", "--appendonly", "no"),
            ],
            os.environ,
        )
        self.forward(pg_port, f"{PG_HOST}:{PG_PORT}")
        wait_for_port(self.address, redis_port)
        wait_for_port(self.address, pg_port)
        return redis_port, pg_port

    def remove(self) -> None:
        for host in self.hosts:
            host.remove()
        for process in self.processes:
            process.stop()
        _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network still present (empty after ``remove``)."""
        namespaces = _ip("netns", "list", check=False).stdout
        links = _ip("-o", "link", "show", check=False).stdout
        return [line.strip() for line in (namespaces + links).splitlines() if self.tag in line]


def wait_for_port(address: str, port: int, timeout: float = 30.0) -> None:
    """Until something accepts connections on ``address:port``."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((address, port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {address}:{port} after {timeout} s")
        time.sleep(0.2)
