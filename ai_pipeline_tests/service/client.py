"""The submission API as a client calls it: submit, read a task, read its event stream."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ai_pipeline_tests.service.conftest import auth

# How long an event stream may take to end: the task's whole analysis.
STREAM_SECONDS = 120


def submit(
    url: str,
    tenant: str,
    text: str,
    name: str = "doc.txt",
    *,
    analysis: str | None = None,
    **headers: str,
) -> httpx.Response:
    """Submit ``text`` as the tenant's document, to ``analysis`` (None: the service's default)."""
    named = {"analysis": analysis} if analysis is not None else {}
    return httpx.post(
        f"{url}/api/v1/tasks",
        json={"text": text, "name": name, **named},
        headers=auth(tenant) | headers,
        timeout=30,
    )


def task_state(url: str, tenant: str, task: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/api/v1/tasks/{task}", headers=auth(tenant), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def sse_events(
    url: str, tenant: str, task: str, last_event_id: str | None = None
) -> list[dict[str, Any]]:
    """Every event of the stream until the server ends it: id, event, data (parsed JSON)."""
    headers = auth(tenant) | ({"Last-Event-ID": last_event_id} if last_event_id else {})
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with httpx.stream(
        "GET", f"{url}/api/v1/tasks/{task}/events", headers=headers, timeout=STREAM_SECONDS
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
            elif line.startswith("id:"):
                current["id"] = line[3:].strip()
            elif line.startswith("event:"):
                current["event"] = line[6:].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line[5:].strip())
    if current:
        events.append(current)
    return events
