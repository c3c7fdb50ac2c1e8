"""A hostile inbox: good documents among more than thirty kinds of bad or odd entries.

``build`` writes it and returns, for every entry, what the pipeline must do with it: complete it,
reject it as INPUT_QUALITY_ISSUE with a reason, skip it with a reason, or leave it for the next
run. Secrets live outside the inbox, reachable only through symlinks, so a test can prove that
nothing outside the inbox is ever read.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ai_pipeline_tests.support import EXAMPLES, sample_text

SECRET = "TOP-SECRET payroll of Helios Maritime, never to be analysed"
MAX_BYTES = 100_000


@dataclass
class Expect:
    """What must happen to one entry: ``complete``, ``reject`` (INPUT_QUALITY_ISSUE) with a
    reason containing ``reason``, ``skip`` with such a reason, or ``settle`` (left for later)."""

    outcome: str
    reason: str = ""


@dataclass
class Corpus:
    inbox: Path
    outside: Path
    entries: dict[str, Expect] = field(default_factory=dict)
    sockets: list[socket.socket] = field(default_factory=list)

    def of(self, outcome: str) -> dict[str, Expect]:
        return {k: v for k, v in self.entries.items() if v.outcome == outcome}

    def write_fresh(self) -> None:
        """A file written just now: within the settle time it is left for the next run."""
        self.entries["being-written.txt"] = Expect("settle")
        _write(self.inbox / "being-written.txt", sample_text(5))

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def build(root: Path) -> Corpus:
    """Write the corpus under ``root`` (the inbox is ``root/inbox``); ``Corpus.write_fresh`` adds
    the file still being written, after the settle time has passed for the others."""
    inbox, outside = root / "inbox", root / "outside"
    outside.mkdir(parents=True)
    _write(outside / "payroll.txt", SECRET)
    _write(outside / "folder" / "payroll-copy.txt", SECRET + " (a copy)")
    c = Corpus(inbox, outside)
    e = c.entries

    def add(name: str, data: bytes | str, expect: Expect) -> Path:
        e[name] = expect
        return _write(inbox / name, data)

    # Good documents, some with odd but valid names and shapes.
    add("good-1.txt", sample_text(7001), Expect("complete"))
    add("good-2.md", sample_text(7002), Expect("complete"))
    add("REPORT-UPPER.TXT", sample_text(7003), Expect("complete"))
    add("-rf.txt", sample_text(7004), Expect("complete"))
    add("two\nlines.txt", sample_text(7005), Expect("complete"))
    add("报告-第三季度.md", sample_text(7006), Expect("complete"))
    add("n" * 200 + ".txt", sample_text(7007), Expect("complete"))
    add("crlf-bom.txt", "\ufeff" + sample_text(7008).replace(". ", ".\r\n"), Expect("complete"))
    add("a/b/c/d/e/f/deep.txt", sample_text(7009), Expect("complete"))
    add("looks-like-a-file.txt/inside.txt", sample_text(7010), Expect("complete"))
    # Contents that are not a document.
    add("empty.txt", b"", Expect("reject", "the file is empty"))
    add("empty.pdf", b"", Expect("reject", "the file is empty"))
    add("spaces.txt", " \n\t \n", Expect("reject", "no text"))
    add("controls.txt", "\x01\x02\x07\x1b\x7f\x0b\x08", Expect("reject", "no readable text"))
    add("invisible.txt", "\u200b\u200c\u2060\u200d", Expect("reject", "no readable text"))
    add("nul.txt", b"abc\x00def", Expect("reject", "NUL bytes"))
    add(
        "latin1.txt",
        "Caf\xe9 in S\xe3o Paulo".encode("latin-1"),
        Expect("reject", "not valid UTF-8"),
    )
    add("utf16.txt", sample_text(1).encode("utf-16"), Expect("reject", "not valid UTF-8"))
    add("binary.md", bytes(range(256)) * 4, Expect("reject", "not valid UTF-8"))
    add("sheet.xlsx", b"PK\x03\x04 not a workbook", Expect("reject", "unsupported file type"))
    add("no-extension", sample_text(2), Expect("reject", "unsupported file type '(none)'"))
    add("program.exe", b"MZ\x90\x00", Expect("reject", "unsupported file type '.exe'"))
    add("corrupt.pdf", b"%PDF-1.4 garbage", Expect("reject", "not a readable PDF"))
    add(
        "scanned.pdf",
        (EXAMPLES / "bad" / "scanned-no-text.pdf").read_bytes(),
        Expect("reject", "no extractable text"),
    )
    add(
        "markup-only.html",
        "<html><head><title>T</title></head><body><script>var x=1;</script></body></html>",
        Expect("reject", "no text"),
    )
    add("too-big.txt", "word " * (MAX_BYTES // 4), Expect("reject", "too large"))
    # Names and entries that are not files of the inbox.
    name = os.fsdecode(b"caf\xe9-latin1-name.txt")
    e["caf\\xe9-latin1-name.txt"] = Expect("reject", "file name is not valid UTF-8")
    _write(inbox / name, sample_text(3))
    e[".hidden.txt"] = Expect("skip", "hidden")
    _write(inbox / ".hidden.txt", SECRET)
    e[".git"] = Expect("skip", "hidden")
    _write(inbox / ".git" / "config", SECRET)
    links = {
        "link-loop-a": ("link-loop-b", "symlink loop"),
        "link-loop-b": ("link-loop-a", "symlink loop"),
        "link-dangling.txt": ("does-not-exist.txt", "dangling symlink"),
        "link-outside-file.txt": (str(outside / "payroll.txt"), "outside the inbox"),
        "link-outside-folder": (str(outside / "folder"), "outside the inbox"),
        "link-inside-folder": ("a/b", "a symlink to a folder"),
        "link-to-etc-passwd.txt": ("/etc/passwd", "outside the inbox"),
    }
    for link, (target, reason) in links.items():
        e[link] = Expect("skip", reason)
        os.symlink(target, inbox / link)
    e["link-inside-file.txt"] = Expect("complete")  # an alias of good-1.txt
    os.symlink("good-1.txt", inbox / "link-inside-file.txt")
    e["pipe.txt"] = Expect("skip", "named pipe")
    os.mkfifo(inbox / "pipe.txt")
    e["socket.txt"] = Expect("skip", "socket")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(inbox / "socket.txt"))
    c.sockets.append(sock)
    if os.geteuid() == 0:
        e["device.txt"] = Expect("skip", "character device")
        os.mknod(inbox / "device.txt", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        e["unreadable.txt"] = Expect("reject", "cannot be read")
        os.chmod(_write(inbox / "unreadable.txt", sample_text(4)), 0)
    return c
