"""Which process holds a claim, and whether it is known to be gone.

A lease (``ai_pipeline.store.leases``) records where its owner runs, so that a run meeting a claim
whose owner died on this machine — ``ai-pipeline run`` killed, a run worker killed — takes it over
at once instead of waiting out its expiry. A process is named by:

- its *space*: the kernel's boot id and the PID namespace. Process ids mean the same process
  exactly within one space: two containers sharing a host name (or a host's network) but not
  their PID namespace are two spaces, and so are two boots of one machine;
- its pid, and its start time (clock ticks after boot, from ``/proc/<pid>/stat``): a pid is
  reused, a (pid, start time) pair is not.

A process is *gone* only when it is known dead: in this space, and no process with that pid and
start time runs (or it is a zombie). A process of another space, or of a system without
``/proc``, is never judged here: its claim expires as before, or Dagster says its run is over.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessRef:
    space: str
    pid: int
    started: int

    def text(self) -> str:
        """How a lease stores it: ``<space> <pid> <start time>``."""
        return f"{self.space} {self.pid} {self.started}"

    @classmethod
    def parse(cls, text: str | None) -> ProcessRef | None:
        """The stored form read back; None for none or anything unreadable."""
        parts = (text or "").rsplit(" ", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]))


def _stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of a running process, None if there is none."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@functools.cache
def _space() -> str | None:
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}"


def current() -> ProcessRef | None:
    """This process, or None where the system does not say (no ``/proc``)."""
    space, stat = _space(), _stat(os.getpid())
    if space is None or stat is None:
        return None
    return ProcessRef(space, os.getpid(), stat[1])


def gone(process: ProcessRef | None) -> bool:
    """Whether ``process`` is known to have ended: it ran in this space and no longer runs."""
    if process is None or process.space != _space():
        return False
    stat = _stat(process.pid)
    return stat is None or stat[0] == "Z" or stat[1] != process.started
