"""The simulator's Batch API: files and batches with OpenAI's shapes, driven by the openai SDK over
real HTTP, and the batch lifecycle on a clock the test moves."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.rehearsal.batch_api import BatchAPI
from ai_pipeline.rehearsal.control import SimulatorControl
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer

TEXTS = [
    f"Report {i}: the Rotterdam depot of Acme Logistics shipped {i * 7} crates on time."
    for i in range(20)
]


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(hang_seconds=1)) as running:
        yield running


@pytest.fixture(autouse=True)
def clean(server: SimulatorServer) -> None:
    server.set_faults([])
    server.set_api_keys(None)
    server.reset()


def client_for(server: SimulatorServer, api_key: str = "k") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=10)


def body(text: str, model: str = "sim-analyst-1") -> dict[str, Any]:
    return {
        "model": model,
        "messages": DOCUMENT_ANALYSIS.messages(text),
        "response_format": {"type": "json_object"},
    }


def jsonl(lines: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(
        json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b})
        + "\n"
        for c, b in lines
    ).encode("utf-8")


def submit(client: openai.OpenAI, lines: list[tuple[str, dict[str, Any]]], **metadata: str) -> Any:
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=metadata or None,
    )


def results(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_file_is_uploaded_retrieved_listed_and_read_back(server: SimulatorServer) -> None:
    """An uploaded batch file comes back byte for byte, with its card, and in the list by purpose."""
    client = client_for(server)
    data = jsonl([("t1", body(TEXTS[0]))])
    uploaded = client.files.create(file=("abc.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(data)
    assert uploaded.filename == "abc.jsonl" and uploaded.id.startswith("file-")
    assert client.files.retrieve(uploaded.id).filename == "abc.jsonl"
    assert client.files.content(uploaded.id).read() == data
    assert [f.id for f in client.files.list(purpose="batch")] == [uploaded.id]
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-missing")
    assert server.calls_to("files.create") == 1 and server.calls_to("files.content") == 1


def test_each_line_is_answered_as_the_synchronous_endpoint_answers_it(
    server: SimulatorServer,
) -> None:
    """Every line's body gets the reply a chat completion of the same body gets; the output is
    not in input order; the counts, metadata and stats say what happened."""
    client = client_for(server)
    lines = [(f"task-{i}", body(text)) for i, text in enumerate(TEXTS)]
    created = submit(client, lines, intent="i-1")
    assert created.status == "validating" and created.metadata == {"intent": "i-1"}

    done = client.batches.retrieve(created.id)
    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (20, 20)
    out = results(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in out) == sorted(c for c, _ in lines)
    assert [r["custom_id"] for r in out] != [c for c, _ in lines]
    sync = client.chat.completions.create(**body(TEXTS[3]))  # type: ignore[call-overload]
    line = next(r for r in out if r["custom_id"] == "task-3")
    assert line["response"]["status_code"] == 200 and line["error"] is None
    answer = line["response"]["body"]
    assert answer["choices"][0]["message"]["content"] == sync.choices[0].message.content
    assert answer["usage"]["prompt_tokens"] == sync.usage.prompt_tokens  # type: ignore[union-attr]

    stats = server.stats()
    assert stats["total"] == 1, "batch lines are not synchronous calls"
    assert stats["batch_lines"] == 20 and stats["batch_lines_by_key"]["task-3"] == 1
    assert stats["by_endpoint"]["batches.create"] == 1
    assert stats["by_endpoint"]["batches.retrieve"] == 1
    assert stats["by_endpoint"]["chat.completions"] == 1


def test_fault_rules_hit_lines_as_they_hit_calls(server: SimulatorServer) -> None:
    """A status fault makes an error-file line with its status and body, a reset a 500, a
    content fault spoils the line's answer; the rest complete."""
    client = client_for(server)
    server.set_faults(
        [
            {"kind": "status", "status": 429, "match": "task-1"},
            {"kind": "reset", "match": "Report 2:"},
            {"kind": "status", "status": 400, "match": "task-4"},
            {"kind": "low_confidence", "match": "task-5"},
        ]
    )
    batch = submit(client, [(f"task-{i}", body(TEXTS[i])) for i in range(6)])
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 3)
    errors = {r["custom_id"]: r for r in results(client, done.error_file_id)}
    assert {c: r["response"]["status_code"] for c, r in errors.items()} == {
        "task-1": 429,
        "task-2": 500,
        "task-4": 400,
    }
    assert errors["task-1"]["response"]["body"]["error"]["code"] == "rate_limit_exceeded"
    out = {r["custom_id"]: r for r in results(client, done.output_file_id)}
    content = out["task-5"]["response"]["body"]["choices"][0]["message"]["content"]
    assert json.loads(content)["confidence"] == 0.42
    assert server.stats()["batch_lines_by_status"] == {"200": 3, "429": 1, "400": 1, "reset": 1}


def test_an_expire_fault_expires_the_batch_with_its_line_batch_expired(
    server: SimulatorServer,
) -> None:
    """A line with the expire fault is never done: the batch ends expired, that line is in the
    error file with code batch_expired and no response, the others are kept."""
    client = client_for(server)
    server.set_faults([{"kind": "expire", "match": "task-0"}])
    batch = submit(client, [(f"task-{i}", body(TEXTS[i])) for i in range(3)])
    done = client.batches.retrieve(batch.id)
    assert done.status == "expired" and done.expired_at is not None
    (expired,) = results(client, done.error_file_id)
    assert expired["custom_id"] == "task-0" and expired["response"] is None
    assert expired["error"]["code"] == "batch_expired"
    assert len(results(client, done.output_file_id)) == 2


def test_a_bad_input_file_fails_the_batch_with_its_errors(server: SimulatorServer) -> None:
    """Duplicate custom ids and a second model fail the batch at validation, naming the lines."""
    client = client_for(server)
    batch = submit(
        client,
        [("a", body(TEXTS[0])), ("a", body(TEXTS[1])), ("b", body(TEXTS[2], model="other"))],
    )
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.output_file_id is None
    assert failed.errors is not None and failed.errors.data is not None
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("duplicate_custom_id", 2),
        ("mismatched_model", 3),
    ]
    assert server.stats()["batch_lines"] == 0


def test_batches_are_listed_newest_first_across_pages_and_cancelled(
    server: SimulatorServer,
) -> None:
    """The SDK's pages walk every batch, newest first; a finished batch cannot be cancelled."""
    client = client_for(server)
    ids = [submit(client, [("x", body(TEXTS[i]))], n=str(i)).id for i in range(5)]
    listed = [b.id for b in client.batches.list(limit=2)]
    assert listed == list(reversed(ids))
    assert server.calls_to("batches.list") == 3
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(ids[0])
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=client.files.list().data[-1].id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{i}": "v" for i in range(17)},
        )


def test_a_wrong_key_is_refused_by_the_batch_endpoints(server: SimulatorServer) -> None:
    """With keys enforced, the files and batches endpoints answer 401 as chat does."""
    server.set_api_keys(["good"])
    with pytest.raises(openai.AuthenticationError):
        client_for(server, "bad").batches.list()
    with pytest.raises(openai.AuthenticationError):
        client_for(server, "bad").files.create(file=("x.jsonl", b"{}"), purpose="batch")
    assert list(client_for(server, "good").batches.list()) == []


# -- the lifecycle on a clock the test moves -------------------------------------------------


@dataclass
class _Answer:
    status: int | None
    body: dict[str, Any] | None


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def lifecycle(seconds: float, window: float | None = None) -> tuple[BatchAPI, Clock, str]:
    clock = Clock()
    api = BatchAPI(seconds=seconds, window_seconds=window, cancel_seconds=5, clock=clock)
    data = jsonl([(f"t{i}", body(f"text {i}")) for i in range(10)])
    file_id = api.upload("in.jsonl", "batch", data)["id"]

    async def answer(custom_id: str, raw: bytes) -> _Answer:
        return _Answer(200, {"custom_id": custom_id})

    created = asyncio.run(api.create(file_id, "/v1/chat/completions", "24h", None, answer))
    return api, clock, created["id"]


def test_a_batch_goes_through_its_statuses_as_time_passes() -> None:
    """validating → in_progress (counts growing) → finalizing → completed, at 10/90/100 %."""
    api, clock, batch_id = lifecycle(seconds=100)
    seen = []
    for at in (5, 30, 60, 95, 100):
        clock.now = 1_000_000.0 + at
        card = api.retrieve(batch_id)
        seen.append((card["status"], card["request_counts"]["completed"]))
    assert seen == [
        ("validating", 0),
        ("in_progress", 2),
        ("in_progress", 6),
        ("finalizing", 10),
        ("completed", 10),
    ]
    assert card["completed_at"] == 1_000_100 and card["output_file_id"] is not None


def test_a_window_shorter_than_the_work_expires_the_unfinished_lines() -> None:
    """A window at half the time: the lines done by then are kept, the rest batch_expired."""
    api, clock, batch_id = lifecycle(seconds=100, window=50)
    clock.now += 49
    assert api.retrieve(batch_id)["status"] == "in_progress"
    clock.now += 1
    card = api.retrieve(batch_id)
    assert card["status"] == "expired"
    assert card["request_counts"] == {"total": 10, "completed": 5, "failed": 5}
    errors = api.file(card["error_file_id"]).data.decode().splitlines()
    assert [json.loads(e)["error"]["code"] for e in errors] == ["batch_expired"] * 5
    assert len(api.file(card["output_file_id"]).data.decode().splitlines()) == 5


def test_a_cancelled_batch_keeps_what_was_done_before_the_cancel() -> None:
    """cancel → cancelling for cancel_seconds → cancelled, with the lines done before it."""
    api, clock, batch_id = lifecycle(seconds=100)
    clock.now += 50
    assert api.cancel(batch_id)["status"] == "cancelling"
    clock.now += 4
    assert api.retrieve(batch_id)["status"] == "cancelling"
    clock.now += 1
    card = api.retrieve(batch_id)
    assert card["status"] == "cancelled" and card["cancelled_at"] is not None
    assert card["request_counts"]["completed"] == 5
    assert len(api.file(card["output_file_id"]).data.decode().splitlines()) == 5
    assert card["error_file_id"] is None


def test_a_batch_cancelled_while_validating_does_nothing() -> None:
    """A cancel during validation ends the batch cancelled with no line done."""
    api, clock, batch_id = lifecycle(seconds=100)
    clock.now += 5
    assert api.cancel(batch_id)["status"] == "cancelling"
    clock.now += 5
    card = api.retrieve(batch_id)
    assert card["status"] == "cancelled" and card["request_counts"]["completed"] == 0
    assert card["output_file_id"] is None and card["error_file_id"] is None


def test_the_batch_timing_is_set_over_the_control_api(server: SimulatorServer) -> None:
    """SimulatorControl sets how long batches take; a bad value is refused and changes nothing;
    a reset brings back the configured timing."""
    control = SimulatorControl(server.base_url)
    control.set_batch_timing(seconds=100, window_seconds=50)
    client = client_for(server)
    batch = submit(client, [("t", body(TEXTS[0]))])
    assert client.batches.retrieve(batch.id).status == "validating"
    with pytest.raises(ValueError, match="cancel_seconds"):
        control._call("POST", "batch-timing", {"seconds": 1, "cancel_seconds": -1})
    assert control._call("GET", "batch-timing") == {
        "seconds": 100,
        "window_seconds": 50,
        "cancel_seconds": 0.0,
    }
    assert control.calls_to("batches.retrieve") == 1
    control.reset()
    assert control._call("GET", "batch-timing")["seconds"] == 0.0
    assert client.batches.list().data == []
