"""What the command line launches as backfills: the failed documents a rerun can fix, the stale
analyses, and named batches (``submit``), each a Dagster backfill the daemon runs, through a
``Launcher`` (its instance, code location and analysis).

Each can go ``via`` OpenAI's Batch API instead (``BATCH_API``): the same documents are handed to
Batch API jobs (``ai_pipeline.openai_batch``), which the analysis's ``openai_batch_sensor``
follows and whose answered documents it runs (no call); what cannot go in a job (cut into
sections, given up on, answered already) still goes in an ordinary backfill."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ai_pipeline.defs.acceleration import backfill_acceleration
from ai_pipeline.defs.backfills import plan_failed_backfill
from ai_pipeline.defs.chunks import (
    Chunk,
    Launched,
    batch_backfill_list,
    documents_per_backfill,
    launch_chunks,
    plan_batch,
    split,
)
from ai_pipeline.defs.launch import Launcher, failure_of
from ai_pipeline.documents import display_path
from ai_pipeline.errors import InputError
from ai_pipeline.failures import Category
from ai_pipeline.intake import BATCH_TAG, batch_key
from ai_pipeline.openai_batch.jobs import BatchJobs
from ai_pipeline.openai_batch.operations import batch_client
from ai_pipeline.openai_batch.operations import submit as submit_to_batch_api
from ai_pipeline.reporting import current_task_suffix, current_versions, status_report, stop_reason
from ai_pipeline.spend import BUDGET_TAG, Budget, Prices, batch_budget_key
from ai_pipeline.states import State
from ai_pipeline.tasks import ANALYSE_STEP, task_id

# How a launch's documents are analysed: synchronous calls in a backfill's runs, or OpenAI's
# Batch API (half the price, answers within 24 hours).
SYNC = "sync"
BATCH_API = "batch"
VIA = (SYNC, BATCH_API)


def backfill_failed(
    launcher: Launcher,
    *,
    categories: Iterable[Category] | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
    wait: bool = False,
    timeout: float = 1800,
    budget: Budget | None = None,
    via: str = SYNC,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Plan (and unless ``dry_run`` launch) a backfill of the failed documents a rerun can fix.
    With a budget, all the backfill's runs share it, and BUDGET_REACHED documents can be
    selected (by category): without one they stay held. ``via`` BATCH_API: the documents go
    in Batch API jobs (``api_key``: the endpoint's), the budget reserved at the batch price."""
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
        "backfill_ids": [],
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
    launched = _launch(
        launcher, out, plan.document_ids, title=title, tags=tags, via=via, api_key=api_key
    )
    if wait:
        _wait(launcher, out, launched, plan.document_ids, timeout)
        out.update(status_report(launcher.store, plan.document_ids))
    return out


def backfill_stale(
    launcher: Launcher,
    *,
    dry_run: bool = False,
    wait: bool = False,
    timeout: float = 1800,
    via: str = SYNC,
    api_key: str | None = None,
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
        "backfill_ids": [],
    }
    if dry_run or not ids:
        return out
    title = f"stale analyses (now prompt {version}, model {model})"
    launched = _launch(launcher, out, ids, title=title, tags={}, via=via, api_key=api_key)
    if wait:
        _wait(launcher, out, launched, ids, timeout)
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
    via: str = SYNC,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Register a folder as a named batch and launch a backfill for what is pending (``via``
    BATCH_API: Batch API jobs). A budget is the batch's: every run of it, at once or later,
    shares it; given again, it replaces the limits (what was spent stays spent)."""
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
    documents = launcher.store.documents
    plan = plan_batch(
        launcher.instance,
        batch_id,
        document_ids,
        pending,
        most=documents_per_backfill(launcher.settings),
        ended_in=documents.ended_in,
        not_done=launcher.not_done,
        site=launcher.site,
    )
    waiting = set(pending)
    out: dict[str, Any] = {
        # What is launched now, and what the backfills found running hold.
        "pending_at_submit": len(plan.pending)
        + sum(1 for b in plan.running for d in b.chunk.document_ids if d in waiting),
        "already_running": bool(plan.running) and not plan.to_launch,
    }
    for b in plan.running:
        # The part's backfill is still queued or running: it covers its documents.
        launcher.progress(
            f"batch {name}: backfill {b.backfill_id} (part {b.chunk.label}) is still queued or "
            "running; nothing new launched for it"
        )
    launched = _launch(
        launcher,
        out,
        plan.pending,
        title=f"batch {name}",
        tags={BATCH_TAG: batch_id},
        via=via,
        api_key=api_key,
        budget_keys=[batch_budget_key(batch_id)] if budget is not None else [],
        parts=list(zip(plan.to_launch, plan.ids, strict=True)),
        running=plan.running,
    )
    if wait:
        _wait(launcher, out, launched, plan.pending, timeout, shown=document_ids)
    out.update(batch_summary(launcher, batch_id))
    return out


def batch_report(launcher: Launcher, batch_id: str) -> dict[str, Any]:
    """``batch_summary``, and every backfill of the batch (``batch_backfill_list``)."""
    summary = batch_summary(launcher, batch_id)
    return {**summary, "backfills": batch_backfill_list(launcher.instance, batch_id)}


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


def _launch(
    launcher: Launcher,
    out: dict[str, Any],
    document_ids: Sequence[str],
    *,
    title: str,
    tags: Mapping[str, str],
    via: str,
    api_key: str | None,
    budget_keys: Sequence[str] = (),
    parts: Sequence[tuple[Chunk, str]] = (),
    running: Sequence[Launched] = (),
) -> list[Launched]:
    """Launch these documents' analysis: backfills (SYNC) of at most ``documents_per_backfill``
    each (``parts``: those chunks, with their ids), or (BATCH_API) Batch API jobs and backfills
    of what cannot go in one. Records in ``out`` the backfills (``_named``; ``running``: those a
    batch's parts already have, first) and, by batch, ``batch_api``: what was sent
    (``ai_pipeline.openai_batch.operations.submit``). Returns the backfills."""
    if via not in VIA:
        raise InputError(f"via {via!r}: one of {', '.join(VIA)}")

    def backfills(ids: Sequence[str], title: str) -> list[Launched]:
        chunks = split(ids, documents_per_backfill(launcher.settings))
        return _backfills(launcher, chunks, [None] * len(chunks), title, tags)

    launched: list[Launched] = list(running)
    if not document_ids:
        pass
    elif via == SYNC and parts:
        chunks, ids = zip(*parts, strict=True)
        launched += _backfills(launcher, chunks, ids, title, tags)
    elif via == SYNC:
        launched += backfills(document_ids, title)
    else:
        out["batch_api"] = sent = _send_to_batch_api(
            launcher, document_ids, api_key, tags, budget_keys
        )
        rest = [d for d in document_ids if d in set(sent["left_to_sync"])]
        launched += backfills(rest, f"{title} (not by batch)")
    out.update(_named(launched))
    return launched


def _backfills(
    launcher: Launcher,
    chunks: Sequence[Chunk],
    ids: Sequence[str | None],
    title: str,
    tags: Mapping[str, str],
) -> list[Launched]:
    launched = launch_chunks(
        launcher.instance,
        launcher.asset_graph,
        chunks,
        title=title,
        tags=tags,
        ids=ids,
        site=launcher.site,
    )
    if len(launched) > 1:
        launcher.progress(
            f"{sum(len(c.document_ids) for c in chunks)} documents in {len(launched)} backfills "
            f"of at most {max(len(c.document_ids) for c in chunks)}: "
            + ", ".join(b.backfill_id for b in launched)
        )
    acceleration = backfill_acceleration(launcher.instance)
    if acceleration is None:
        launcher.progress("the daemon plans and starts their runs on its next loop (up to 30 s)")
        return launched
    started = acceleration.start_planned_runs(
        launcher.instance, [b.backfill_id for b in launched], launcher.site
    )
    if started:
        launcher.progress(f"{started} runs submitted to the run queue")
    return launched


def _named(launched: Sequence[Launched]) -> dict[str, Any]:
    """What a launch reports of its backfills: ``backfill_id`` (the first, None: no backfill),
    ``backfill_ids`` (all of them, part by part) and ``backfills`` (each one's part, documents,
    and whether it was launched now or found still queued or running)."""
    ids = [b.backfill_id for b in launched]
    return {
        "backfill_id": ids[0] if ids else None,
        "backfill_ids": ids,
        "backfills": [b.as_dict() for b in launched],
    }


def _send_to_batch_api(
    launcher: Launcher,
    document_ids: Sequence[str],
    api_key: str | None,
    tags: Mapping[str, str],
    budget_keys: Sequence[str],
) -> dict[str, Any]:
    """Hand these documents to Batch API jobs, under the launch's budgets."""
    if not api_key:
        raise InputError("the Batch API needs the endpoint's key: OPENAI_API_KEY is not set")
    settings = launcher.settings
    jobs = BatchJobs(
        launcher.store,
        batch_client(settings, api_key),
        Prices.of(settings),
        section_chars=settings.section_chars,
    )
    keys = [*budget_keys, *([tags[BUDGET_TAG]] if BUDGET_TAG in tags else [])]
    sent_at = datetime.now(timezone.utc)
    sent = submit_to_batch_api(jobs, settings.analysis_model, document_ids, budget_keys=keys)
    launcher.progress(
        f"{sent['tasks']} documents sent in {len(sent['jobs'])} Batch API jobs "
        f"({sent['in_open_jobs']} in open jobs already); its sensor runs them when answered"
    )
    sent["sent_at"] = sent_at.isoformat()
    return dict(sent)


def _wait(
    launcher: Launcher,
    out: dict[str, Any],
    launched: Sequence[Launched],
    document_ids: Sequence[str],
    timeout: float,
    *,
    shown: Sequence[str] | None = None,
) -> None:
    """Wait for a launch — each of its backfills in turn, within one ``timeout``, showing the
    progress of ``shown`` (default: ``document_ids``), or (by batch) until its documents
    settle — and record in ``out`` the ``status`` it ended in: the one all its backfills ended
    in, else the first other than COMPLETED_SUCCESS (and each one's in ``statuses``)."""
    if "batch_api" in out:
        sent = out["batch_api"]
        since = datetime.fromisoformat(sent["sent_at"]).timestamp()
        documents = [*sent["documents_in_jobs"], *sent["left_to_sync"]]
        out["status"] = wait_for_batch_api(launcher, documents, timeout, since=since)
        return
    if not launched:
        return
    deadline = time.monotonic() + timeout
    statuses = {
        b.backfill_id: launcher.wait(
            b.backfill_id,
            shown if shown is not None else document_ids,
            max(0.0, deadline - time.monotonic()),
            b.chunk.document_ids,
        )
        for b in launched
    }
    out["statuses"] = statuses
    out["status"] = next(
        (s for s in statuses.values() if s != "COMPLETED_SUCCESS"), "COMPLETED_SUCCESS"
    )


# Where a document handed to the Batch API may stand while it waits for its job and its run.
_UNSETTLED = (State.PENDING, State.QUEUED, State.RUNNING)


def wait_for_batch_api(
    launcher: Launcher,
    document_ids: Sequence[str],
    timeout: float,
    *,
    since: float,
    poll: float = 2.0,
) -> str:
    """Wait until these documents have settled after their Batch API jobs (followed by the
    daemon's ``openai_batch_sensor``) and the runs it launched: no task of theirs in an open
    job, none pending, queued or running, each completed one with a result of the current
    analysis, and each other one changed since ``since`` (when they were sent: a failed one is
    not settled by what it was before). COMPLETED when every one
    completed, else FAILED; raises TimeoutError."""
    store = launcher.store
    started = time.time()
    tag = store.analysis.tag()
    suffix = current_task_suffix(launcher.settings, store.analysis)
    tasks = {
        task_id(d, ANALYSE_STEP, tag, launcher.settings.analysis_model): d for d in document_ids
    }
    launcher.progress(
        f"waiting for {len(document_ids)} documents in the Batch API (the daemon's "
        "openai_batch_sensor follows their jobs and runs them) …"
    )
    while True:
        waiting = store.openai_batches.open_jobs_of(tasks)
        rows = store.documents.rows(document_ids)
        current = {
            r.document_id
            for r in store.results.get(document_ids)
            if r.task_id == r.document_id + suffix
        }
        unsettled = [
            r
            for r in rows
            if r.state in _UNSETTLED
            or (r.state == State.COMPLETED and r.document_id not in current)
            or (r.state != State.COMPLETED and r.updated_at.timestamp() < since)
        ]
        if not waiting and not unsettled:
            done = all(r.state == State.COMPLETED for r in rows)
            return "COMPLETED" if done else "FAILED"
        if time.time() - started > timeout:
            raise TimeoutError(
                f"{len(waiting)} documents still in Batch API jobs and {len(unsettled)} not "
                f"settled after {timeout:g} s"
            )
        time.sleep(poll)
