"""The request lines of a Batch API job: each document's analysis request as its synchronous
call would send it, and the files they are cut into (within 50,000 lines and 200 MB), named by
their hash. Recording, sending and reading jobs is elsewhere in ``ai_pipeline.openai_batch``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ai_pipeline.declaration import DEFAULT_SECTION_CHARS
from ai_pipeline.llm import chat_request
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import PlannedTask
from ai_pipeline.tasks import ANALYSE_STEP, task_id

ENDPOINT = "/v1/chat/completions"
MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
NO_SUCH_DOCUMENT = "no such document"


@dataclass(frozen=True)
class BatchRequest:
    """One line of a request file: a task and the body the synchronous call would send."""

    task: PlannedTask
    body: dict[str, Any]

    def line(self) -> bytes:
        """The JSONL line (``custom_id`` = the task id), the same bytes every time. Keys keep
        the body's order: a response format's schema properties are the order of the answer."""
        request = {
            "custom_id": self.task.task_id,
            "method": "POST",
            "url": ENDPOINT,
            "body": self.body,
        }
        return (json.dumps(request, ensure_ascii=False) + "\n").encode("utf-8")


def requests_for(
    store: Store,
    document_ids: Iterable[str],
    model: str,
    *,
    section_chars: int = DEFAULT_SECTION_CHARS,
    completion_cap: int | None = None,
) -> tuple[list[BatchRequest], dict[str, str]]:
    """The analysis request of each document, as its synchronous call would send it (under a
    budget its completion limit is at most ``completion_cap``, as a call's under a budget is),
    and the documents that cannot go in a batch (with why: rejected, no text, or long enough to
    be cut into sections — those go the synchronous way, which analyses the sections and
    reduces)."""
    analysis = store.analysis
    requests: list[BatchRequest] = []
    skipped: dict[str, str] = {}
    for document_id in dict.fromkeys(document_ids):
        doc = store.documents.load(document_id)
        if doc is None:
            skipped[document_id] = NO_SUCH_DOCUMENT
            continue
        if doc.rejected_reason or doc.text is None:
            skipped[document_id] = doc.rejected_reason or "no text"
            continue
        if len(analysis.cut(doc.text, section_chars)) != 1:
            skipped[document_id] = "cut into sections: analysed by the synchronous path"
            continue
        body = chat_request(
            model,
            analysis.messages(doc.text),
            analysis.response_format(),
            analysis.model,
            reserved_completion_tokens=completion_cap,
        )
        task = PlannedTask(
            task_id(document_id, ANALYSE_STEP, analysis.tag(), model), document_id, ANALYSE_STEP
        )
        requests.append(BatchRequest(task, body))
    return requests, skipped


def split(
    requests: Sequence[BatchRequest], *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES
) -> list[list[BatchRequest]]:
    """Consecutive runs of requests, each a file within ``max_lines`` and ``max_bytes``; raises
    ValueError for a single line larger than a file may be."""
    files: list[list[BatchRequest]] = []
    current: list[BatchRequest] = []
    size = 0
    for request in requests:
        length = len(request.line())
        if length > max_bytes:
            raise ValueError(f"{request.task.task_id}: one line of {length} bytes > {max_bytes}")
        if current and (len(current) >= max_lines or size + length > max_bytes):
            files.append(current)
            current, size = [], 0
        current.append(request)
        size += length
    if current:
        files.append(current)
    return files


def file_of(requests: Sequence[BatchRequest]) -> bytes:
    return b"".join(request.line() for request in requests)


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_name(digest: str) -> str:
    """The name a request file is uploaded under: its hash, by which it is found again."""
    return f"ai_pipeline-{digest}.jsonl"
