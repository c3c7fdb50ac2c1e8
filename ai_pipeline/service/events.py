"""A task's event stream (server-sent events): ``status`` at once, ``progress`` as it grows, then one
``completed`` or ``error``; an event's id lets a client resume after the events it has
(``Last-Event-ID``). The route that serves it, and checks whose task it is, is ``app``'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request

from ai_pipeline.service.progress import TaskView
from ai_pipeline.states import State

POLL_SECONDS = 0.5
FINAL_EVENT_ID = 1000  # after every progress event id (0–100)


# One event of a task's stream (OpenAPI 3.1 describes an event stream by its events).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["status", "progress", "completed", "error"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "JSON: the task (`status`, `completed`), `progress` and "
            "`current_step` (`progress`), or `status`, `category`, `message` and `review` "
            "(`error`)",
        },
        "id": {
            "type": "string",
            "description": "a progress event's progress, 1000 for the final event; send the last "
            "one back as `Last-Event-ID` to resume",
        },
    },
}


def event_number(last_event_id: str | None) -> int:
    try:
        return int(last_event_id) if last_event_id is not None else -1
    except ValueError:
        return -1


async def events(
    current: TaskView,
    seen: int,
    refreshed: Callable[[], Awaitable[TaskView]],
    request: Request,
    dagster_url: str,
) -> AsyncIterator[dict[str, Any]]:
    yield {"event": "status", "data": json.dumps(current.as_json(dagster_url))}
    while seen < FINAL_EVENT_ID:
        if current.progress > seen and not current.final:
            seen = current.progress
            yield {
                "id": str(seen),
                "event": "progress",
                "data": json.dumps(
                    {"progress": current.progress, "current_step": current.current_step}
                ),
            }
        if current.final:
            body = current.as_json(dagster_url)
            completed = current.doc.state == State.COMPLETED
            yield {
                "id": str(FINAL_EVENT_ID),
                "event": "completed" if completed else "error",
                "data": json.dumps(
                    body
                    if completed
                    else {
                        "status": body["status"],
                        "category": body["category"],
                        "message": body["error"] or f"the task is {body['status']}",
                        "review": body["review"],
                    }
                ),
            }
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(POLL_SECONDS)
        current = await refreshed()
