"""What the service takes from a request, checked before anything is read whole or stored.

- Ids in paths have a fixed alphabet (``TASK_ID_PATTERN``, ``DOCUMENT_ID_PATTERN``): anything else
  is refused before the database sees it.
- Text that a database cannot store — a NUL character (PostgreSQL refuses it in any text column)
  or a lone surrogate (not encodable as UTF-8) — is refused with the place it was found.
- One set of rules for a document's name, whether it came as a JSON ``name`` or as a multipart
  file name: its last path component (``/`` or ``\\``), at most ``MAX_NAME_CHARS`` characters, no
  control character, a supported suffix.
- A request body is refused by its ``Content-Length`` when that says it is too large, and is read
  in the chunks the server hands over, counted as they come, never past the limit.
- A submitted document (``upload``) is a multipart ``file`` or JSON text (``TextSubmission``); its
  name and bytes come out, and the analysis it names (a JSON ``analysis``, a multipart
  ``analysis`` field), or the 4xx that says what is wrong.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException, Request
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile

from ai_pipeline.documents import SUPPORTED_SUFFIXES, kind_of

# A task id is a document id (hex) and its step, prompt version and model tag; a document id is
# lower-case hex. Both are generous on length and strict on the alphabet.
TASK_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,160}$"
DOCUMENT_ID_PATTERN = r"^[0-9a-z_-]{1,64}$"
MAX_NAME_CHARS = 255
# An analysis's name: lower-case letters, digits and _ (a declaration's); longer is no name.
MAX_ANALYSIS_CHARS = 100
# What a body may hold besides the document: multipart boundaries and part headers, JSON keys.
ENVELOPE_BYTES = 64 * 1024
# JSON text may escape each character of the document (``\uXXXX`` for three UTF-8 bytes).
JSON_EXPANSION = 2
# The two ways a document comes: a file, or JSON text.
MULTIPART = "multipart/form-data"
JSON = "application/json"


def unstorable(text: str) -> str | None:
    """Why a database cannot store this text, or None when it can."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not Unicode text)"
    return None


def storable(text: str, what: str, status: int = 422) -> str:
    """The text itself, or an HTTP error naming ``what`` when a database cannot store it."""
    reason = unstorable(text)
    if reason:
        raise HTTPException(status, f"{what} {reason}")
    return text


def document_name(raw: str) -> str:
    """The document's name as recorded, from a JSON ``name`` or a multipart file name alike."""
    storable(raw, "the file name")
    name = raw.replace("\\", "/").rsplit("/", 1)[-1].strip()
    shown = name[:60] + ("…" if len(name) > 60 else "")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise HTTPException(422, "the file name contains a control character")
    if not name:
        raise HTTPException(422, "the file name is empty")
    if len(name) > MAX_NAME_CHARS:
        raise HTTPException(422, f"{shown}: the file name is over {MAX_NAME_CHARS} characters")
    if kind_of(Path(name)) == "other":
        raise HTTPException(
            422, f"{shown}: unsupported type (supported: {', '.join(SUPPORTED_SUFFIXES)})"
        )
    return name


def body_limit(kind: str, max_document_bytes: int) -> int:
    """The largest request body that can hold a document within the limit."""
    expansion = JSON_EXPANSION if kind == "application/json" else 1
    return max_document_bytes * expansion + ENVELOPE_BYTES


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request's body, or 413 as soon as it is known to be over ``limit`` bytes: from its
    ``Content-Length`` before reading anything, else while its chunks arrive."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isascii() or not declared.isdigit():
            raise HTTPException(400, "Content-Length is not a number of bytes")
        if int(declared) > limit:
            raise HTTPException(413, f"the request body is over the size limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"the request body is over the size limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def replayed(request: Request, body: bytes) -> Request:
    """A request like this one whose body is ``body`` (already read within its limit), for a
    parser that reads the body itself (the multipart form parser)."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


class TextSubmission(BaseModel):
    text: str = Field(min_length=1, description="the document's text")
    name: str = Field(
        "text.txt",
        min_length=5,
        max_length=255,
        pattern=r"(?i)\.(txt|md|markdown|html?|pdf)$",
        description="its file name, whose suffix says its format (a path is cut to its last "
        "part; no control characters)",
    )
    analysis: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_ANALYSIS_CHARS,
        description="the analysis to run on it, by name (GET /api/v1/analyses lists them); "
        "default: the service's default analysis",
    )


@dataclass(frozen=True)
class Upload:
    """A submitted document as the request carried it."""

    name: str
    data: bytes
    # The analysis the submission names; None: the service's default.
    analysis: str | None


async def upload(request: Request, max_bytes: int) -> Upload:
    """The submitted document's name and bytes and the analysis it names, or the 4xx that says
    what is wrong; the body is read only as far as its limit."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in (MULTIPART, JSON):
        raise HTTPException(
            415, 'send the document as multipart/form-data (`file`) or JSON {"text": …}'
        )
    body = await bounded_body(request, body_limit(kind, max_bytes))
    if kind == MULTIPART:
        async with replayed(request, body).form(max_files=1, max_fields=10) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise HTTPException(422, "the multipart body needs a `file` part")
            name = document_name(upload.filename or "upload.txt")
            data = await upload.read(max_bytes + 1)
            analysis = _analysis_field(form.get("analysis"))
    else:
        try:
            submission = TextSubmission.model_validate_json(body)
        except ValidationError as e:
            raise HTTPException(422, f"the JSON body needs `text` (and may name it): {e}") from e
        name = document_name(submission.name)
        data = storable(submission.text, "the text").encode("utf-8")
        analysis = submission.analysis
    if len(data) > max_bytes:
        raise HTTPException(413, f"{name}: over the size limit of {max_bytes} bytes")
    if analysis is not None:
        storable(analysis, "the analysis")
    return Upload(name, data, analysis)


def _analysis_field(value: UploadFile | str | None) -> str | None:
    """A multipart ``analysis`` field: text of at most ``MAX_ANALYSIS_CHARS`` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ANALYSIS_CHARS:
        raise HTTPException(
            422, f"the `analysis` field is an analysis's name (1 to {MAX_ANALYSIS_CHARS} chars)"
        )
    return value
