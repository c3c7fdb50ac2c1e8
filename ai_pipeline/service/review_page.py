"""The review queue as a page people click (seed 002 §5.5), behind an operator key.

``GET /review`` lists the open items — a thumbnail of the original (a PDF's first page rendered
with pypdfium2; the first lines of a text or HTML file), the category, the error, when it was
submitted — with a category filter. **Approve** (with the accept-output / retry choice for a
model-layer failure) and **Reject** (with a reason) do exactly what ``ai-pipeline review approve``
and ``reject`` do (``ai_pipeline.review``); an approved item is then re-submitted under its task id
by the ``approvals_sensor``, as a Dagster run, never in the web process.

A browser signs in with HTTP Basic (any user name, an operator key as the password); an API client
may send ``Authorization: Bearer <operator key>``. Every form carries a token bound to its item and
to this process, so a page elsewhere cannot make an operator's browser decide an item.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
from datetime import timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ai_pipeline.documents import content_id
from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category
from ai_pipeline.review import MODEL_LAYER, WEB_REVIEWER, approve, open_items, reject
from ai_pipeline.service.tenants import Tenants
from ai_pipeline.store import Store
from ai_pipeline.store.rows import Decision, ReviewItem, ReviewStatus
from ai_pipeline.tasks import SUBMITTED

THUMBNAIL_WIDTH = 240
FIRST_LINES = 12
_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("ai_pipeline.service", "templates"),
    autoescape=True,
)


def operator(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The operator's name: HTTP Basic with an operator key as the password, or a Bearer key."""
    tenants: Tenants = request.app.state.tenants
    scheme, _, value = (authorization or "").partition(" ")
    user, key = "operator", ""
    if scheme.lower() == "basic":
        try:
            user, _, key = base64.b64decode(value).decode("utf-8").partition(":")
        except ValueError:
            key = ""
    elif scheme.lower() == "bearer":
        key = value.strip()
    if not key or not tenants.is_operator(key):
        raise HTTPException(
            401,
            "the review queue needs an operator key",
            headers={"WWW-Authenticate": 'Basic realm="ai_pipeline review queue"'},
        )
    return user or "operator"


Operator = Annotated[str, Depends(operator)]


def _token(secret: bytes, document_id: str) -> str:
    return hmac.new(secret, document_id.encode(), hashlib.sha256).hexdigest()


def build_review_router(store: Store, secret: bytes) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    def page(
        request: Request,
        category: str | None,
        notice: str | None = None,
        problem: str | None = None,
        status_code: int = 200,
    ) -> HTMLResponse:
        wanted = _category(category)
        items = open_items(store, [wanted] if wanted else None)
        html = _templates.get_template("review.html").render(
            base=str(request.base_url).rstrip("/"),
            items=[_row(store, item, secret) for item in items],
            categories=sorted({c.value for c in Category if c.needs_person}),
            selected=wanted.value if wanted else "",
            notice=notice,
            problem=problem,
        )
        return HTMLResponse(html, status_code=status_code)

    @router.get("/review", response_class=HTMLResponse)
    async def review_queue(
        request: Request,
        who: Operator,
        category: str | None = None,
        done: str | None = None,
    ) -> HTMLResponse:
        return await asyncio.to_thread(page, request, category, done)

    async def decided_form(request: Request, document_id: str) -> dict[str, Any]:
        form = dict(await request.form(max_files=0, max_fields=10))
        if not hmac.compare_digest(str(form.get("token", "")), _token(secret, document_id)):
            raise HTTPException(403, "this form is not from the review page: reload it")
        return form

    @router.post("/review/{document_id}/approve")
    async def approve_item(request: Request, document_id: str, who: Operator) -> Response:
        form = await decided_form(request, document_id)
        choice = str(form.get("decision") or "")
        decision = {"accept_output": Decision.ACCEPT_OUTPUT, "retry": Decision.RETRY}.get(choice)
        try:
            approval = await asyncio.to_thread(
                lambda: approve(store, document_id, decision=decision, by=f"{WEB_REVIEWER}{who}")
            )
        except InputError as e:
            return await asyncio.to_thread(page, request, None, None, str(e), 400)
        notice = (
            f"approved {document_id} ({approval.decision.value}): re-submitted under task "
            f"{approval.task_id}"
        )
        return RedirectResponse(f"{request.base_url}review?done={quote(notice)}", status_code=303)

    @router.post("/review/{document_id}/reject")
    async def reject_item(request: Request, document_id: str, who: Operator) -> Response:
        form = await decided_form(request, document_id)
        reason = str(form.get("reason") or "").strip()
        if not reason:
            return await asyncio.to_thread(
                page, request, None, None, "a rejection needs a reason", 400
            )
        try:
            rejection = await asyncio.to_thread(
                lambda: reject(store, document_id, reason=reason, by=f"{WEB_REVIEWER}{who}")
            )
        except InputError as e:
            return await asyncio.to_thread(page, request, None, None, str(e), 400)
        notice = f"rejected {document_id}; the submitter was told: {rejection.message_en}"
        return RedirectResponse(f"{request.base_url}review?done={quote(notice)}", status_code=303)

    @router.get("/review/{document_id}/thumbnail.png")
    async def thumbnail(document_id: str, who: Operator) -> Response:
        item = await asyncio.to_thread(store.reviews.get, document_id)
        png = await asyncio.to_thread(pdf_thumbnail, store, item) if item else None
        if png is None:
            raise HTTPException(404, f"no thumbnail for {document_id}")
        return Response(png, media_type="image/png", headers={"Cache-Control": "private"})

    return router


def _category(value: str | None) -> Category | None:
    try:
        return Category(value) if value else None
    except ValueError:
        return None


def _row(store: Store, item: ReviewItem, secret: bytes) -> dict[str, Any]:
    snapshot = item.snapshot
    return {
        "document_id": item.document_id,
        "task_id": item.task_id,
        "source": snapshot.source,
        "kind": snapshot.kind,
        "size_bytes": snapshot.size_bytes,
        "category": item.category.value,
        "error": item.error,
        "submitted": item.created_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "thumbnail": _original(store, item) is not None,
        "first_lines": "\n".join(snapshot.first_characters.splitlines()[:FIRST_LINES]),
        "model_layer": item.category in MODEL_LAYER,
        "token": _token(secret, item.document_id),
        "open": item.status == ReviewStatus.OPEN,
    }


def _original(store: Store, item: ReviewItem) -> bytes | None:
    """A PDF's original bytes: a submitted one's as uploaded (kept in the results database, since
    a tenant's document id covers the tenant too), an inbox file's when it is still where it was
    registered and unchanged (a PDF document's id is its bytes' content id)."""
    if item.snapshot.kind != "pdf":
        return None
    if item.snapshot.source.startswith(SUBMITTED):
        return store.tasks.original(item.document_id)
    path = Path(item.snapshot.source)
    try:
        data = path.read_bytes() if path.is_file() else None
    except OSError:
        return None
    return data if data is not None and content_id(data) == item.document_id else None


def pdf_thumbnail(store: Store, item: ReviewItem) -> bytes | None:
    """The first page of the item's PDF as a PNG ``THUMBNAIL_WIDTH`` pixels wide."""
    import pypdfium2 as pdfium

    data = _original(store, item)
    if data is None:
        return None
    try:
        pdf = pdfium.PdfDocument(data)
        try:
            page = pdf[0]
            scale = THUMBNAIL_WIDTH / max(page.get_width(), 1)
            image = page.render(scale=scale).to_pil()
        finally:
            pdf.close()
    except pdfium.PdfiumError:
        return None
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
