"""The inbox: finding the files of a folder, and those that arrived since a cursor.

Only directory entries are listed and stat'ed here; no file is opened, so a scan's cost is a listing
plus the new files. Reading the files is ``ai_pipeline.documents``; registering them is
``ai_pipeline.intake``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class InboxCursor:
    """Where the last scan of an inbox stopped.

    ``arrived_ns`` is the newest arrival time seen; ``names`` are the files that arrived exactly at
    that instant (several files can share a timestamp). A file's arrival time is the latest of its
    modification time, its status-change time and the status-change times of the folders between
    the inbox and the file: a file moved or copied in with an old modification time (``mv``,
    ``cp -p``, ``rsync -t``) gets a fresh status-change time, and a folder moved in gets one for
    itself (not for its files), so neither is missed.
    """

    arrived_ns: int = 0
    names: frozenset[str] = frozenset()

    def serialize(self) -> str:
        return json.dumps({"arrived_ns": self.arrived_ns, "names": sorted(self.names)})

    @classmethod
    def parse(cls, value: str | None) -> InboxCursor:
        if not value:
            return cls()
        data = json.loads(value)
        return cls(arrived_ns=int(data["arrived_ns"]), names=frozenset(data["names"]))


@dataclass(frozen=True)
class InboxScan:
    """The files that arrived since the cursor, and the cursor to pass next time.

    ``revisited`` are the files among ``paths`` that count as arrived only because a folder above
    them changed (a folder moved in, or a file added beside them): the caller should skip those it
    already knows, without reading them.
    """

    paths: list[Path]
    cursor: InboxCursor
    revisited: frozenset[Path] = frozenset()


def _arrival_ns(stat: os.stat_result) -> int:
    return max(stat.st_mtime_ns, stat.st_ctime_ns)


def scan_inbox(
    inbox: str | Path,
    cursor: InboxCursor | None = None,
    *,
    settle_seconds: float = 0.0,
    now_ns: int | None = None,
) -> InboxScan:
    """Find the files of ``inbox`` (recursively) that arrived after ``cursor``.

    Only directory entries are listed and stat'ed; no file is opened, so a scan's cost is a listing
    plus the new files. Files that changed within ``settle_seconds`` are left for the next scan (they
    may still be being written). Hidden files and folders (``.name``) are skipped.
    """
    cursor = cursor or InboxCursor()
    inbox = Path(inbox)
    if not inbox.is_dir():
        raise FileNotFoundError(f"inbox {inbox} is not a directory")
    now = now_ns if now_ns is not None else _now_ns()
    settle_ns = int(settle_seconds * 1e9)
    found: list[tuple[int, str, Path]] = []
    revisited: set[Path] = set()
    for entry_path, stat, folder_ns in _walk(inbox):
        own = _arrival_ns(stat)
        arrived = max(own, folder_ns)
        if now - arrived < settle_ns:
            continue
        name = str(entry_path.relative_to(inbox))
        if arrived < cursor.arrived_ns or (arrived == cursor.arrived_ns and name in cursor.names):
            continue
        found.append((arrived, name, entry_path))
        if folder_ns > own:
            revisited.add(entry_path)
    found.sort()
    if not found:
        return InboxScan(paths=[], cursor=cursor)
    newest = found[-1][0]
    names = {name for arrived, name, _ in found if arrived == newest}
    if newest == cursor.arrived_ns:
        names |= cursor.names
    return InboxScan(
        paths=[path for _, _, path in found],
        cursor=InboxCursor(arrived_ns=newest, names=frozenset(names)),
        revisited=frozenset(revisited),
    )


def _now_ns() -> int:
    return time.time_ns()


def _walk(folder: Path, folder_ns: int = 0) -> Iterator[tuple[Path, os.stat_result, int]]:
    """Files below ``folder`` with their stat and the newest status change of the folders above
    them (the top folder itself excluded: it changes with every file added to it)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                sub_ns = max(folder_ns, entry.stat(follow_symlinks=False).st_ctime_ns)
                yield from _walk(Path(entry.path), sub_ns)
            elif entry.is_file():
                yield Path(entry.path), entry.stat(), folder_ns


def list_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into a sorted list of files (hidden ones skipped)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(path for path, _, _ in _walk(p))
        else:
            out.append(p)
    return sorted(out)
