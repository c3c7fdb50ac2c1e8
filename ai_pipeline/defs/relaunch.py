"""What the command line launches as backfills: the failed documents a rerun can fix, the stale
analyses, and named batches (``submit``), each a Dagster backfill the daemon runs, through a
``Launcher`` (its instance, code location and analysis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from ai_pipeline.defs.backfills import (
    active_backfill,
    launch_backfill,
    plan_failed_backfill,
    settled_once_runs_end,
)
from ai_pipeline.defs.launch import Launcher, failure_of
from ai_pipeline.documents import display_path
from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category
from ai_pipeline.intake import BATCH_TAG, batch_key
from ai_pipeline.reporting import current_task_suffix, current_versions, status_report, stop_reason
from ai_pipeline.spend import BUDGET_TAG, Budget, batch_budget_key
from ai_pipeline.states import State


def backfill_failed(
    launcher: Launcher,
    *,
    categories: Iterable[Category] | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
    wait: bool = False,
    timeout: float = 1800,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Plan (and unless ``dry_run`` launch) a backfill of the failed documents a rerun can fix.
    With a budget, all the backfill's runs share it, and BUDGET_REACHED documents can be
    selected (by category): without one they stay held."""
    categories = list(categories or [])
    plan = plan_failed_backfill(
        launcher.instance,
        launcher.store,
        categories=categories,
        since=since,
        budgeted=budget is not None,
        site=launcher.site,
    )
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "selected": [c.as_dict() for c in plan.selected],
        "skipped": [c.as_dict() for c in plan.skipped],
        "backfill_id": None,
        "budget": None,
    }
    if dry_run or not plan.selected:
        return out
    names = ", ".join(c.value for c in categories)
    title = "failed documents" + (f" ({names})" if categories else "")
    tags = {}
    if budget is not None:
        key = f"launch:{uuid.uuid4().hex}"
        out["budget"] = launcher.store.spend.set_budget(
            key, tokens=budget.tokens, usd=budget.usd
        ).as_dict()
        tags[BUDGET_TAG] = key
    out["backfill_id"] = launch_backfill(
        launcher.instance,
        launcher.asset_graph,
        plan.document_ids,
        title=title,
        tags=tags,
        site=launcher.site,
    )
    if wait:
        out["status"] = launcher.wait(out["backfill_id"], plan.document_ids, timeout)
        out.update(status_report(launcher.store, plan.document_ids))
    return out


def backfill_stale(
    launcher: Launcher, *, dry_run: bool = False, wait: bool = False, timeout: float = 1800
) -> dict[str, Any]:
    """Plan (and unless ``dry_run`` launch) a backfill of the completed documents whose
    analysis was made under another prompt version or model: their new task ids make new
    calls, and the analyses they replace stay in the results history."""
    store = launcher.store
    version, model = current_versions(launcher.settings, store.analysis)
    stale = store.results.stale(current_task_suffix(launcher.settings, store.analysis))
    docs = {d.document_id: d for d in launcher.store.documents.rows(r.document_id for r in stale)}
    selected = [
        {
            "document_id": r.document_id,
            "source": docs[r.document_id].source,
            "category": None,
            "prompt_version": r.prompt_version,
            "model": r.model,
        }
        for r in stale
        if r.document_id in docs and docs[r.document_id].state == State.COMPLETED
    ]
    ids: list[str] = [str(d["document_id"]) for d in selected]
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "current": {"prompt_version": version, "model": model},
        "selected": selected,
        "skipped": [],
        "backfill_id": None,
    }
    if dry_run or not ids:
        return out
    out["backfill_id"] = launch_backfill(
        launcher.instance,
        launcher.asset_graph,
        ids,
        title=f"stale analyses (now prompt {version}, model {model})",
        site=launcher.site,
    )
    if wait:
        out["status"] = launcher.wait(out["backfill_id"], ids, timeout)
        out.update(status_report(launcher.store, ids))
    return out


def submit_batch(
    launcher: Launcher,
    inbox: Path,
    name: str,
    *,
    wait: bool = False,
    timeout: float = 1800,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Register a folder as a named batch and launch a backfill for what is pending. A budget
    is the batch's: every run of it, at once or later, shares it; given again, it replaces
    the limits (what was spent stays spent)."""
    document_ids = launcher.register_inbox(inbox).document_ids
    if not document_ids:
        raise InputError(f"{display_path(inbox)} holds no files")
    batch_id = batch_key(document_ids)
    launcher.store.batches.save(batch_id, name, document_ids)
    if budget is not None:
        launcher.store.spend.set_budget(
            batch_budget_key(batch_id), tokens=budget.tokens, usd=budget.usd
        )
    pending = launcher.not_done(document_ids)
    out: dict[str, Any] = {
        "pending_at_submit": len(pending),
        "backfill_id": None,
        "already_running": False,
    }
    running = (
        active_backfill(
            launcher.instance, BATCH_TAG, batch_id, analysis=launcher.settings.declaration.name
        )
        if pending
        else None
    )
    if running and settled_once_runs_end(
        launcher.instance, running, lambda runs: launcher.store.documents.ended_in(pending, runs)
    ):
        # Its runs are over and ended every document still pending (a `--wait` may have
        # returned on that already, before they closed): only the daemon's record says
        # running. A new backfill, for what those runs left pending.
        running = None
        pending = launcher.not_done(document_ids)
        out["pending_at_submit"] = len(pending)
    if running:
        # The batch's backfill is still queued or running: it covers these documents.
        out.update(backfill_id=running, already_running=True)
        launcher.progress(
            f"batch {name}: backfill {running} is still queued or running; nothing new launched"
        )
    elif pending:
        out["backfill_id"] = launch_backfill(
            launcher.instance,
            launcher.asset_graph,
            pending,
            title=f"batch {name}",
            tags={BATCH_TAG: batch_id},
            site=launcher.site,
        )
    if wait and out["backfill_id"]:
        # A backfill found running covers the batch's pending documents as they were then.
        targeted = None if out["already_running"] else pending
        out["status"] = launcher.wait(out["backfill_id"], document_ids, timeout, targeted)
    out.update(batch_summary(launcher, batch_id))
    return out


def batch_summary(launcher: Launcher, batch_id: str) -> dict[str, Any]:
    """total / succeeded / failed / pending of a batch, and why each failed."""
    batch = launcher.store.batches.get(batch_id)
    if batch is None:
        raise InputError(f"no batch {batch_id}")
    ids = batch.document_ids
    docs = {d.document_id: d for d in launcher.store.documents.rows(ids)}
    budget = launcher.store.spend.budget(batch_budget_key(batch_id))
    failed = [d for d in ids if docs[d].state in (State.FAILED, State.DEAD_LETTER)]
    succeeded = [d for d in ids if docs[d].state == State.COMPLETED]
    return {
        "batch_id": batch_id,
        "name": batch.name,
        "total": len(ids),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "pending": len(ids) - len(succeeded) - len(failed),
        "failed_ids": failed,
        "failures": {d: failure_of(docs[d]) for d in failed},
        "stopped": stop_reason(docs.values()),
        "spend": launcher.store.spend.total(ids).as_dict(),
        "budget": budget.as_dict() if budget else None,
    }
