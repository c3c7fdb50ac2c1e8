"""Unit tests of ai_pipeline.processes: naming a process, and knowing when it is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ai_pipeline.processes import ProcessRef, current, gone


def _started(pid: int) -> int:
    """A process's start time, in clock ticks after boot (field 22 of its stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_this_process_is_named_and_not_gone() -> None:
    """This process has a name that survives being stored, and is not gone."""
    me = current()
    assert me is not None
    assert ProcessRef.parse(me.text()) == me
    assert gone(me) is False
    assert ProcessRef.parse(None) is None
    assert ProcessRef.parse("not a process") is None


def test_a_process_that_ended_is_gone_and_a_reused_pid_is_not_it() -> None:
    """A child that exited is gone; the same pid with another start time is another process (a
    reused pid); a process of another space (another machine or container) is never judged."""
    me = current()
    assert me is not None
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        named = ProcessRef(me.space, child.pid, _started(child.pid))
        assert gone(named) is False
        assert gone(ProcessRef(me.space, child.pid, named.started + 1)) is True
        assert gone(ProcessRef("another-machine", child.pid, named.started + 1)) is False
    finally:
        child.communicate(b"")
    assert gone(named) is True
