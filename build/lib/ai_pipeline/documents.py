"""Documents: loading files into normalised text, and the content-derived document id.

What lives here is plain Python that knows nothing of Dagster: readers for the supported formats,
and the normalisation that makes the same content give the same id on every machine. Finding the
files of an inbox is ``ai_pipeline.inbox``; registering documents is ``ai_pipeline.intake``.

Document id: lower-case hex of sha256, cut to ``ID_HEX_LENGTH`` characters,
over the normalised text of a text format, or over the raw bytes of a PDF (whose text extraction
may change between pypdf releases while its bytes do not) and of a file that cannot be read at all.
Hex keys are safe everywhere Dagster uses a partition key (URLs, file paths, the UI's range syntax).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ID_HEX_LENGTH = 20
SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")
DEFAULT_MAX_DOCUMENT_BYTES = 5 * 1024 * 1024


class DocumentError(Exception):
    """A file that cannot become a document: the reason is meant for the person who sent it."""

    def __init__(self, path: str | Path, reason: str):
        shown = display_path(path)
        super().__init__(f"{shown}: {reason}")
        self.path = shown
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
    """The page's main text: what a reader came for, without navigation bars, footers, cookie
    banners or share buttons (trafilatura), headed by its title when the page shows one. A page
    with no main text to find (a fragment, a list) keeps all its visible text. Scripts, styles,
    templates and the <head> never count."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_decode(data, path), "html.parser")
    for tag in soup(list(_HTML_HIDDEN)):
        tag.decompose()
    main = _main_text(str(soup))
    heading = soup.find("h1")
    title = " ".join(heading.get_text().split()) if heading else ""
    for tag in soup(list(_HTML_BLOCKS)):
        tag.insert_before("\n")
        tag.insert_after("\n")
    visible = "\n".join(" ".join(line.split()) for line in soup.get_text().split("\n"))
    if main is None:
        return visible
    if title and not main.startswith(title):
        main = f"{title}\n\n{main}"
    return main


def _main_text(html: str) -> str | None:
    """trafilatura's main text, one paragraph a block. Without its metadata pass: that one looks
    for the page's date with every locale of dateparser, two seconds a page, for nothing we use."""
    import trafilatura

    found = trafilatura.bare_extraction(
        html, include_comments=False, include_tables=True, with_metadata=False
    )
    text = getattr(found, "text", None)
    if not text or not text.strip():
        return None
    # One block a line there: paragraphs apart, as in every other format (sections cut at them).
    return "\n\n".join(line.strip() for line in text.split("\n") if line.strip())


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


def display_path(path: str | Path) -> str:
    """A path as text that is always valid UTF-8: undecodable bytes of a name become ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _open_regular(path: Path) -> int:
    """A file descriptor of ``path``, which must be a regular file. Opened without blocking, so a
    named pipe put where a file was never hangs the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DocumentError(display_path(path), "not a regular file")
    return fd


def read_document(path: str | Path, *, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Document:
    """Read one file into a Document, or raise DocumentError naming the file and the reason."""
    path = Path(path)
    shown = display_path(path)
    if shown != str(path):
        raise DocumentError(shown, "the file name is not valid UTF-8; rename the file")
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DocumentError(
            path,
            f"unsupported file type {path.suffix or '(none)'!r}; "
            f"supported: {', '.join(SUPPORTED_SUFFIXES)}",
        )
    try:
        fd = _open_regular(path)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise DocumentError(path, f"too large: {size} bytes, the limit is {max_bytes}")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise DocumentError(path, f"cannot be read ({e.strerror or e})") from e
    if len(data) > max_bytes:  # it grew while it was read
        raise DocumentError(path, f"too large: over {max_bytes} bytes, the limit")
    return parse_document(data, path)


def _visible(text: str) -> bool:
    """Whether the text has a character a reader can see (not a control, format or space)."""
    return any(unicodedata.category(ch)[0] not in "CZ" for ch in text)


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
        if not _visible(text):
            raise DocumentError(
                path, "the file has no readable text (only control or invisible characters)"
            )
        document_id = content_id(text.encode("utf-8"))
    return Document(
        document_id=document_id,
        source=display_path(path),
        kind=kind,
        size_bytes=len(data),
        text=text,
    )


def reject(path: str | Path, reason: str) -> RejectedFile:
    """Describe a file that could not be read; its id comes from its name and whatever bytes it has.

    The name is part of the id, so two bad files (two empty ones, say) never become one document
    whose error names the other; the same bad file seen again is the same document. A prefix keeps
    "unreadable" apart from every real document. The bytes are hashed in chunks, so an oversize
    file is never held in memory, and only a regular file is opened at all.
    """
    path = Path(path)
    source = display_path(path)
    digest = hashlib.sha256(b"rejected\x00" + source.encode("utf-8") + b"\x00")
    size = 0
    try:
        with os.fdopen(_open_regular(path), "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except (OSError, DocumentError):
        pass
    return RejectedFile(
        document_id=digest.hexdigest()[:ID_HEX_LENGTH],
        source=source,
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
