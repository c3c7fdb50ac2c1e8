"""The HTTP API of the submission service: submit, follow, list and cancel tasks, per tenant.

Every request carries ``Authorization: Bearer <key>``; the key names the tenant (401 without a
valid one) and an ``X-Tenant-Id`` header, when present, must name the same tenant (403). A tenant
with a per-minute limit gets 429 past it in a clock minute; its requests are counted in the results
database, so the limit holds however many web processes serve. Another tenant's task answers 404,
exactly like an id that does not exist. The store is synchronous, so
its calls run in worker threads; nothing here runs a document's work.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.datastructures import UploadFile

from ai_pipeline.documents import (
    SUPPORTED_SUFFIXES,
    DocumentError,
    content_id,
    kind_of,
    parse_document,
)
from ai_pipeline.service.estimate import Estimator
from ai_pipeline.service.progress import TaskStatus, TaskView, view
from ai_pipeline.service.review_page import build_review_router
from ai_pipeline.service.tenants import Tenant, Tenants, load_tenants
from ai_pipeline.settings import Settings, SettingsError
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store, open_store
from ai_pipeline.store.documents import ConcurrentChange
from ai_pipeline.tasks import ANALYSE_STEP, SUBMITTED, task_id

T = TypeVar("T")
API = "/api/v1"
POLL_SECONDS = 0.5
HEARTBEAT_SECONDS = 10
FINAL_EVENT_ID = 1000  # after every progress event id (0–100)


class TextSubmission(BaseModel):
    text: str = Field(min_length=1, description="the document's text")
    name: str = Field(
        "text.txt",
        min_length=5,
        max_length=255,
        pattern=r"(?i)\.(txt|md|markdown|html?|pdf)$",
        description="its file name, whose suffix says its format",
    )


class Submitted(BaseModel):
    task_id: str
    status: TaskStatus = Field(description="QUEUED for a new task: accepted, waiting for a run")
    poll_url: str
    sse_url: str
    estimated_seconds: int


def tenant_document_id(tenant_id: str, content: str) -> str:
    """The tenant's own document for a content: the same bytes from the same tenant are the same
    document on any machine; from two tenants, two documents."""
    return content_id(f"tenant:{tenant_id}\0{content}".encode())


def caller(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_tenant_id: Annotated[str | None, Header()] = None,
) -> Tenant:
    """The tenant a request's key belongs to: 401 without a valid key, 403 when X-Tenant-Id
    names another tenant, 429 over the tenant's per-minute limit."""
    tenants: Tenants = request.app.state.tenants
    scheme, _, key = (authorization or "").partition(" ")
    tenant = tenants.tenant_of(key.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise HTTPException(
            401,
            "a valid API key is required: Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if x_tenant_id is not None and x_tenant_id != tenant.tenant_id:
        raise HTTPException(403, "X-Tenant-Id does not match the API key's tenant")
    limit = tenant.requests_per_minute
    if limit:
        now = datetime.now(timezone.utc)
        store: Store = request.app.state.store
        if store.tasks.count_request(tenant.tenant_id, now) > limit:
            next_minute = str(60 - now.second)
            raise HTTPException(
                429,
                f"over this tenant's limit of {limit} requests a minute",
                headers={"Retry-After": next_minute},
            )
    return tenant


Caller = Annotated[Tenant, Depends(caller)]


def create_app(
    settings: Settings | None = None,
    tenants: Tenants | None = None,
    *,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
) -> FastAPI:
    """The service's app; its event streams send a heartbeat comment every
    ``heartbeat_seconds`` (so that proxies keep an idle stream open)."""
    config = settings or Settings.load()
    if tenants is None:
        if not config.tenants_file:
            raise SettingsError("ai-pipeline serve needs AI_PIPELINE_TENANTS_FILE (tenants, keys)")
        tenants = load_tenants(config.tenants_file)
    store = open_store(config)
    app = FastAPI(
        title="ai_pipeline submission service",
        version="1",
        description="Submit documents for LLM analysis and follow them: 202 and a task id at "
        "once, polling or server-sent events, one tenant's tasks invisible to every other.",
    )
    app.state.tenants = tenants
    app.state.store = store
    estimator = Estimator(store, config.llm_concurrency, config.section_chars)
    app.include_router(build_review_router(store, secrets.token_bytes(32)))

    async def in_thread(work: Callable[[], T]) -> T:
        return await asyncio.to_thread(work)

    def urls(request: Request, task: str) -> tuple[str, str]:
        return (
            str(request.url_for("get_task", task_id=task)),
            str(request.url_for("task_events", task_id=task)),
        )

    async def own_task(tenant: Tenant, task: str) -> TaskView:
        found = await in_thread(lambda: store.tasks.get(tenant.tenant_id, task))
        if found is None:
            raise HTTPException(404, f"no task {task}")
        return await in_thread(lambda: view(store, found))

    @app.post(
        f"{API}/tasks",
        status_code=202,
        response_model=Submitted,
        responses={
            200: {"model": Submitted, "description": "this content was submitted before"},
            401: {"description": "no valid API key"},
            403: {"description": "X-Tenant-Id is not the key's tenant"},
            413: {"description": "the document is over the size limit"},
            415: {"description": "neither multipart/form-data nor application/json"},
            422: {"description": "the document cannot be read (the message says why)"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {"file": {"type": "string", "format": "binary"}},
                            "required": ["file"],
                        }
                    },
                    "application/json": {"schema": TextSubmission.model_json_schema()},
                },
            }
        },
    )
    async def submit_task(request: Request, tenant: Caller) -> JSONResponse:
        """Submit a document (a file, or JSON text): 202 and its task id at once."""
        name, data = await _upload(request, config.max_document_bytes)
        try:
            doc = parse_document(data, name)
        except DocumentError as e:
            raise HTTPException(422, f"{name}: {e.reason}") from e
        doc = replace(
            doc,
            document_id=tenant_document_id(tenant.tenant_id, doc.document_id),
            source=f"{SUBMITTED}{tenant.tenant_id}/{name}",
        )
        # A PDF's text is not the original: keep its bytes for the review page's thumbnail.
        original = data if doc.kind == "pdf" else None
        task = task_id(
            doc.document_id, ANALYSE_STEP, config.declaration.tag(), config.analysis_model
        )
        row, created = await in_thread(
            lambda: store.tasks.submit(tenant.tenant_id, task, doc, name, original)
        )
        current = await in_thread(lambda: view(store, row))
        estimate = 0 if current.final else await in_thread(lambda: estimator.seconds(doc.text))
        poll, sse = urls(request, task)
        body = Submitted(
            task_id=task,
            status=current.status,
            poll_url=poll,
            sse_url=sse,
            estimated_seconds=estimate,
        )
        return JSONResponse(body.model_dump(mode="json"), status_code=202 if created else 200)

    @app.get(f"{API}/tasks/{{task_id}}", name="get_task")
    async def get_task(task_id: str, tenant: Caller) -> dict[str, Any]:
        """A task's state, progress and result (or category and error)."""
        return (await own_task(tenant, task_id)).as_json(config.dagster_url)

    @app.get(f"{API}/tasks", name="list_tasks")
    async def list_tasks(
        tenant: Caller,
        status: Annotated[TaskStatus | None, Query(description="only tasks in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    ) -> dict[str, Any]:
        """The tenant's own tasks, newest first, a page at a time."""
        states = status.states() if status else None
        page, total = await in_thread(
            lambda: store.tasks.listing(tenant.tenant_id, states, limit, offset)
        )
        views = await in_thread(lambda: [view(store, t).as_json(config.dagster_url) for t in page])
        return {"tasks": views, "total": total, "limit": limit, "offset": offset}

    @app.delete(
        f"{API}/tasks/{{task_id}}",
        responses={404: {"description": "no such task"}, 409: {"description": "already ended"}},
    )
    async def cancel_task(task_id: str, tenant: Caller) -> dict[str, Any]:
        """Cancel a task that has not ended: CANCELLED at once, or — when a run holds it — as soon
        as that run reaches its next step (``cancel_requested``); 409 for an ended one."""
        current = await own_task(tenant, task_id)
        await in_thread(lambda: _cancel(store, current))
        return (await own_task(tenant, task_id)).as_json(config.dagster_url)

    @app.get(f"{API}/tasks/{{task_id}}/events", name="task_events")
    async def task_events(
        task_id: str,
        tenant: Caller,
        request: Request,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> EventSourceResponse:
        """Server-sent events: ``status`` now, ``progress`` as it grows, then one ``completed``
        or ``error``; ``Last-Event-ID`` resumes after the events already delivered."""
        current = await own_task(tenant, task_id)
        seen = _event_number(last_event_id)

        async def refreshed() -> TaskView:
            return await own_task(tenant, task_id)

        return EventSourceResponse(
            _events(current, seen, refreshed, request, config.dagster_url),
            ping=heartbeat_seconds,
        )

    return app


async def _upload(request: Request, max_bytes: int) -> tuple[str, bytes]:
    """The submitted document's name and bytes, or the 4xx that says what is wrong."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form(max_files=1, max_fields=10)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise HTTPException(422, "the multipart body needs a `file` part")
        name = (upload.filename or "upload.txt").rsplit("/", 1)[-1] or "upload.txt"
        data = await upload.read(max_bytes + 1)
    elif kind == "application/json":
        try:
            body = TextSubmission.model_validate_json(await request.body())
        except ValidationError as e:
            raise HTTPException(422, f"the JSON body needs `text` (and may name it): {e}") from e
        name, data = body.name.rsplit("/", 1)[-1], body.text.encode("utf-8")
    else:
        raise HTTPException(
            415, 'send the document as multipart/form-data (`file`) or JSON {"text": …}'
        )
    if len(data) > max_bytes:
        raise HTTPException(413, f"{name}: over the size limit of {max_bytes} bytes")
    if kind_of(Path(name)) == "other":
        raise HTTPException(
            422, f"{name}: unsupported type (supported: {', '.join(SUPPORTED_SUFFIXES)})"
        )
    return name, data


def _cancel(store: Store, current: TaskView) -> None:
    """CANCELLED along the state machine, or asked of the run that holds the task; a task that
    moves meanwhile (a run takes it) is looked at again."""
    document_id = current.doc.document_id
    for _ in range(3):
        doc = store.documents.get(document_id)
        assert doc is not None
        if doc.state in (State.COMPLETED, State.CANCELLED):
            raise HTTPException(409, f"the task has already ended ({doc.state.value})")
        if doc.state == State.RUNNING:
            if store.documents.request_cancel(document_id):
                return  # the run that holds it stops at its next step, CANCELLED then
            continue
        # A failed task goes back to QUEUED first, then to CANCELLED.
        path = [State.QUEUED] if doc.state in (State.FAILED, State.DEAD_LETTER) else []
        try:
            for target in [*path, State.CANCELLED]:
                store.documents.transition(document_id, target)
            return
        except (ConcurrentChange, IllegalTransition):
            continue
    raise HTTPException(409, "the task keeps changing (runs are taking it): try again")


def _event_number(last_event_id: str | None) -> int:
    try:
        return int(last_event_id) if last_event_id is not None else -1
    except ValueError:
        return -1


async def _events(
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
                    }
                ),
            }
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(POLL_SECONDS)
        current = await refreshed()
