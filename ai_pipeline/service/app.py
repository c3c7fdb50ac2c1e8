"""The HTTP API of the submission service: submit, follow, list and cancel tasks, per tenant, of
every analysis the code location holds (``served``).

Every request carries ``Authorization: Bearer <key>``; the key names the tenant (``auth``: 401
without a valid one, 403 when ``X-Tenant-Id`` names another, 429 past the tenant's per-minute
limit). Another tenant's task answers 404, exactly like an id that does not exist. The store is
synchronous, so its calls run in worker threads; nothing here runs a document's work.

What a request carries is checked before it is read whole or stored (``inputs``): a body over its
limit is refused by its ``Content-Length``, or as its chunks arrive; ids have a fixed alphabet;
text a database cannot store (NUL, lone surrogates) is a 4xx on either backend; a JSON name and a
multipart file name obey the same rules. The URLs handed out start with the configured public URL
(``AI_PIPELINE_PUBLIC_URL``), or are paths: never the request's ``Host``. The OpenAPI document
says every status an operation answers (``models``), the event stream's media type (``events``)
and the bearer scheme.

A submission names its analysis (a JSON ``analysis``, a multipart ``analysis`` field), or goes to
the default one; an analysis the service does not serve is a 422 that names those it does. A
task's URL needs no analysis: the task is found in whichever analysis's results database holds it,
and says which (``analysis``); the list takes ``?analysis=`` and shows every analysis's without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ai_pipeline.documents import DocumentError, content_id, parse_document
from ai_pipeline.service.auth import Caller
from ai_pipeline.service.events import SSE_EVENT, event_number, events
from ai_pipeline.service.inputs import (
    JSON,
    MULTIPART,
    TASK_ID_PATTERN,
    TextSubmission,
    storable,
    upload,
)
from ai_pipeline.service.models import (
    CALLER,
    NO_TASK,
    AnalysisList,
    Submitted,
    Task,
    TaskPage,
    problem,
)
from ai_pipeline.service.progress import TaskStatus, TaskView, view
from ai_pipeline.service.review_page import FORM_KEY, build_review_router
from ai_pipeline.service.served import Served, UnknownAnalysis, load_analyses
from ai_pipeline.service.tenants import Tenant, Tenants, load_tenants
from ai_pipeline.service.thumbnails import Thumbnails
from ai_pipeline.settings import Settings, SettingsError
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store
from ai_pipeline.store.documents import ConcurrentChange
from ai_pipeline.tasks import SUBMITTED

T = TypeVar("T")
API = "/api/v1"
HEARTBEAT_SECONDS = 10


def tenant_document_id(tenant_id: str, content: str) -> str:
    """The tenant's own document for a content: the same bytes from the same tenant are the same
    document on any machine; from two tenants, two documents."""
    return content_id(f"tenant:{tenant_id}\0{content}".encode())


TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="the id POST answered")]


def create_app(
    settings: Settings | None = None,
    tenants: Tenants | None = None,
    *,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    analyses: Mapping[str, Settings] | None = None,
    default_analysis: str | None = None,
) -> FastAPI:
    """The service's app, serving ``analyses`` (each analysis's settings by its name, in the
    code location's order; None: the one the settings name); a submission that names none goes
    to ``default_analysis`` (None: the first). Its event streams send a heartbeat comment every
    ``heartbeat_seconds`` (so that proxies keep an idle stream open). The URLs it hands out
    start with the settings' public URL, or are paths when there is none: never the request's
    ``Host``, which the client chooses."""
    config = settings or Settings.load()
    if tenants is None:
        if not config.tenants_file:
            raise SettingsError("ai-pipeline serve needs AI_PIPELINE_TENANTS_FILE (tenants, keys)")
        tenants = load_tenants(config.tenants_file)
    served = load_analyses(config, analyses, default_analysis)
    # The default analysis's database holds what the service shares: request counts, form key.
    store = served.default.store
    prefix = (config.public_url or "").rstrip("/")
    app = FastAPI(
        title="ai_pipeline submission service",
        version="1",
        description="Submit documents for LLM analysis and follow them: 202 and a task id at "
        "once, polling or server-sent events, one tenant's tasks invisible to every other.",
    )
    app.state.tenants = tenants
    app.state.store = store
    app.include_router(
        build_review_router(served, store.secrets.shared(FORM_KEY), prefix, Thumbnails())
    )

    @app.exception_handler(UnknownAnalysis)
    async def unknown_analysis(request: Request, error: UnknownAnalysis) -> Response:
        return JSONResponse({"detail": str(error)}, status_code=422)

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

    async def own_task(tenant: Tenant, task: str) -> tuple[Served, TaskView]:
        found = await in_thread(lambda: served.find(tenant.tenant_id, task))
        if found is None:
            raise HTTPException(404, f"no task {task}")
        analysis, row = found
        return analysis, await in_thread(lambda: view(analysis.store, row))

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
            400: problem("a malformed body (multipart) or Content-Length"),
            **CALLER,
            413: problem("the body or the document is over the size limit"),
            415: problem("neither multipart/form-data nor application/json"),
            422: problem(
                "the document cannot be read, its name or text is refused, or the analysis it "
                "names is not served (the answer names those that are)"
            ),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    MULTIPART: {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "file": {"type": "string", "format": "binary"},
                                "analysis": TextSubmission.model_json_schema()["properties"][
                                    "analysis"
                                ],
                            },
                            "required": ["file"],
                        }
                    },
                    JSON: {"schema": TextSubmission.model_json_schema()},
                },
            }
        },
    )
    async def submit_task(request: Request, tenant: Caller) -> JSONResponse:
        """Submit a document (a file, or JSON text) to an analysis (by default the service's
        default one): 202 and its task id at once."""
        sent = await upload(request, config.max_document_bytes)
        analysis = served.named(sent.analysis)
        name, data = sent.name, sent.data
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
        task = analysis.task_id(doc.document_id)
        row, created = await in_thread(
            lambda: analysis.store.tasks.submit(tenant.tenant_id, task, doc, name, original)
        )
        current = await in_thread(lambda: view(analysis.store, row))
        estimate = (
            0 if current.final else await in_thread(lambda: analysis.estimator.seconds(doc.text))
        )
        poll, sse = urls(task)
        body = Submitted(
            task_id=task,
            analysis=analysis.name,
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
        _, current = await own_task(tenant, task_id)
        return current.as_json(config.dagster_url)

    @app.get(f"{API}/tasks", operation_id="list_tasks", response_model=TaskPage, responses=CALLER)
    async def list_tasks(
        tenant: Caller,
        status: Annotated[TaskStatus | None, Query(description="only tasks in this status")] = None,
        analysis: Annotated[
            str | None,
            Query(max_length=100, description="only this analysis's tasks (default: every one's)"),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    ) -> dict[str, Any]:
        """The tenant's own tasks, newest first, a page at a time: of one analysis, or of all."""
        states = status.states() if status else None
        page, total = await in_thread(
            lambda: served.listing(tenant.tenant_id, states, limit, offset, analysis)
        )
        views = await in_thread(
            lambda: [view(s.store, t).as_json(config.dagster_url) for s, t in page]
        )
        return {"tasks": views, "total": total, "limit": limit, "offset": offset}

    @app.get(
        f"{API}/analyses",
        operation_id="list_analyses",
        response_model=AnalysisList,
        responses=CALLER,
    )
    async def list_analyses(tenant: Caller) -> dict[str, Any]:
        """The analyses a submission may name, and the one it goes to when it names none."""
        return {"analyses": served.names, "default": served.default.name}

    @app.delete(
        f"{API}/tasks/{{task_id}}",
        operation_id="cancel_task",
        response_model=Task,
        responses={
            **CALLER,
            **NO_TASK,
            409: problem("the task has already ended, or keeps changing"),
        },
    )
    async def cancel_task(task_id: TaskId, tenant: Caller) -> dict[str, Any]:
        """Cancel a task that has not ended: CANCELLED at once, or — when a run holds it — as soon
        as that run reaches its next step (``cancel_requested``); its review item, if a person
        had it, is closed; 409 for an ended one."""
        analysis, current = await own_task(tenant, task_id)
        await in_thread(lambda: _cancel(analysis.store, current))
        _, cancelled = await own_task(tenant, task_id)
        return cancelled.as_json(config.dagster_url)

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
        analysis, current = await own_task(tenant, task_id)
        seen = event_number(last_event_id)
        if not current.final:
            seen = min(seen, current.progress)

        async def refreshed() -> TaskView:
            return await in_thread(lambda: view(analysis.store, current.task))

        return EventSourceResponse(
            events(current, seen, refreshed, request, config.dagster_url),
            ping=heartbeat_seconds,
        )

    return app


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
