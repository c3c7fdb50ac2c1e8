"""The HTTP API of the submission service: submit, follow, list and cancel tasks, per tenant.

Every request carries ``Authorization: Bearer <key>``; the key names the tenant (401 without a
valid one) and an ``X-Tenant-Id`` header, when present, must name the same tenant (403). A tenant
with a per-minute limit gets 429 past it in a clock minute; its requests are counted in the results
database, so the limit holds however many web processes serve. Another tenant's task answers 404,
exactly like an id that does not exist. The store is synchronous, so
its calls run in worker threads; nothing here runs a document's work.

What a request carries is checked before it is read whole or stored (``inputs``): a body over its
limit is refused by its ``Content-Length``, or as its chunks arrive; ids have a fixed alphabet;
text a database cannot store (NUL, lone surrogates) is a 4xx on either backend; a JSON name and a
multipart file name obey the same rules. The URLs handed out start with the configured public URL
(``AI_PIPELINE_PUBLIC_URL``), or are paths: never the request's ``Host``. The OpenAPI document
says every status an operation answers, the event stream's media type and the bearer scheme.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ai_pipeline.documents import DocumentError, content_id, parse_document
from ai_pipeline.service.estimate import Estimator
from ai_pipeline.service.inputs import (
    TASK_ID_PATTERN,
    body_limit,
    bounded_body,
    document_name,
    replayed,
    storable,
)
from ai_pipeline.service.progress import TaskStatus, TaskView, view
from ai_pipeline.service.review_page import FORM_KEY, build_review_router
from ai_pipeline.service.tenants import Tenant, Tenants, load_tenants
from ai_pipeline.service.thumbnails import Thumbnails
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
MULTIPART = "multipart/form-data"
JSON = "application/json"


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


class Submitted(BaseModel):
    task_id: str
    status: TaskStatus = Field(description="QUEUED for a new task: accepted, waiting for a run")
    poll_url: str = Field(description="the task's URL (from the service's public URL, else a path)")
    sse_url: str = Field(description="its event stream's URL")
    estimated_seconds: int


class Sections(BaseModel):
    done: int
    total: int


class ReviewOutcome(BaseModel):
    decision: str = Field(description="`rejected`: a person reviewed the task and turned it down")
    decided_by: str = Field(description="`person`: a reviewer decided, not the pipeline")
    decided_at: str
    message: str = Field(description="the standard message to the submitter")
    message_en: str


class Task(BaseModel):
    task_id: str
    name: str
    status: TaskStatus
    cancel_requested: bool
    progress: int = Field(ge=0, le=100)
    current_step: str
    sections: Sections
    result: dict[str, Any] | None
    category: str | None
    error: str | None = Field(
        description="why the task failed; after a reviewer's rejection, the standard message"
    )
    review: ReviewOutcome | None = Field(description="a reviewer's decision, once there is one")
    created_at: str
    completed_at: str | None
    dagster_run_url: str | None


class TaskPage(BaseModel):
    tasks: list[Task]
    total: int
    limit: int
    offset: int


class Problem(BaseModel):
    detail: str | list[dict[str, Any]] = Field(description="what is wrong, for a person")


def _problem(description: str, **headers: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"model": Problem, "description": description}
    if headers:
        answer["headers"] = {
            name: {"description": why, "schema": {"type": "string"}}
            for name, why in headers.items()
        }
    return answer


# What any call of the API may answer besides its own outcomes.
CALLER: dict[int | str, dict[str, Any]] = {
    401: _problem(
        "no valid API key: `Authorization: Bearer <key>`",
        **{"WWW-Authenticate": "Bearer"},
    ),
    403: _problem("X-Tenant-Id names another tenant than the key's"),
    422: _problem("a parameter or the body is not what this operation takes"),
    429: _problem(
        "over the tenant's requests per minute",
        **{"Retry-After": "seconds to the next clock minute"},
    ),
}
NO_TASK: dict[int | str, dict[str, Any]] = {
    404: _problem("no such task of this tenant (another tenant's answers the same)")
}


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


def tenant_document_id(tenant_id: str, content: str) -> str:
    """The tenant's own document for a content: the same bytes from the same tenant are the same
    document on any machine; from two tenants, two documents."""
    return content_id(f"tenant:{tenant_id}\0{content}".encode())


bearer = HTTPBearer(
    auto_error=False,
    scheme_name="tenant_key",
    description="a tenant's API key from the tenants file: `Authorization: Bearer <key>`",
)


def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    x_tenant_id: Annotated[
        str | None, Header(description="when sent, must be the key's tenant (else 403)")
    ] = None,
) -> Tenant:
    """The tenant a request's key belongs to: 401 without a valid key, 403 when X-Tenant-Id
    names another tenant, 429 over the tenant's per-minute limit."""
    tenants: Tenants = request.app.state.tenants
    tenant = tenants.tenant_of(credentials.credentials.strip()) if credentials else None
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
TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="the id POST answered")]


def create_app(
    settings: Settings | None = None,
    tenants: Tenants | None = None,
    *,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
) -> FastAPI:
    """The service's app; its event streams send a heartbeat comment every
    ``heartbeat_seconds`` (so that proxies keep an idle stream open). The URLs it hands out
    start with the settings' public URL, or are paths when there is none: never the request's
    ``Host``, which the client chooses."""
    config = settings or Settings.load()
    if tenants is None:
        if not config.tenants_file:
            raise SettingsError("ai-pipeline serve needs AI_PIPELINE_TENANTS_FILE (tenants, keys)")
        tenants = load_tenants(config.tenants_file)
    store = open_store(config)
    prefix = (config.public_url or "").rstrip("/")
    app = FastAPI(
        title="ai_pipeline submission service",
        version="1",
        description="Submit documents for LLM analysis and follow them: 202 and a task id at "
        "once, polling or server-sent events, one tenant's tasks invisible to every other.",
    )
    app.state.tenants = tenants
    app.state.store = store
    estimator = Estimator(store, config.llm_concurrency, config.section_chars)
    app.include_router(
        build_review_router(store, store.secrets.shared(FORM_KEY), prefix, Thumbnails())
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        """FastAPI's answer, but a 405 lists every method the path has (each method is a route
        of its own, and the router names only the first that matched the path)."""
        if error.status_code == 405:
            allowed = sorted(
                method
                for route in app.router.routes
                if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE
                for method in route.methods or ()
            )
            error = StarletteHTTPException(405, error.detail, {"Allow": ", ".join(allowed)})
        return await http_exception_handler(request, error)

    async def in_thread(work: Callable[[], T]) -> T:
        return await asyncio.to_thread(work)

    def urls(task: str) -> tuple[str, str]:
        return f"{prefix}{API}/tasks/{task}", f"{prefix}{API}/tasks/{task}/events"

    async def own_task(tenant: Tenant, task: str) -> TaskView:
        found = await in_thread(lambda: store.tasks.get(tenant.tenant_id, task))
        if found is None:
            raise HTTPException(404, f"no task {task}")
        return await in_thread(lambda: view(store, found))

    follow = {
        name: {"operationId": operation, "parameters": {"task_id": "$response.body#/task_id"}}
        for name, operation in (("GetTask", "get_task"), ("TaskEvents", "task_events"))
    }

    @app.post(
        f"{API}/tasks",
        operation_id="submit_task",
        status_code=202,
        response_model=Submitted,
        responses={
            202: {"description": "a new task, queued", "links": follow},
            200: {
                "model": Submitted,
                "description": "this content was submitted before: its task",
                "links": follow,
            },
            400: _problem("a malformed body (multipart) or Content-Length"),
            **CALLER,
            413: _problem("the body or the document is over the size limit"),
            415: _problem("neither multipart/form-data nor application/json"),
            422: _problem("the document cannot be read, or its name or text is refused"),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    MULTIPART: {
                        "schema": {
                            "type": "object",
                            "properties": {"file": {"type": "string", "format": "binary"}},
                            "required": ["file"],
                        }
                    },
                    JSON: {"schema": TextSubmission.model_json_schema()},
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
        storable(doc.text, f"{name}: its text")
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
        poll, sse = urls(task)
        body = Submitted(
            task_id=task,
            status=current.status,
            poll_url=poll,
            sse_url=sse,
            estimated_seconds=estimate,
        )
        return JSONResponse(body.model_dump(mode="json"), status_code=202 if created else 200)

    @app.get(
        f"{API}/tasks/{{task_id}}",
        operation_id="get_task",
        response_model=Task,
        responses={**CALLER, **NO_TASK},
    )
    async def get_task(task_id: TaskId, tenant: Caller) -> dict[str, Any]:
        """A task's state, progress and result (or category and error, and a reviewer's
        decision)."""
        return (await own_task(tenant, task_id)).as_json(config.dagster_url)

    @app.get(f"{API}/tasks", operation_id="list_tasks", response_model=TaskPage, responses=CALLER)
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
        operation_id="cancel_task",
        response_model=Task,
        responses={
            **CALLER,
            **NO_TASK,
            409: _problem("the task has already ended, or keeps changing"),
        },
    )
    async def cancel_task(task_id: TaskId, tenant: Caller) -> dict[str, Any]:
        """Cancel a task that has not ended: CANCELLED at once, or — when a run holds it — as soon
        as that run reaches its next step (``cancel_requested``); its review item, if a person
        had it, is closed; 409 for an ended one."""
        current = await own_task(tenant, task_id)
        await in_thread(lambda: _cancel(store, current))
        return (await own_task(tenant, task_id)).as_json(config.dagster_url)

    @app.get(
        f"{API}/tasks/{{task_id}}/events",
        operation_id="task_events",
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": "the event stream (server-sent events)",
                "content": {"text/event-stream": {"schema": SSE_EVENT}},
            },
            **CALLER,
            **NO_TASK,
        },
    )
    async def task_events(
        task_id: TaskId,
        tenant: Caller,
        request: Request,
        last_event_id: Annotated[
            str | None, Header(description="the id of the last event received")
        ] = None,
    ) -> EventSourceResponse:
        """Server-sent events: ``status`` now, ``progress`` as it grows, then one ``completed``
        or ``error``; ``Last-Event-ID`` resumes after the events already delivered (an id past
        them means nothing new yet)."""
        current = await own_task(tenant, task_id)
        seen = _event_number(last_event_id)
        if not current.final:
            seen = min(seen, current.progress)

        async def refreshed() -> TaskView:
            return await own_task(tenant, task_id)

        return EventSourceResponse(
            _events(current, seen, refreshed, request, config.dagster_url),
            ping=heartbeat_seconds,
        )

    return app


async def _upload(request: Request, max_bytes: int) -> tuple[str, bytes]:
    """The submitted document's name and bytes, or the 4xx that says what is wrong; the body is
    read only as far as its limit."""
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
    else:
        try:
            submission = TextSubmission.model_validate_json(body)
        except ValidationError as e:
            raise HTTPException(422, f"the JSON body needs `text` (and may name it): {e}") from e
        name = document_name(submission.name)
        data = storable(submission.text, "the text").encode("utf-8")
    if len(data) > max_bytes:
        raise HTTPException(413, f"{name}: over the size limit of {max_bytes} bytes")
    return name, data


def _cancel(store: Store, current: TaskView) -> None:
    """CANCELLED along the state machine, or asked of the run that holds the task; a task that
    moves meanwhile (a run takes it) is looked at again. A review item a person had for it is
    closed: there is nothing left to decide (an approved one whose run is stopping is closed by
    the approvals sensor once the run has stopped)."""
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
        except (ConcurrentChange, IllegalTransition):
            continue
        store.reviews.cancel(document_id)
        return
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
                        "review": body["review"],
                    }
                ),
            }
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(POLL_SECONDS)
        current = await refreshed()
