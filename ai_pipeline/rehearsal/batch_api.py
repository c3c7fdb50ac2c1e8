"""The simulator's Batch API: uploaded files and batches, with OpenAI's shapes and lifecycle.

What lives here: :class:`BatchAPI`, the files (``/v1/files``: upload, retrieve, list, content)
and batches (``/v1/batches``: create, retrieve, list, cancel) that the HTTP app of
:mod:`.simulator` serves. Each line of a batch is answered by the function the app hands in —
the synchronous endpoint's own answer to that body — so a fault rule that would fail a call fails
the line the same way (its status and error body in the error file).
What it refuses, and how an input file is validated, is :mod:`.batch_validation`'s.

The lifecycle is computed from the clock whenever a batch is looked at, never by a background
task: with ``seconds`` to complete (``SimulatorConfig.batch_seconds``) a batch is

==================  ==============================  ============================================
status              while                           then
==================  ==============================  ============================================
validating          the first 10 % of ``seconds``   ``failed`` (``errors``) when the file is bad
in_progress         until 90 %                      lines finish one by one: request_counts grow
finalizing          until 100 %                     ``completed``: output and error files made
expired             the window (``window_seconds``)  lines not done by then are error lines with
                    closed before every line was    code ``batch_expired``; done ones are kept
                    done, or a line had the
                    ``expire`` fault
cancelling          after ``cancel``, for           ``cancelled``: lines done when it was
                    ``cancel_seconds``              cancelled are kept, the rest are in no file
==================  ==============================  ============================================

Lines are answered when the batch is created, in an order shuffled by the batch id, and finish
in that order, evenly spread over the in_progress time: the output file is **not** in input
order, as OpenAI warns. A batch line counts in the simulator's stats under ``batch_lines_by_key``
(its ``custom_id``), never as a chat request.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ai_pipeline.rehearsal.batch_validation import APIError, check_metadata, read_lines

MAX_FILE_BYTES = 200 * 1024 * 1024
ENDPOINTS = ("/v1/chat/completions",)
COMPLETION_WINDOWS = ("24h",)
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class LineAnswer(Protocol):
    """An answered line: HTTP status (None: never answered, the window closed first), body."""

    @property
    def status(self) -> int | None: ...

    @property
    def body(self) -> dict[str, Any] | None: ...


AnswerLine = Callable[[str, bytes], Awaitable[LineAnswer]]


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def card(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass
class _Line:
    custom_id: str
    status: int | None  # None: never answered (the batch's window closed first)
    body: dict[str, Any] | None
    done_at: float  # when it finishes, on the simulator's clock (inf: never)


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: float
    seconds: float
    window_seconds: float | None
    model: str | None = None
    lines: list[_Line] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancelling_at: float | None = None
    cancel_seconds: float = 0.0
    # Set once, when the batch reaches its end: the status and the files made then.
    final_status: str | None = None
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


class BatchAPI:
    """Files and batches of one simulator; thread-safe (the app's loop, tests' threads)."""

    def __init__(
        self,
        *,
        seconds: float = 0.0,
        window_seconds: float | None = None,
        cancel_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.seconds = seconds
        self.window_seconds = window_seconds
        self.cancel_seconds = cancel_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[str, StoredFile] = {}
        self._batches: dict[str, _Batch] = {}

    def clear(self, *, seconds: float, window_seconds: float | None, cancel_seconds: float) -> None:
        """Forget every file and batch, and behave as configured (a simulator's reset)."""
        with self._lock:
            self._files.clear()
            self._batches.clear()
            self.seconds, self.window_seconds = seconds, window_seconds
            self.cancel_seconds = cancel_seconds

    # -- files -------------------------------------------------------------------------------

    def upload(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        if purpose != "batch":
            raise APIError(
                400, f"the simulator takes files for purpose 'batch', not {purpose!r}", "purpose"
            )
        if len(data) > MAX_FILE_BYTES:
            raise APIError(400, f"a batch file holds at most {MAX_FILE_BYTES} bytes", "file")
        stored = self._store_file(filename, purpose, data)
        return stored.card()

    def _store_file(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}", filename, purpose, data, int(self._clock())
        )
        with self._lock:
            self._files[stored.id] = stored
        return stored

    def file(self, file_id: str) -> StoredFile:
        with self._lock:
            found = self._files.get(file_id)
        if found is None:
            raise APIError(404, f"No such File object: {file_id}", "id", "file_not_found")
        return found

    def files(self, purpose: str | None = None) -> list[dict[str, Any]]:
        """Every file (of ``purpose``), newest first."""
        with self._lock:
            found = [f for f in self._files.values() if purpose is None or f.purpose == purpose]
        return [f.card() for f in reversed(found)]

    # -- batches -----------------------------------------------------------------------------

    async def create(
        self,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: Any,
        answer: AnswerLine,
    ) -> dict[str, Any]:
        """A new batch over an uploaded file; its lines are answered now, revealed over time."""
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"the simulator batches only {', '.join(ENDPOINTS)}", "endpoint")
        if completion_window not in COMPLETION_WINDOWS:
            raise APIError(400, "completion_window must be '24h'", "completion_window")
        check_metadata(metadata)
        source = self.file(input_file_id)
        if source.purpose != "batch":
            raise APIError(
                400, f"file {input_file_id} was not uploaded for purpose 'batch'", "input_file_id"
            )
        now = self._clock()
        batch = _Batch(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            input_file_id=input_file_id,
            endpoint=endpoint,
            completion_window=completion_window,
            metadata=dict(metadata) if metadata else None,
            created_at=now,
            seconds=self.seconds,
            window_seconds=self.window_seconds,
            cancel_seconds=self.cancel_seconds,
        )
        requests, batch.errors = read_lines(source.data, endpoint)
        if not batch.errors:
            models = {r[1].get("model") for r in requests}
            batch.model = next(iter(models)) if len(models) == 1 else None
            order = list(range(len(requests)))
            random.Random(batch.id).shuffle(order)
            start, span = now + 0.1 * batch.seconds, 0.8 * batch.seconds
            for position, index in enumerate(order):
                custom_id, body = requests[index]
                raw = json.dumps(body).encode("utf-8")
                reply = await answer(custom_id, raw)
                done_at = start + span * (position + 1) / len(order)
                if reply.status is None:
                    done_at = float("inf")
                batch.lines.append(_Line(custom_id, reply.status, reply.body, done_at))
        with self._lock:
            self._batches[batch.id] = batch
            return self._card(batch, now, just_created=True)

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            return self._card(self._batch(batch_id), self._clock())

    def page(self, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        """Batches newest first, ``limit`` from the one after ``after`` (the SDK's pages)."""
        if not 1 <= limit <= 100:
            raise APIError(400, "limit must be between 1 and 100", "limit")
        now = self._clock()
        with self._lock:
            ids = list(reversed(self._batches))
            start = ids.index(after) + 1 if after in ids else 0
            page = ids[start : start + limit]
            return {
                "object": "list",
                "data": [self._card(self._batches[i], now) for i in page],
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
                "has_more": start + limit < len(ids),
            }

    def cancel(self, batch_id: str) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            batch = self._batch(batch_id)
            status = self._status(batch, now)
            if status in ("failed", "completed", "expired", "cancelled"):
                raise APIError(
                    409, f"Cannot cancel a batch with status '{status}'.", None, "invalid_state"
                )
            if batch.cancelling_at is None:
                batch.cancelling_at = now
            return self._card(batch, now)

    def _batch(self, batch_id: str) -> _Batch:
        found = self._batches.get(batch_id)
        if found is None:
            raise APIError(404, f"No batch found with id '{batch_id}'.", "batch_id", "not_found")
        return found

    # -- the lifecycle -----------------------------------------------------------------------

    def _status(self, batch: _Batch, now: float) -> str:
        """The batch's status at ``now``; on reaching its end, its files are made (once)."""
        if batch.final_status is not None:
            return batch.final_status
        validated = batch.created_at + 0.1 * batch.seconds
        if batch.cancelling_at is not None and batch.cancelling_at < validated:
            # Cancelled while it was being validated: nothing was done.
            if now < batch.cancelling_at + batch.cancel_seconds:
                return "cancelling"
            return self._end(batch, "cancelled", batch.cancelling_at)
        if now < validated:
            return "validating"
        if batch.errors:
            return self._end(batch, "failed", validated)
        if batch.cancelling_at is not None:
            if now < batch.cancelling_at + batch.cancel_seconds:
                return "cancelling"
            return self._end(batch, "cancelled", batch.cancelling_at)
        deadline = (
            batch.created_at + batch.window_seconds
            if batch.window_seconds is not None
            else float("inf")
        )
        finished = batch.created_at + batch.seconds
        if any(line.done_at > deadline or line.status is None for line in batch.lines):
            expires = min(deadline, finished)
            if now >= expires:
                return self._end(batch, "expired", expires)
        if now >= finished:
            return self._end(batch, "completed", finished)
        if now >= batch.created_at + 0.9 * batch.seconds:
            return "finalizing"
        return "in_progress"

    def _end(self, batch: _Batch, status: str, at: float) -> str:
        """Make the batch's output and error files as they stand at ``at``; its end state."""
        if status != "failed":
            done = [line for line in batch.lines if line.done_at <= at and line.status is not None]
            output = [_result_line(line) for line in done if line.status == 200]
            errors = [_result_line(line) for line in done if line.status != 200]
            if status == "expired":
                errors += [_expired_line(line) for line in batch.lines if line not in done]
            if output:
                batch.output_file_id = self._output_file(batch, "output", output).id
            if errors:
                batch.error_file_id = self._output_file(batch, "error", errors).id
        batch.final_status, batch.ended_at = status, at
        return status

    def _output_file(self, batch: _Batch, kind: str, lines: list[dict[str, Any]]) -> StoredFile:
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            f"{batch.id}_{kind}.jsonl",
            "batch_output",
            data.encode("utf-8"),
            int(self._clock()),
        )
        self._files[stored.id] = stored  # the caller holds the lock
        return stored

    def _card(self, batch: _Batch, now: float, *, just_created: bool = False) -> dict[str, Any]:
        """The batch object at ``now``; as created, it is validating (what OpenAI answers)."""
        status = "validating" if just_created else self._status(batch, now)
        seen = batch.ended_at if batch.ended_at is not None else now
        if just_created:
            seen = float("-inf")
        if batch.cancelling_at is not None:
            seen = min(seen, batch.cancelling_at)
        done = [line for line in batch.lines if line.done_at <= seen and line.status is not None]
        completed = sum(1 for line in done if line.status == 200)
        failed = len(done) - completed
        if status == "expired":
            failed += len(batch.lines) - len(done)
        created = batch.created_at

        def stamp(at: float | None) -> int | None:
            return None if at is None else int(at)

        in_progress_at = created + 0.1 * batch.seconds
        finalizing_at = created + 0.9 * batch.seconds
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "model": batch.model,
            "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": int(created),
            "in_progress_at": stamp(in_progress_at)
            if status not in ("validating", "failed")
            else None,
            "expires_at": int(created + (batch.window_seconds or 24 * 3600)),
            "finalizing_at": stamp(finalizing_at)
            if status in ("finalizing", "completed")
            else None,
            "completed_at": stamp(batch.ended_at) if status == "completed" else None,
            "failed_at": stamp(batch.ended_at) if status == "failed" else None,
            "expired_at": stamp(batch.ended_at) if status == "expired" else None,
            "cancelling_at": stamp(batch.cancelling_at),
            "cancelled_at": stamp(batch.ended_at) if status == "cancelled" else None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": completed,
                "failed": failed,
            },
            "metadata": batch.metadata,
        }


def _result_line(line: _Line) -> dict[str, Any]:
    request_id = uuid.uuid4().hex
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": line.custom_id,
        "response": {"status_code": line.status, "request_id": request_id, "body": line.body},
        "error": None,
    }


def _expired_line(line: _Line) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": line.custom_id,
        "response": None,
        "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE},
    }
