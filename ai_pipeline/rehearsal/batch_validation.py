"""What the simulator's Batch API refuses, as OpenAI does: :class:`APIError` (a refused request's
status and error body), a batch's metadata beyond its limits, and an input file whose lines
fail validation (bad JSON, a missing or repeated ``custom_id``, another endpoint or model). The
files and batches themselves are :mod:`.batch_api`'s."""

from __future__ import annotations

import json
from typing import Any

MAX_LINES = 50_000
MAX_METADATA_PAIRS = 16


class APIError(Exception):
    """A request the Batch API refuses: its HTTP status and OpenAI error fields."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


def check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise APIError(400, "metadata holds at most 16 string pairs", "metadata")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise APIError(
                400, "metadata keys are at most 64 characters, values 512 (strings)", "metadata"
            )


def read_lines(
    data: bytes, endpoint: str
) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """The requests of an input file, or the errors that fail it (as OpenAI's validation)."""
    requests: list[tuple[str, dict[str, Any]]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None

    def error(code: str, message: str, line: int | None, param: str | None = None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": line})

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        error("invalid_file_format", "The file is not UTF-8 text.", None)
        return [], errors
    lines = [(n, raw) for n, raw in enumerate(text.splitlines(), start=1) if raw.strip()]
    if not lines:
        error("empty_file", "The batch input file is empty.", None)
    if len(lines) > MAX_LINES:
        error("too_many_requests", f"A batch holds at most {MAX_LINES} requests.", None)
        return [], errors
    for number, raw in lines:
        try:
            request = json.loads(raw)
        except ValueError:
            error("invalid_json_line", "This line is not valid JSON.", number)
            continue
        if not isinstance(request, dict):
            error("invalid_request", "A line must be a JSON object.", number)
            continue
        custom_id, body = request.get("custom_id"), request.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            error("missing_required_parameter", "custom_id is required.", number, "custom_id")
        elif custom_id in seen:
            error(
                "duplicate_custom_id",
                f"custom_id {custom_id!r} is not unique.",
                number,
                "custom_id",
            )
        if request.get("method") != "POST":
            error("invalid_method", "method must be POST.", number, "method")
        if request.get("url") != endpoint:
            error("invalid_url", f"url must be the batch's endpoint {endpoint}.", number, "url")
        if not isinstance(body, dict):
            error("missing_required_parameter", "body must be an object.", number, "body")
            continue
        if isinstance(custom_id, str):
            seen.add(custom_id)
        if model is None:
            model = str(body.get("model"))
        elif str(body.get("model")) != model:
            error(
                "mismatched_model",
                "All requests of a batch must use the same model.",
                number,
                "body.model",
            )
        requests.append((str(custom_id), body))
    return requests, errors
