"""Documents: loading files into normalised text, and the content-derived document id.

What lives here is plain Python that knows nothing of Dagster: readers for the supported formats,
the normalisation that makes the same content give the same id on every machine, and the inbox scan
that finds files which arrived since a cursor. Registering documents as partitions and storing them
happens in ``ai_pipeline.defs``; the store lives in ``ai_pipeline.store``.

Document id (DESIGN.md, decision 1): lower-case hex of sha256, cut to ``ID_HEX_LENGTH`` characters,
over the normalised text of a text format, or over the raw bytes of a PDF (whose text extraction
may change between pypdf releases while its bytes do not) and of a file that cannot be read at all.
Hex keys are safe everywhere Dagster uses a partition key (URLs, file paths, the UI's range syntax).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ID_HEX_LENGTH = 20
SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")
DEFAULT_MAX_DOCUMENT_BYTES = 5 * 1024 * 1024


class DocumentError(Exception):
    """A file that cannot become a document: the reason is meant for the person who sent it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class Document:
    """A file read into text, with the id derived from its content."""

    document_id: str
    source: str
    kind: str
    size_bytes: int
    text: str


@dataclass(frozen=True)
class RejectedFile:
    """A file that could not be read; its id comes from its raw bytes so it is stable too."""

    document_id: str
    source: str
    kind: str
    size_bytes: int
    reason: str


def content_id(data: bytes) -> str:
    """The document id for these bytes: the same bytes give the same id on every machine."""
    return hashlib.sha256(data).hexdigest()[:ID_HEX_LENGTH]


def normalise_text(text: str) -> str:
    """Normalise text so that incidental differences do not change a document's id.

    Unicode NFC, a dropped byte-order mark, ``\\n`` line ends, no trailing spaces on a line, no run
    of more than one blank line, no leading or trailing blank lines.
    """
    text = unicodedata.normalize("NFC", text.lstrip("\ufeff"))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(
            path, f"not valid UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})"
        ) from e


_HTML_HIDDEN = ("script", "style", "noscript", "template", "head", "title", "svg", "iframe")
_HTML_BLOCKS = (
    "p", "div", "br", "li", "tr", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "section",
    "article", "header", "footer", "nav", "aside", "main", "table", "ul", "ol", "blockquote",
    "pre", "figure", "figcaption", "hr", "dt", "dd",
)  # fmt: skip


def _html_text(data: bytes, path: Path) -> str:
    """The text a reader sees: no scripts, styles or title; a line per block, inline runs joined."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_decode(data, path), "html.parser")
    for tag in soup(list(_HTML_HIDDEN)):
        tag.decompose()
    for tag in soup(list(_HTML_BLOCKS)):
        tag.insert_before("\n")
        tag.insert_after("\n")
    return "\n".join(" ".join(line.split()) for line in soup.get_text().split("\n"))


def _pdf_text(data: bytes, path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(path, "the PDF is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as e:
        raise DocumentError(path, f"not a readable PDF ({type(e).__name__}: {e})") from e
    return "\n\n".join(pages)


def kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        return "other"
    return {".markdown": "md", ".htm": "html"}.get(suffix, suffix.lstrip("."))


def read_document(path: str | Path, *, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Document:
    """Read one file into a Document, or raise DocumentError naming the file and the reason."""
    path = Path(path)
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DocumentError(
            path,
            f"unsupported file type {path.suffix or '(none)'!r}; "
            f"supported: {', '.join(SUPPORTED_SUFFIXES)}",
        )
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DocumentError(path, f"too large: {size} bytes, the limit is {max_bytes}")
        data = path.read_bytes()
    except OSError as e:
        raise DocumentError(path, f"cannot be read ({e.strerror or e})") from e
    return parse_document(data, path)


def parse_document(data: bytes, path: str | Path) -> Document:
    """Turn a file's bytes into a Document; ``path`` names it and decides the format."""
    path = Path(path)
    kind = kind_of(path)
    if not data:
        raise DocumentError(path, "the file is empty")
    if kind == "pdf":
        text = normalise_text(_pdf_text(data, path))
        if not text:
            raise DocumentError(path, "the PDF has no extractable text (a scan without OCR?)")
        document_id = content_id(data)
    else:
        raw = _html_text(data, path) if kind == "html" else _decode(data, path)
        if "\x00" in raw:
            raise DocumentError(path, "the file contains NUL bytes; it is not text")
        text = normalise_text(raw)
        if not text:
            raise DocumentError(path, "the file has no text (only white space or markup)")
        document_id = content_id(text.encode("utf-8"))
    return Document(
        document_id=document_id, source=str(path), kind=kind, size_bytes=len(data), text=text
    )


def reject(path: str | Path, reason: str) -> RejectedFile:
    """Describe a file that could not be read; its id comes from whatever bytes it has.

    The bytes are hashed in chunks, so an oversize file is never held in memory.
    """
    path = Path(path)
    # Hashed with a prefix so that "unreadable" and a real document never share an id.
    digest = hashlib.sha256(b"rejected\x00")
    size = 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError:
        pass
    return RejectedFile(
        document_id=digest.hexdigest()[:ID_HEX_LENGTH],
        source=str(path),
        kind=kind_of(path),
        size_bytes=size,
        reason=reason,
    )


def load(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
) -> Document | RejectedFile:
    """Read a file; a file that cannot become a document comes back as a RejectedFile."""
    try:
        return read_document(path, max_bytes=max_bytes)
    except DocumentError as e:
        return reject(path, e.reason)


# --- the inbox -----------------------------------------------------------------------------------


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
    import time

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
