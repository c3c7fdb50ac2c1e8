"""A document's whole story, in time order, from one id.

Given a document id or any of its task ids, :func:`trace` gathers what the results database holds
of the document — its registration and every file name it arrived under, each LLM attempt with
its outcome, tokens (the cached prompt and reasoning tokens among them) and cost, every
classified failure (network → protocol → model → business →
runtime) with its run and attempt, the checkpoints (answers and notices stored), quarantined
outputs, people's decisions and the messages sent to submitters — and orders it by time. The
command line adds what Dagster holds (each run's status and the per-document check results).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ai_pipeline.errors import InputError
from ai_pipeline.store import Store
from ai_pipeline.store.rows import aware
from ai_pipeline.store.tables import checkpoints, document_sources
from ai_pipeline.tasks import document_of


def _event(at: datetime, kind: str, detail: str, **fields: Any) -> dict[str, Any]:
    return {"at": at.isoformat(), "kind": kind, "detail": detail, **fields}


def trace(store: Store, any_id: str) -> dict[str, Any]:
    """The story of the document ``any_id`` names (a document id or one of its task ids)."""
    document_id = document_of(any_id.strip())
    doc = store.documents.get(document_id)
    if doc is None:
        raise InputError(f"no document or task {any_id!r} in {store.db.url.split('://')[0]}")
    events: list[dict[str, Any]] = []

    sources = store.db.rows(
        sa.select(document_sources)
        .where(document_sources.c.document_id == document_id)
        .order_by(document_sources.c.first_seen_at, document_sources.c.source)
    )
    events.append(
        _event(doc.created_at, "registered", f"{doc.source} ({doc.kind}, {doc.size_bytes} bytes)")
    )
    for s in sources:
        if s.source != doc.source:
            events.append(_event(_aware(s.first_seen_at), "alias", f"also arrived as {s.source}"))
    if doc.rejected_reason:
        events.append(_event(doc.created_at, "unreadable", doc.rejected_reason))

    for a in store.spend.attempts([document_id]):
        tokens = a["prompt_tokens"] + a["completion_tokens"]
        events.append(
            _event(
                _aware(a["created_at"]),
                "llm_attempt",
                f"{a['outcome']}: {tokens} tokens ({_billed(a)}), ${a['cost_usd']:.6f}, "
                f"{a['model']}",
                task_id=a["task_id"],
                run_id=a["run_id"],
                outcome=a["outcome"],
                tokens=tokens,
                # As billed: cached of the prompt's, reasoning of the completion's (None: the
                # endpoint did not say).
                cached_tokens=a["cached_tokens"],
                reasoning_tokens=a["reasoning_tokens"],
                cost_usd=round(a["cost_usd"], 8),
            )
        )
    for f in store.events.failures(document_id):
        events.append(
            _event(
                f.at,
                "failure",
                f"{f.category.value} ({f.layer.value} layer), attempt {f.attempt}: {f.error}",
                task_id=f.task_id,
                run_id=f.run_id,
                category=f.category.value,
                layer=f.layer.value,
            )
        )
    stored = store.db.rows(
        sa.select(checkpoints.c.task_id, checkpoints.c.step, checkpoints.c.created_at)
        .where(checkpoints.c.document_id == document_id)
        .order_by(checkpoints.c.created_at)
    )
    for c in stored:
        what = "notice delivered" if c.step == "notify" else f"answer stored ({c.step})"
        events.append(_event(_aware(c.created_at), "checkpoint", what, task_id=c.task_id))
    for q in store.reviews.quarantined(document_id):
        events.append(_event(q.at, "quarantined", q.reason, task_id=q.task_id))
    item = store.reviews.get(document_id)
    if item is not None:
        events.append(
            _event(
                item.created_at,
                "review_opened",
                f"{item.category.value}: {item.error}",
                task_id=item.task_id,
                category=item.category.value,
            )
        )
    for h in store.events.history(document_id):
        events.append(_event(h.at, "decision", f"{h.event}: {h.detail or ''}", task_id=h.task_id))
    for m in store.reviews.messages(document_id):
        events.append(_event(m.at, "message", f"to the submitter: {m.message_en}"))

    events.sort(key=lambda e: e["at"])
    spent = store.spend.total([document_id])
    return {
        "document_id": document_id,
        "asked_for": any_id,
        "source": doc.source,
        "sources": [s.source for s in sources] or [doc.source],
        "state": doc.state.value,
        "category": doc.category.value if doc.category else None,
        "error": doc.last_error,
        "task_id": doc.task_id,
        "attempts": doc.attempts,
        "spend": spent.as_dict(),
        "runs": _unique(e.get("run_id") for e in events),
        "events": events,
    }


def _billed(attempt: dict[str, Any]) -> str:
    """ "2006 prompt, 1920 of them cached + 700 completion, 512 of them reasoning"."""
    prompt = f"{attempt['prompt_tokens']} prompt"
    if attempt["cached_tokens"]:
        prompt += f", {attempt['cached_tokens']} of them cached"
    completion = f"{attempt['completion_tokens']} completion"
    if attempt["reasoning_tokens"]:
        completion += f", {attempt['reasoning_tokens']} of them reasoning"
    return f"{prompt} + {completion}"


def _aware(at: datetime) -> datetime:
    return aware(at)


def _unique(values: Iterable[str | None]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))
