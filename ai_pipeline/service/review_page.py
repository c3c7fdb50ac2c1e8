"""The review queue as a page people click, behind an operator key.

``GET /review`` lists the open items of every analysis the service serves, each naming its
analysis — a thumbnail of the original (a PDF's first page rendered with pypdfium2; the first
lines of a text or HTML file), the category, the error, when it was submitted — with a category
filter. **Approve** (with the accept-output / retry choice for a model-layer failure) and
**Reject** (with a reason) do exactly what ``ai-pipeline review approve`` and ``reject`` do
(``ai_pipeline.review``); an approved item is then re-submitted under its task id by the
``approvals_sensor``, as a Dagster run, never in the web process. An item's routes name its
analysis with ``?analysis=`` (none: the service's default analysis, so that the default's URLs
are those of a service with one analysis): a decision is taken in that analysis's results
database, where that analysis's own approvals sensor picks it up.

A browser signs in with HTTP Basic (any user name, an operator key as the password); an API client
may send ``Authorization: Bearer <operator key>``. Every form carries a token bound to its item
(and the item's analysis) and signed with the deployment's form key (kept in the default
analysis's results database, so every ``serve`` process on it, and each one after a restart,
accepts the forms any of them drew, until they expire): a page elsewhere cannot make an
operator's browser decide an item. Deciding an item already decided the same way answers as the
first decision did, whichever process receives it. After a decision the browser is sent back to
the queue with the item's id, its analysis and the outcome in the URL, never with text the page
would show; links, actions and redirects come from the configured public URL, never from the
request's ``Host``.

Thumbnails are ``ai_pipeline.service.thumbnails``'s: a fixed pixel budget, off the event loop,
cached.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import time
from datetime import timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi import Path as InPath
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ai_pipeline.documents import content_id
from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category
from ai_pipeline.review import MODEL_LAYER, WEB_REVIEWER, approve, open_items, reject
from ai_pipeline.service.inputs import DOCUMENT_ID_PATTERN, MAX_ANALYSIS_CHARS, unstorable
from ai_pipeline.service.served import Analyses, Served
from ai_pipeline.service.tenants import Tenants
from ai_pipeline.service.thumbnails import Thumbnails, placeholder
from ai_pipeline.store import Store
from ai_pipeline.store.rows import Decision, ReviewItem, ReviewStatus
from ai_pipeline.tasks import SUBMITTED

FIRST_LINES = 12
# How long a drawn form stays good: a page left open over a night, then used, still works.
FORM_SECONDS = 24 * 3600
REASON_MAX_CHARS = 2000
# The name of the forms' signing key among the service's shared secrets.
FORM_KEY = "review-form-key"
_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("ai_pipeline.service", "templates"),
    autoescape=True,
)
DocumentId = Annotated[str, InPath(pattern=DOCUMENT_ID_PATTERN)]
# The analysis an item belongs to; none: the service's default.
AnalysisName = Annotated[str | None, Query(max_length=MAX_ANALYSIS_CHARS)]


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
    if unstorable(user) or len(user) > 64:
        raise HTTPException(400, "the user name must be text of at most 64 characters")
    return user or "operator"


Operator = Annotated[str, Depends(operator)]


def form_token(secret: bytes, analysis: str, document_id: str, now: float) -> str:
    """A form's token: good for this item of this analysis until ``FORM_SECONDS`` from ``now``,
    in any process that shares ``secret``."""
    expires = int(now) + FORM_SECONDS
    return f"{expires}.{_mac(secret, analysis, document_id, expires)}"


def token_valid(secret: bytes, analysis: str, document_id: str, token: str, now: float) -> bool:
    expires, _, mac = token.partition(".")
    if not (expires.isascii() and expires.isdigit()) or int(expires) < now:
        return False
    return hmac.compare_digest(mac, _mac(secret, analysis, document_id, int(expires)))


def _mac(secret: bytes, analysis: str, document_id: str, expires: int) -> str:
    message = f"{analysis}\0{document_id}\0{expires}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def build_review_router(
    served: Analyses, secret: bytes, prefix: str, thumbnails: Thumbnails
) -> APIRouter:
    """The page's routes, over every analysis served; its links, form actions and redirects start
    with ``prefix`` (the service's public URL, or empty for paths relative to the host the
    browser asked)."""
    router = APIRouter(include_in_schema=False)

    def query(analysis: Served) -> str:
        """What an item's URLs add to name its analysis: nothing for the default one."""
        return "" if analysis is served.default else "?" + urlencode({"analysis": analysis.name})

    def page(
        category: str | None,
        notice: str | None = None,
        problem: str | None = None,
        status_code: int = 200,
    ) -> HTMLResponse:
        wanted = _category(category)
        now = time.time()
        rows = [
            _row(analysis, query(analysis), item, secret, now)
            for analysis in served
            for item in open_items(analysis.store, [wanted] if wanted else None)
        ]
        html = _templates.get_template("review.html").render(
            base=prefix,
            analyses=served.names,
            items=rows,
            categories=sorted({c.value for c in Category if c.needs_person}),
            selected=wanted.value if wanted else "",
            notice=notice,
            problem=problem,
        )
        return HTMLResponse(html, status_code=status_code)

    def done(outcome: str, analysis: Served, document_id: str) -> RedirectResponse:
        """Back to the queue, saying what was decided: the URL names the item (and its
        analysis) and the outcome, the page reads what to say about it from the store."""
        named = {} if analysis is served.default else {"analysis": analysis.name}
        query = urlencode({"done": outcome, "item": document_id, **named})
        return RedirectResponse(f"{prefix}/review?{query}", status_code=303)

    @router.get("/review", response_class=HTMLResponse)
    async def review_queue(
        who: Operator,
        category: str | None = None,
        done: str | None = None,
        item: str | None = None,
        analysis: AnalysisName = None,
    ) -> HTMLResponse:
        of = served.named(analysis)
        notice = await asyncio.to_thread(lambda: _notice(of.store, done, item))
        return await asyncio.to_thread(page, category, notice)

    async def decided_form(request: Request, analysis: Served, document_id: str) -> dict[str, Any]:
        form = dict(await request.form(max_files=0, max_fields=10))
        token = str(form.get("token", ""))
        if not token_valid(secret, analysis.name, document_id, token, time.time()):
            raise HTTPException(403, "this form is not from the review page: reload it")
        return form

    async def already(analysis: Served, document_id: str, *outcomes: ReviewStatus) -> bool:
        item = await asyncio.to_thread(lambda: analysis.store.reviews.get(document_id))
        return item is not None and item.status in outcomes

    @router.post("/review/{document_id}/approve")
    async def approve_item(
        request: Request, document_id: DocumentId, who: Operator, analysis: AnalysisName = None
    ) -> Response:
        of = served.named(analysis)
        form = await decided_form(request, of, document_id)
        choice = str(form.get("decision") or "")
        decision = {"accept_output": Decision.ACCEPT_OUTPUT, "retry": Decision.RETRY}.get(choice)
        by = f"{WEB_REVIEWER}{who}"
        try:
            await asyncio.to_thread(
                lambda: approve(of.store, document_id, decision=decision, by=by)
            )
        except (InputError, KeyError) as e:
            # The same decision sent twice (a second click, a retry through another process)
            # is the decision already taken.
            if await already(of, document_id, ReviewStatus.APPROVED, ReviewStatus.RESOLVED):
                return done("approved", of, document_id)
            return await asyncio.to_thread(page, None, None, _problem(e), 400)
        return done("approved", of, document_id)

    @router.post("/review/{document_id}/reject")
    async def reject_item(
        request: Request, document_id: DocumentId, who: Operator, analysis: AnalysisName = None
    ) -> Response:
        of = served.named(analysis)
        form = await decided_form(request, of, document_id)
        reason = str(form.get("reason") or "").strip()
        problem = None
        if not reason:
            problem = "a rejection needs a reason"
        elif len(reason) > REASON_MAX_CHARS:
            problem = f"a reason of at most {REASON_MAX_CHARS:,} characters, please"
        elif unstorable(reason):
            problem = f"the reason {unstorable(reason)}"
        if problem:
            return await asyncio.to_thread(page, None, None, problem, 400)
        by = f"{WEB_REVIEWER}{who}"
        try:
            await asyncio.to_thread(lambda: reject(of.store, document_id, reason=reason, by=by))
        except (InputError, KeyError) as e:
            if await already(of, document_id, ReviewStatus.REJECTED):
                return done("rejected", of, document_id)
            return await asyncio.to_thread(page, None, None, _problem(e), 400)
        return done("rejected", of, document_id)

    @router.get("/review/{document_id}/thumbnail.png")
    async def thumbnail(
        document_id: DocumentId, who: Operator, analysis: AnalysisName = None
    ) -> Response:
        store = await asyncio.to_thread(lambda: served.named(analysis).store)
        item = await asyncio.to_thread(store.reviews.get, document_id)
        png = None
        if item is not None:
            found = item
            png = await thumbnails.png(document_id, lambda: _original(store, found))
            if png is None and await asyncio.to_thread(_has_original, store, found):
                png = placeholder()  # the file changed or went since the page was drawn
        if png is None:
            raise HTTPException(404, f"no thumbnail for {document_id}")
        return Response(png, media_type="image/png", headers={"Cache-Control": "private"})

    return router


def _problem(error: Exception) -> str:
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def _notice(store: Store, outcome: str | None, document_id: str | None) -> str | None:
    """What the page says after a decision: one of a fixed set of sentences about the item the
    redirect names, filled in from the store (never text from the URL)."""
    if outcome not in ("approved", "rejected") or not document_id:
        return None
    if not re.fullmatch(DOCUMENT_ID_PATTERN, document_id):
        return None
    item = store.reviews.get(document_id)
    if item is None:
        return None
    if outcome == "approved" and item.status in (ReviewStatus.APPROVED, ReviewStatus.RESOLVED):
        decision = item.decision.value if item.decision else "retry"
        return f"approved {document_id} ({decision}): re-submitted under task {item.task_id}"
    if outcome == "rejected" and item.status == ReviewStatus.REJECTED:
        messages = store.reviews.messages(document_id)
        told = messages[-1].message_en if messages else "the standard message"
        return f"rejected {document_id}; the submitter was told: {told}"
    return None


def _category(value: str | None) -> Category | None:
    try:
        return Category(value) if value else None
    except ValueError:
        return None


def _row(
    analysis: Served, query: str, item: ReviewItem, secret: bytes, now: float
) -> dict[str, Any]:
    snapshot = item.snapshot
    return {
        "analysis": analysis.name,
        # What the item's URLs end with: its analysis, unless it is the default one.
        "query": query,
        "document_id": item.document_id,
        "task_id": item.task_id,
        "source": snapshot.source,
        "kind": snapshot.kind,
        "size_bytes": snapshot.size_bytes,
        "category": item.category.value,
        "error": item.error,
        "submitted": item.created_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "thumbnail": _has_original(analysis.store, item),
        "first_lines": "\n".join(snapshot.first_characters.splitlines()[:FIRST_LINES]),
        "model_layer": item.category in MODEL_LAYER,
        "token": form_token(secret, analysis.name, item.document_id, now),
        "open": item.status == ReviewStatus.OPEN,
    }


def _has_original(store: Store, item: ReviewItem) -> bool:
    """Whether the item may have a first page to show, without reading a PDF's bytes (the page
    lists every item; the thumbnail's own request reads and checks them)."""
    if item.snapshot.kind != "pdf":
        return False
    if item.snapshot.source.startswith(SUBMITTED):
        return store.tasks.has_original(item.document_id)
    return Path(item.snapshot.source).is_file()


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
