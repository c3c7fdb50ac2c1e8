"""Unit tests of ai_pipeline.inbox: listing a folder, and the scan that finds new arrivals."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from ai_pipeline.inbox import InboxCursor, list_files, scan_inbox
from ai_pipeline_tests.support import EXAMPLES

INBOX = EXAMPLES / "inbox"
BAD = EXAMPLES / "bad"
TICKET = INBOX / "support-ticket-refund-delay.txt"


def _arrival_ns(path: Path) -> int:
    stat = os.stat(path)
    return max(stat.st_mtime_ns, stat.st_ctime_ns)


def _make_inbox(root: Path) -> Path:
    inbox = root / "inbox"
    inbox.mkdir()
    for name in ("a.txt", "b.md"):
        (inbox / name).write_text(f"content of {name}\n", encoding="utf-8")
    (inbox / "sub").mkdir()
    (inbox / "sub" / "c.html").write_text("<p>c</p>", encoding="utf-8")
    (inbox / ".hidden.txt").write_text("hidden", encoding="utf-8")
    (inbox / ".git").mkdir()
    (inbox / ".git" / "config").write_text("hidden folder", encoding="utf-8")
    return inbox


def test_first_scan_finds_all_visible_files(tmp_path: Path) -> None:
    """A scan without a cursor finds every file, recursively; hidden files and folders are
    skipped (and said so, once: the cursor moves past them too)."""
    inbox = _make_inbox(tmp_path)
    scan = scan_inbox(inbox)
    assert sorted(scan.paths) == sorted([inbox / "a.txt", inbox / "b.md", inbox / "sub" / "c.html"])
    assert sorted(s.path for s in scan.skipped) == [str(inbox / ".git"), str(inbox / ".hidden.txt")]
    assert all("hidden" in s.reason for s in scan.skipped)
    entries = [*scan.paths, inbox / ".git", inbox / ".hidden.txt"]
    newest = max(_arrival_ns(p) for p in entries)
    assert scan.cursor.arrived_ns == newest
    assert scan.cursor.names == {
        str(p.relative_to(inbox)) for p in entries if _arrival_ns(p) == newest
    }
    assert scan_inbox(inbox, scan.cursor).skipped == []


def test_scan_paths_are_ordered_by_arrival(tmp_path: Path) -> None:
    """Scanned paths come oldest arrival first."""
    inbox = _make_inbox(tmp_path)
    arrivals = [_arrival_ns(p) for p in scan_inbox(inbox).paths]
    assert arrivals == sorted(arrivals)


def test_second_scan_with_returned_cursor_finds_nothing(tmp_path: Path) -> None:
    """Scanning again from the returned cursor finds no file and keeps the cursor."""
    inbox = _make_inbox(tmp_path)
    first = scan_inbox(inbox)
    second = scan_inbox(inbox, first.cursor)
    assert second.paths == []
    assert second.cursor == first.cursor
    reparsed = scan_inbox(inbox, InboxCursor.parse(first.cursor.serialize()))
    assert reparsed.paths == []


def test_newly_written_file_is_found_alone(tmp_path: Path) -> None:
    """A file written after a scan is the only file the next scan finds."""
    inbox = _make_inbox(tmp_path)
    first = scan_inbox(inbox)
    new = inbox / "sub" / "new.txt"
    new.write_text("new arrival", encoding="utf-8")
    second = scan_inbox(inbox, first.cursor)
    # Its folder changed too, so its siblings come back marked as revisited (the caller skips the
    # ones it knows without reading them); the new file itself is not.
    assert [p for p in second.paths if p not in second.revisited] == [new]
    assert second.revisited == {p for p in (inbox / "sub").iterdir() if p != new}
    assert second.cursor.arrived_ns == _arrival_ns(new) >= first.cursor.arrived_ns
    assert "sub/new.txt" in second.cursor.names
    assert scan_inbox(inbox, second.cursor).paths == []


def test_file_copied_in_with_old_mtime_is_found(tmp_path: Path) -> None:
    """A file whose modification time is in the past is still found, by its status-change time."""
    inbox = _make_inbox(tmp_path)
    first = scan_inbox(inbox)
    old = inbox / "copied-with-old-mtime.txt"
    shutil.copyfile(TICKET, old)
    past_ns = 946_684_800 * 10**9  # 2000-01-01
    os.utime(old, ns=(past_ns, past_ns))
    assert os.stat(old).st_mtime_ns == past_ns < first.cursor.arrived_ns
    second = scan_inbox(inbox, first.cursor)
    assert second.paths == [old]


def test_settle_seconds_skips_a_just_written_file(tmp_path: Path) -> None:
    """A file changed within settle_seconds of now is left for a later scan."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    path = inbox / "fresh.txt"
    path.write_text("still being written", encoding="utf-8")
    arrived = _arrival_ns(path)
    early = scan_inbox(inbox, settle_seconds=1.0, now_ns=arrived + 500_000_000)
    assert early.paths == []
    assert early.cursor == InboxCursor()
    late = scan_inbox(inbox, early.cursor, settle_seconds=1.0, now_ns=arrived + 1_000_000_000)
    assert late.paths == [path]
    assert late.cursor == InboxCursor(arrived_ns=arrived, names=frozenset({"fresh.txt"}))


def test_settle_skips_only_the_fresh_file(tmp_path: Path) -> None:
    """Settled files are returned while a fresher one is held back, and found on the next scan."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    settled, fresh = inbox / "settled.txt", inbox / "fresh.txt"
    settled.write_text("old", encoding="utf-8")
    time.sleep(0.2)
    fresh.write_text("new", encoding="utf-8")
    now = _arrival_ns(fresh) + 10_000_000  # 10 ms after the fresh file arrived
    assert now - _arrival_ns(settled) > 100_000_000
    first = scan_inbox(inbox, settle_seconds=0.05, now_ns=now)
    assert first.paths == [settled]
    assert first.cursor.names == {"settled.txt"}
    second = scan_inbox(inbox, first.cursor, settle_seconds=0.05, now_ns=now + 1_000_000_000)
    assert second.paths == [fresh]


def test_files_sharing_the_cursor_timestamp_are_not_lost(tmp_path: Path) -> None:
    """A file arriving at the cursor's instant under a new name is found; known names are not."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    path = inbox / "x.txt"
    path.write_text("x", encoding="utf-8")
    arrived = _arrival_ns(path)
    same_instant_other_name = InboxCursor(arrived_ns=arrived, names=frozenset({"other.txt"}))
    scan = scan_inbox(inbox, same_instant_other_name)
    assert scan.paths == [path]
    assert scan.cursor.names == {"other.txt", "x.txt"}
    known = InboxCursor(arrived_ns=arrived, names=frozenset({"x.txt"}))
    assert scan_inbox(inbox, known).paths == []


def _drain(inbox: Path, limit: int) -> list[list[str]]:
    """The names each scan takes, scan after scan with the returned cursor, until none is new."""
    cursor, scans = None, []
    for _ in range(100):
        scan = scan_inbox(inbox, cursor, limit=limit)
        if not scan.paths:
            assert scan.more == 0
            return scans
        assert len(scan.paths) <= limit
        scans.append([p.name for p in scan.paths])
        cursor = scan.cursor
    raise AssertionError("the scans never ran dry")


def test_a_limited_scan_drains_a_backlog_once_each_in_arrival_order(tmp_path: Path) -> None:
    """With a limit, scans take the earliest arrivals and the cursor moves past exactly them:
    every file once, in arrival order, over ceil(n / limit) scans."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(23):
        (inbox / f"f{i:02d}.txt").write_text(f"file {i}", encoding="utf-8")
    first = scan_inbox(inbox, limit=5)
    assert first.more == 18
    scans = _drain(inbox, 5)
    assert [len(s) for s in scans] == [5, 5, 5, 5, 3]
    names = [n for s in scans for n in s]
    assert names == [p.name for p in scan_inbox(inbox).paths]
    assert len(set(names)) == 23


def test_a_limit_that_cuts_through_one_instant_loses_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many files arriving at one instant (one timestamp tick), cut by the limit: the cursor
    keeps the names taken at that instant, so the rest come next, none twice."""
    import ai_pipeline.inbox as inbox_module

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(12):
        (inbox / f"same{i:02d}.txt").write_text(f"file {i}", encoding="utf-8")
    monkeypatch.setattr(inbox_module, "_arrival_ns", lambda st: 1_000)
    scans = _drain(inbox, 5)
    assert [len(s) for s in scans] == [5, 5, 2]
    assert sorted(n for s in scans for n in s) == [f"same{i:02d}.txt" for i in range(12)]


def test_scan_of_missing_inbox_raises(tmp_path: Path) -> None:
    """Scanning a folder that does not exist raises FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError, match="nope"):
        scan_inbox(tmp_path / "nope")


@pytest.mark.parametrize(
    "cursor",
    [
        InboxCursor(),
        InboxCursor(arrived_ns=1_700_000_000_123_456_789, names=frozenset({"a.txt"})),
        InboxCursor(arrived_ns=42, names=frozenset({"b.md", "sub/c.html", "名字 with space.txt"})),
    ],
)
def test_cursor_serialize_parse_round_trip(cursor: InboxCursor) -> None:
    """A cursor parsed from its serialized form equals the original."""
    text = cursor.serialize()
    assert isinstance(text, str)
    assert InboxCursor.parse(text) == cursor


def test_cursor_parse_of_nothing_is_the_start() -> None:
    """An absent or empty cursor string parses to the start cursor."""
    assert InboxCursor.parse(None) == InboxCursor(arrived_ns=0, names=frozenset())
    assert InboxCursor.parse("") == InboxCursor()
    assert InboxCursor.parse(InboxCursor().serialize()) == InboxCursor()


def test_file_name_with_newline_is_not_found_twice(tmp_path: Path) -> None:
    """A file whose name contains a newline is found once, also through a serialized cursor."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "odd\nname.txt").write_text("odd", encoding="utf-8")
    first = scan_inbox(inbox)
    assert len(first.paths) == 1
    assert scan_inbox(inbox, InboxCursor.parse(first.cursor.serialize())).paths == []


def test_list_files_expands_folders_sorted_and_skips_hidden(tmp_path: Path) -> None:
    """list_files expands folders recursively, keeps explicit files, skips hidden ones, sorts."""
    inbox = _make_inbox(tmp_path)
    extra = tmp_path / "extra.txt"
    extra.write_text("extra", encoding="utf-8")
    files = list_files([extra, inbox]).files
    assert files == sorted([extra, inbox / "a.txt", inbox / "b.md", inbox / "sub" / "c.html"])
    assert list_files([str(inbox / "sub")]).files == [inbox / "sub" / "c.html"]
    assert list_files([]).files == []


def test_list_files_on_examples_finds_all_samples() -> None:
    """list_files of the two example folders returns their 21 files, bad ones first by name."""
    files = list_files([INBOX, BAD]).files
    assert len(files) == 21
    assert files == sorted(files)
    assert files[0].parent == BAD
