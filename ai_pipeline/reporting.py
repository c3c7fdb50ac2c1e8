"""What the pipeline can say about its documents: the status report and the failure report.

- ``status_report``: every document (or some) with its state, category, attempts, error and
  summary, the counts by state and category, and why a run stopped before them (``stop_reason``) (``ai-pipeline status``, and the outcome that
  ``run``, ``demo`` and the ``--wait`` commands print).
- ``build_report``: the failure report — counts by state and category, failures by day, success
  rate, tokens and estimated cost — built with pandas from the results (the rows the results IO
  manager loads) and the store's documents and failure events. ``to_markdown`` and ``chart_png``
  render it for the Dagster UI; ``ai-pipeline report`` prints the same data.

Both return plain data (JSON-ready dicts), so every way of showing them shows the same thing.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ai_pipeline.declaration import Declaration
from ai_pipeline.settings import Settings
from ai_pipeline.spend import Prices
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import BatchJob
from ai_pipeline.store.rows import DocumentRow, ResultRow
from ai_pipeline.tasks import ANALYSE_STEP, task_suffix

if TYPE_CHECKING:
    import pandas as pd


def status_report(
    store: Store,
    document_ids: Sequence[str] | None = None,
    *,
    states: Iterable[State] | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """These documents with their state and outcome, and their counts.

    Without ``document_ids`` the counts are of every document (one grouped query) and the
    documents listed are those in ``states`` (every state: None), the most recently changed
    first, at most ``limit``; ``omitted`` says how many more there are.
    """
    if document_ids is not None:
        docs = store.documents.rows(document_ids)
    else:
        docs = store.documents.listing(states, None if limit is None else limit)
    ids = [d.document_id for d in docs]
    sources = store.documents.sources(ids)
    results = {r.document_id: r for r in store.results.get(ids)}
    current = current_task_suffix(analysis=store.analysis)
    headline = store.analysis.summary_field
    rows = [_status_row(d, sources, results.get(d.document_id), current, headline) for d in docs]
    waiting = store.openai_batches.waiting(ids)
    for row in rows:
        job = waiting.get(row["document_id"])
        row["batch_api"] = batch_api_wait(job) if job is not None else None
    if document_ids is not None:
        by_state = dict(sorted(Counter(r["state"] for r in rows).items()))
        by_category = dict(
            sorted(
                Counter(
                    r["category"]
                    for r in rows
                    if r["category"] and r["state"] != State.COMPLETED.value
                ).items()
            )
        )
    else:
        by_state, by_category = store.documents.summary()
    total = sum(by_state.values())
    if document_ids is None:
        wanted = {s.value for s in states} if states is not None else set(by_state)
        in_states = sum(n for s, n in by_state.items() if s in wanted)
        omitted = in_states - len(rows)
    else:
        omitted = 0
    if document_ids is not None:
        stale = sum(1 for r in rows if r["stale"])
    else:
        stale = sum(store.results.count_stale(current).values())
    return {
        "documents": rows,
        "omitted": omitted,
        # Why a run stopped before these documents, when its settings were wrong (else None).
        "stopped": stop_reason(docs),
        "counts": {
            "total": total,
            "by_state": by_state,
            "by_category": by_category,
            "stale": stale,
        },
        # Of the documents listed: those waiting for an answer in an open Batch API job.
        "in_batch_api": len(waiting),
    }


def batch_api_wait(job: BatchJob) -> dict[str, Any]:
    """The open Batch API job a document waits in, as status and trace show it."""
    return {
        "intent_id": job.intent_id,
        "batch_id": job.batch_id,
        "status": job.status.value,
        "remote_status": job.remote_status,
        "request_counts": {
            "total": job.request_total,
            "completed": job.request_completed,
            "failed": job.request_failed,
        },
    }


def describe_batch_api_wait(wait: dict[str, Any]) -> str:
    """``waiting in Batch API job I (batch B in_progress, 3/10 done, 1 failed)``."""
    counts = wait["request_counts"]
    if wait["batch_id"] is None:
        where = "not sent yet"
    else:
        where = f"batch {wait['batch_id']} {wait['remote_status']}"
        if counts["total"] is not None:
            where += f", {counts['completed'] or 0}/{counts['total']} done"
        if counts["failed"]:
            where += f", {counts['failed']} failed"
    return f"waiting in Batch API job {wait['intent_id']} ({where})"


def stop_reason(docs: Iterable[DocumentRow]) -> str | None:
    """The message of the latest run stop (a CONFIGURATION fault) among these documents, when one
    of them is still waiting because of it; None when none is."""
    held = [
        d
        for d in docs
        if d.category is not None and d.category.stops_run and d.state == State.QUEUED
    ]
    latest = max(held, key=lambda d: d.updated_at, default=None)
    return latest.last_error if latest is not None else None


def current_versions(
    settings: Settings | None = None, analysis: Declaration | None = None
) -> tuple[str, str]:
    """The prompt version and model new analyses of ``analysis`` (else the settings' analysis)
    are made under; results made under others are stale (``backfill --stale`` makes them
    again). The analysis's declaration names its model, else the settings do."""
    settings = settings or Settings.load()
    declaration = analysis or settings.declaration
    return declaration.tag(), declaration.model.name or settings.model


def current_task_suffix(
    settings: Settings | None = None, analysis: Declaration | None = None
) -> str:
    """What follows the document id in the task id of a current analysis: a result whose task id
    is another is stale, whatever name the endpoint served its model under."""
    return task_suffix(ANALYSE_STEP, *current_versions(settings, analysis))


def _status_row(
    d: DocumentRow,
    sources: dict[str, list[str]],
    result: ResultRow | None,
    current: str,
    headline: str | None,
) -> dict[str, Any]:
    return {
        "document_id": d.document_id,
        "source": d.source,
        "sources": sources.get(d.document_id, [d.source]),
        "state": d.state.value,
        "category": d.category.value if d.category else None,
        "attempts": d.attempts,
        "run_id": d.run_id,
        "error": d.last_error if d.state != State.COMPLETED else None,
        "status_message": d.status_message,
        "rejected_by_reviewer": d.rejected_by_reviewer,
        # The analysis's short text (its summary field), and its whole output.
        "summary": result.output.get(headline) if result and headline else None,
        "output": result.output if result else None,
        "stale": result is not None and result.task_id != d.document_id + current,
        "updated_at": d.updated_at.isoformat(),
    }


def build_report(
    store: Store, results: pd.DataFrame | None = None, settings: Settings | None = None
) -> dict[str, Any]:
    """Counts by state and category, failures by day, success rate, tokens and estimated cost."""
    import pandas as pd  # here, not at import: a third of a second no other command needs

    settings = settings or Settings.load()
    docs = pd.DataFrame(
        [
            {
                "document_id": d.document_id,
                "source": d.source,
                "state": d.state.value,
                "category": d.category.value if d.category else None,
                "last_error": d.last_error,
            }
            for d in store.documents.rows()
        ]
    )
    events = pd.DataFrame(
        [{"at": e.at, "category": e.category.value} for e in store.events.failures()]
    )
    if results is None:
        results = pd.DataFrame([r.as_record() for r in store.results.get()])
    total = len(docs)
    by_state = docs["state"].value_counts().sort_index().to_dict() if total else {}
    failed = docs[docs["state"] != "COMPLETED"] if total else docs
    by_category = failed["category"].dropna().value_counts().sort_index().to_dict() if total else {}
    if len(events):
        events["day"] = pd.to_datetime(events["at"], utc=True).dt.strftime("%Y-%m-%d")
        by_day = events.groupby(["day", "category"]).size().unstack(fill_value=0).sort_index()
        failures_by_day = {
            day: {k: int(v) for k, v in row.items() if v} for day, row in by_day.iterrows()
        }
    else:
        failures_by_day = {}
    completed = int(by_state.get("COMPLETED", 0))
    prompt_tokens = int(results["prompt_tokens"].fillna(0).sum()) if len(results) else 0
    completion_tokens = int(results["completion_tokens"].fillna(0).sum()) if len(results) else 0
    cost = (
        prompt_tokens / 1000 * settings.price_per_1k_prompt_tokens
        + completion_tokens / 1000 * settings.price_per_1k_completion_tokens
    )
    return {
        "documents": total,
        "by_state": {k: int(v) for k, v in by_state.items()},
        "by_category": {k: int(v) for k, v in by_category.items()},
        "failures_by_day": failures_by_day,
        "failure_events": len(events),
        "success_rate": round(completed / total, 4) if total else None,
        "results_rows": len(results),
        "tokens": {"prompt": prompt_tokens, "completion": completion_tokens},
        "estimated_cost_usd": round(cost, 6),
        "spend": spend_report(store, prices=Prices.of(settings)),
        "stale": store.results.count_stale(current_task_suffix(settings, store.analysis)),
        "failed_documents": [
            {
                "document_id": r["document_id"],
                "source": r["source"],
                "state": r["state"],
                "category": r["category"],
                "error": r["last_error"],
            }
            for r in failed.to_dict("records")
        ]
        if total
        else [],
    }


def spend_report(
    store: Store, batches: int = 20, *, prices: Prices | None = None
) -> dict[str, Any]:
    """What every LLM attempt cost (failed and repeated ones included, from the usage of each
    reply, as billed: the cached prompt tokens and the reasoning tokens among its tokens): in all,
    by the failure category of the documents not completed, the re-analyses, per batch (the
    newest ``batches``), and (with ``prices``) what the Batch API lines saved."""
    out = {
        "total": store.spend.total().as_dict(),
        "failures_by_category": {
            k: v.as_dict() for k, v in sorted(store.spend.by_category().items())
        },
        "reanalyses": store.spend.reanalyses().as_dict(),
        "by_batch": {
            b.batch_id: {
                "name": b.name,
                "documents": len(b.document_ids),
                **store.spend.total(b.document_ids).as_dict(),
            }
            for b in store.batches.newest(batches)
        },
    }
    if prices is not None:
        out["batch_api"] = batch_api_savings(store, prices)
    return out


def batch_api_savings(store: Store, prices: Prices) -> dict[str, Any]:
    """The Batch API lines' spend, what the same tokens cost by synchronous calls, and the
    difference (the price table's prices; cached prompt tokens as billed)."""
    by_model = store.spend.by_batch_api()
    spent = sum(t.cost_usd for t in by_model.values())
    sync = sum(
        prices.cost(m, t.prompt_tokens, t.completion_tokens, t.cached_tokens)
        for m, t in by_model.items()
    )
    return {
        "lines": sum(t.attempts for t in by_model.values()),
        "tokens": sum(t.prompt_tokens + t.completion_tokens for t in by_model.values()),
        "cost_usd": round(spent, 6),
        "at_sync_price_usd": round(sync, 6),
        "saved_usd": round(sync - spent, 6),
    }


def _table(title: str, counts: dict[str, int]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in counts.items()) or "| (none) | 0 |"
    return f"| {title} | documents |\n|---|---|\n{rows}\n"


def to_markdown(report: dict[str, Any]) -> str:
    rate = report["success_rate"]
    lines = [
        f"**{report['documents']} documents**, success rate "
        f"{'n/a' if rate is None else f'{rate:.1%}'}, {report['results_rows']} result rows, "
        f"{report['tokens']['prompt'] + report['tokens']['completion']} tokens "
        f"(≈ ${report['estimated_cost_usd']:.4f})",
        "",
        _table("state", report["by_state"]),
        _table("failure category", report["by_category"]),
    ]
    if report.get("stale"):
        stale = ", ".join(f"{n} under {shape}" for shape, n in report["stale"].items())
        lines.append(f"**stale analyses** (another prompt version or model): {stale}")
        lines.append("")
    spend = report.get("spend")
    if spend:
        total = spend["total"]
        lines.append(
            f"**spent** ${total['cost_usd']:.4f} over {total['attempts']} LLM attempts "
            f"({total['prompt_tokens'] + total['completion_tokens']} tokens: "
            f"{total['prompt_tokens']} prompt, {total['cached_tokens']} of them cached; "
            f"{total['completion_tokens']} completion, {total['reasoning_tokens']} of them "
            f"reasoning); re-analyses ${spend['reanalyses']['cost_usd']:.4f}"
        )
        lines.append("")
        batch_api = spend.get("batch_api")
        if batch_api and batch_api["lines"]:
            lines.append(
                f"**Batch API** {batch_api['lines']} lines, ${batch_api['cost_usd']:.4f} "
                f"(${batch_api['at_sync_price_usd']:.4f} by synchronous calls): "
                f"saved ${batch_api['saved_usd']:.4f}"
            )
            lines.append("")
        lines.append("| failure category | attempts | tokens | cost (USD) |\n|---|---|---|---|")
        for category, t in spend["failures_by_category"].items():
            tokens = t["prompt_tokens"] + t["completion_tokens"]
            lines.append(f"| {category} | {t['attempts']} | {tokens} | {t['cost_usd']:.4f} |")
        lines.append("")
        if spend.get("by_batch"):
            lines.append(
                "| batch | documents | attempts | tokens | cost (USD) |\n|---|---|---|---|---|"
            )
            for batch_id, t in spend["by_batch"].items():
                tokens = t["prompt_tokens"] + t["completion_tokens"]
                lines.append(
                    f"| {t['name']} ({batch_id}) | {t['documents']} | {t['attempts']} | "
                    f"{tokens} | {t['cost_usd']:.4f} |"
                )
            lines.append("")
    if report["failures_by_day"]:
        categories = sorted({c for day in report["failures_by_day"].values() for c in day})
        lines.append("| day | " + " | ".join(categories) + " |")
        lines.append("|---|" + "---|" * len(categories))
        for day, counts in report["failures_by_day"].items():
            lines.append(
                f"| {day} | " + " | ".join(str(counts.get(c, 0)) for c in categories) + " |"
            )
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend (nothing is displayed here); imported when a
    chart is drawn, not with this module."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_of(fig: Any) -> bytes:
    """A drawn figure as PNG bytes; the figure is closed."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    pyplot().close(fig)
    return buffer.getvalue()


def chart_png(report: dict[str, Any]) -> bytes:
    """A bar chart of documents by state and failures by category, as PNG bytes."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(9, 3.2))
    for ax, counts, title in (
        (left, report["by_state"], "documents by state"),
        (right, report["by_category"], "failed documents by category"),
    ):
        names = list(counts) or ["(none)"]
        values = list(counts.values()) or [0]
        ax.barh(names, values, color="#4f6bed" if ax is left else "#e8684a")
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)
    return png_of(fig)
