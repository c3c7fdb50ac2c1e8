"""The inbox: finding the files of a folder, and those that arrived since a cursor.

The inbox is hostile input: anyone who can write to it decides what is there. So an entry is read
only when it is a regular file inside the inbox, and every other entry gets a clear reason naming
its path — never a crash, a hang or a read outside the inbox:

- a symlink is followed only to a regular file inside the inbox (a copy by another name: an alias
  of that document); a symlink leading out of the inbox, to a folder, in a loop or nowhere is
  skipped and said so;
- named pipes, sockets and devices are skipped (opening a pipe would block for ever);
- hidden entries (``.name``: editor swap files, ``.DS_Store``, ``.git``) are skipped;
- a file whose name is not valid UTF-8 is registered as a rejected file, as is a file that cannot
  be read (``ai_pipeline.intake``);
- a folder that cannot be listed is skipped; an entry that vanished while the inbox was read too;
- a file changed within the settle time may still be being written: it is left for the next scan.

Only directory entries are listed and stat'ed here; no file is opened, so a scan's cost is a listing
plus the new files. Reading the files is ``ai_pipeline.documents``; registering them is
``ai_pipeline.intake``.
"""

from __future__ import annotations

import errno
import heapq
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ai_pipeline.documents import display_path


@dataclass(frozen=True)
class Skipped:
    """An inbox entry that is not a document, and why (the path in its display form)."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class _Found:
    path: Path
    arrived_ns: int
    folder_ns: int
    own_ns: int
    skipped: str | None = None


def _arrival_ns(st: os.stat_result) -> int:
    return max(st.st_mtime_ns, st.st_ctime_ns)


_SPECIAL = (
    (stat.S_ISFIFO, "a named pipe (FIFO), not a file"),
    (stat.S_ISSOCK, "a socket, not a file"),
    (stat.S_ISCHR, "a character device, not a file"),
    (stat.S_ISBLK, "a block device, not a file"),
)


def _classify(entry: os.DirEntry[str], root: str) -> tuple[os.stat_result | None, str | None, bool]:
    """(the stat to date the entry by, why it is skipped or None, whether it is a folder to walk)."""
    try:
        own = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None, "vanished while the inbox was read", False
    except OSError as e:
        return None, f"cannot be examined ({e.strerror or e})", False
    if stat.S_ISDIR(own.st_mode):
        return own, None, True
    if stat.S_ISLNK(own.st_mode):
        try:
            target = os.stat(entry.path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return own, "a symlink loop; not followed", False
            if e.errno == errno.ENOENT:
                return own, "a dangling symlink (its target does not exist)", False
            return own, f"a symlink that cannot be followed ({e.strerror or e})", False
        real = os.path.realpath(entry.path)
        if os.path.commonpath([real, root]) != root:
            where = display_path(real)
            return own, f"a symlink to {where}, outside the inbox; not followed", False
        if stat.S_ISDIR(target.st_mode):
            return own, "a symlink to a folder; not followed (move the folder in instead)", False
        if not stat.S_ISREG(target.st_mode):
            return own, "a symlink to something that is not a file; not followed", False
        return target, None, False
    for test, reason in _SPECIAL:
        if test(own.st_mode):
            return own, reason, False
    if not stat.S_ISREG(own.st_mode):
        return own, "not a regular file", False
    return own, None, False


def _walk(folder: str, root: str, folder_ns: int = 0) -> Iterator[_Found]:
    """Every entry below ``folder``, files to read and entries to skip, with arrival times: a
    file's own (its modification or status change) and the newest status change of the folders
    between the inbox and it (the inbox itself excluded: it changes with every file added)."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError as e:
        if folder == root:
            raise
        yield _Found(Path(folder), folder_ns, folder_ns, 0, f"cannot be listed ({e.strerror or e})")
        return
    for entry in entries:
        path = Path(entry.path)
        st, skipped, is_dir = _classify(entry, root)
        if entry.name.startswith("."):
            # Editor swap files, .DS_Store, a sync tool's state: never documents, never walked.
            skipped, is_dir = "hidden (the name starts with a dot); not read", False
        own = _arrival_ns(st) if st is not None else 0
        if is_dir:
            assert st is not None
            yield from _walk(entry.path, root, max(folder_ns, st.st_ctime_ns))
            continue
        yield _Found(path, max(own, folder_ns), folder_ns, own, skipped)


def _root(inbox: str | Path) -> str:
    root = os.path.realpath(inbox)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"inbox {display_path(inbox)} is not a directory")
    return root


def _settling(found: _Found, now_ns: int, settle_ns: int) -> bool:
    return found.skipped is None and now_ns - found.arrived_ns < settle_ns


@dataclass(frozen=True)
class Listing:
    """The files of a folder to read, the entries skipped (with why), and the files left because
    they changed within the settle time."""

    files: list[Path]
    skipped: list[Skipped] = field(default_factory=list)
    settling: list[Path] = field(default_factory=list)


def list_files(paths: Iterable[str | Path], *, settle_seconds: float = 0.0) -> Listing:
    """Expand files and folders into a sorted list of files to read (see the module's rules)."""
    now, settle_ns = time.time_ns(), int(settle_seconds * 1e9)
    files: list[Path] = []
    skipped: list[Skipped] = []
    settling: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            root = _root(p)
            found: Iterable[_Found] = _walk(str(p), root)
        else:
            found = [_Found(p, 0, 0, 0)]
        for f in found:
            if f.skipped is not None:
                skipped.append(Skipped(display_path(f.path), f.skipped))
            elif _settling(f, now, settle_ns):
                settling.append(f.path)
            else:
                files.append(f.path)
    return Listing(sorted(files), sorted(skipped, key=lambda s: s.path), sorted(settling))


@dataclass(frozen=True)
class InboxCursor:
    """Where the last scan of an inbox stopped.

    ``arrived_ns`` is the newest arrival time seen; ``names`` are the entries that arrived exactly at
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
    """What arrived since the cursor: files to read, entries skipped, and the next cursor.

    ``revisited`` are the files among ``paths`` that count as arrived only because a folder above
    them changed (a folder moved in, or a file added beside them): the caller should skip those it
    already knows, without reading them. ``more`` counts the arrivals left for the next scan by
    its ``limit``.
    """

    paths: list[Path]
    cursor: InboxCursor
    revisited: frozenset[Path] = frozenset()
    skipped: list[Skipped] = field(default_factory=list)
    more: int = 0


def scan_inbox(
    inbox: str | Path,
    cursor: InboxCursor | None = None,
    *,
    settle_seconds: float = 0.0,
    now_ns: int | None = None,
    limit: int | None = None,
) -> InboxScan:
    """Find the entries of ``inbox`` (recursively) that arrived after ``cursor``.

    Files that changed within ``settle_seconds`` are left for the next scan (they may still be
    being written). Skipped entries are reported once, when they arrive. With ``limit``, at most
    that many entries (the earliest arrivals) are taken and the cursor stops after the last one
    taken, so a backlog is drained over successive scans: ``InboxScan.more`` says one is left.
    """
    cursor = cursor or InboxCursor()
    root = _root(inbox)
    now = now_ns if now_ns is not None else time.time_ns()
    settle_ns = int(settle_seconds * 1e9)
    found: list[tuple[int, str, _Found]] = []
    for f in _walk(str(inbox), root):
        if _settling(f, now, settle_ns):
            continue
        name = display_path(f.path.relative_to(inbox))
        if f.arrived_ns < cursor.arrived_ns or (
            f.arrived_ns == cursor.arrived_ns and name in cursor.names
        ):
            continue
        found.append((f.arrived_ns, name, f))
    if not found:
        return InboxScan(paths=[], cursor=cursor)
    more = 0
    if limit is not None and len(found) > limit:
        # Only the earliest ``limit`` need sorting; the rest wait for the next scan.
        more = len(found) - limit
        found = heapq.nsmallest(limit, found, key=lambda item: (item[0], item[1]))
    else:
        found.sort(key=lambda item: (item[0], item[1]))
    newest = found[-1][0]
    names = {name for arrived, name, _ in found if arrived == newest}
    if newest == cursor.arrived_ns:
        names |= cursor.names
    files = [f for _, _, f in found if f.skipped is None]
    return InboxScan(
        paths=[f.path for f in files],
        cursor=InboxCursor(arrived_ns=newest, names=frozenset(names)),
        revisited=frozenset(f.path for f in files if f.folder_ns > f.own_ns),
        skipped=[Skipped(display_path(f.path), f.skipped) for _, _, f in found if f.skipped],
        more=more,
    )
