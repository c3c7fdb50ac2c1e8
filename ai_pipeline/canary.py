"""A canary of the analysis as it is declared now, before its stale backfill is paid for.

A deterministic sample of the documents whose results are stale is analysed under the current
version's task ids — checkpoints, so the later ``backfill --stale`` reuses them and a second
canary of the same seed costs nothing — and compared field by field with the results they would
replace; the whole backfill is priced from the sample. Results, states and Dagster are untouched.

The rule: a canary call goes through the same claim and checkpoint as a run's, never around them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ai_pipeline.calls import AnalysisCalls
from ai_pipeline.claims import Claims, owner_id
from ai_pipeline.errors import InputError
from ai_pipeline.failures import ClassifiedError
from ai_pipeline.llm import LLMClient
from ai_pipeline.reporting import current_task_suffix, png_of, pyplot
from ai_pipeline.settings import Settings
from ai_pipeline.spend import Prices
from ai_pipeline.states import State
from ai_pipeline.store import Store
from ai_pipeline.store.database import redact_url
from ai_pipeline.store.rows import DocumentRow, ResultRow
from ai_pipeline.tasks import TaskLog

CANARY_STEP = "canary"
EXAMPLES = 3
logger = logging.getLogger("ai_pipeline.canary")


class CanaryError(InputError):
    """Nothing to compare: no completed documents, or none made by another version."""


@dataclass(frozen=True)
class Trial:
    """One sampled document under the current version."""

    document_id: str
    source: str
    old: dict[str, Any]
    new: dict[str, Any] | None
    failure: str | None  # the category its checks or its call failed with
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    from_checkpoint: bool
    # A sectioned document's per-section outputs, before and now ({"index", "title", "output"}).
    old_sections: list[dict[str, Any]] | None = None
    new_sections: list[dict[str, Any]] | None = None


def summary_key(current_suffix: str) -> str:
    """Where the last canary of a version is kept (a checkpoint row of its own)."""
    return f"{CANARY_STEP}{current_suffix}"


def stale_completed(store: Store, current_suffix: str) -> list[tuple[ResultRow, DocumentRow]]:
    """The completed documents whose result another version made: what ``backfill --stale``
    would pay for."""
    stale = store.results.stale(current_suffix)
    docs = {d.document_id: d for d in store.documents.rows(r.document_id for r in stale)}
    return [
        (r, docs[r.document_id])
        for r in stale
        if r.document_id in docs and docs[r.document_id].state == State.COMPLETED
    ]


def sample(
    store: Store, candidates: Sequence[tuple[ResultRow, DocumentRow]], n: int, seed: int
) -> list[tuple[ResultRow, DocumentRow]]:
    """``n`` of ``candidates``, the same for the same seed, spread over strata a team cares
    about: the document's kind, long or short (against the median size), and the category it
    once failed with (none for most). Taken in turn from each stratum, in a seeded order."""
    if not candidates:
        return []
    median = statistics.median(d.size_bytes for _, d in candidates)
    ever_failed: dict[str, str] = {}
    for event in store.events.failures():
        ever_failed.setdefault(event.document_id, str(event.category.value))
    strata: dict[tuple[str, str, str], list[tuple[ResultRow, DocumentRow]]] = defaultdict(list)
    for pair in candidates:
        doc = pair[1]
        length = "long" if doc.size_bytes > median else "short"
        strata[(doc.kind, length, ever_failed.get(doc.document_id, "-"))].append(pair)

    def order(pair: tuple[ResultRow, DocumentRow]) -> str:
        return hashlib.sha256(f"{seed}:{pair[0].document_id}".encode()).hexdigest()

    queues = [sorted(strata[k], key=order) for k in sorted(strata)]
    chosen: list[tuple[ResultRow, DocumentRow]] = []
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return chosen


async def trial(
    store: Store, calls: AnalysisCalls, claims: Claims, result: ResultRow, task: str
) -> Trial | None:
    """One document analysed under ``task``, behind its claim (None: a run holds it now)."""
    log = TaskLog(logger, task)
    if await claims.take(task, result.document_id, log) is not None:
        return None
    try:
        doc = store.documents.load(result.document_id)
        assert doc is not None and doc.text is not None
        try:
            reply, from_checkpoint, verdict, parts = await calls.analyse(doc, task, doc.text, log)
        except ClassifiedError as e:
            return Trial(doc.document_id, doc.source, result.output, None, e.category.value,
                         0, 0, 0, False)  # fmt: skip
        failed = verdict.failure
        return Trial(
            doc.document_id,
            doc.source,
            result.output,
            verdict.output.model_dump(mode="json") if verdict.output is not None else None,
            failed.category.value if failed is not None and failed.category else None,
            reply.prompt_tokens or 0,
            reply.completion_tokens or 0,
            reply.latency_ms,
            from_checkpoint,
            result.sections,
            parts,
        )
    finally:
        claims.release(task)


async def run_canary(
    store: Store,
    llm: LLMClient,
    settings: Settings,
    *,
    size: int,
    seed: int = 0,
    tolerance: float = 0.05,
) -> dict[str, Any]:
    """The canary of the current version on ``size`` stale documents: its comparison, its cost
    and the projection of the whole stale backfill (also kept for ``backfill --stale``)."""
    current = current_task_suffix(settings, store.analysis)
    if store.results.count() == 0:
        raise CanaryError(f"no completed documents in {redact_url(settings.database_url)}")
    candidates = stale_completed(store, current)
    if not candidates:
        raise CanaryError(
            "every completed document is already analysed by the current version "
            f"({store.analysis.tag()}, {llm.model}): no earlier version to compare with"
        )
    chosen = sample(store, candidates, size, seed)
    calls = AnalysisCalls(store, llm, settings.min_confidence, settings.section_chars)
    claims = Claims(store, owner_id(f"canary-{seed}"))
    found = await asyncio.gather(
        *(trial(store, calls, claims, r, r.document_id + current) for r, _ in chosen)
    )
    trials = [t for t in found if t is not None]
    report = compare(trials, store.analysis, tolerance)
    prices = Prices.of(settings)
    paid = [t for t in trials if not t.from_checkpoint]
    per_document = (
        statistics.mean(
            prices.cost(llm.model, t.prompt_tokens, t.completion_tokens) for t in trials
        )
        if trials
        else 0.0
    )
    remaining = len(candidates) - len(trials)
    latency = statistics.mean(t.latency_ms for t in trials) / 1000 if trials else 0.0
    report.update(
        {
            "current": {"prompt_version": store.analysis.tag(), "model": llm.model},
            "seed": seed,
            "sample": len(trials),
            "held_by_runs": len(chosen) - len(trials),
            "stale": len(candidates),
            "sample_calls": len(paid),
            "sample_tokens": sum(t.prompt_tokens + t.completion_tokens for t in paid),
            "sample_cost_usd": round(
                sum(prices.cost(llm.model, t.prompt_tokens, t.completion_tokens) for t in paid), 6
            ),
            "projected": {
                "documents": remaining,
                "cost_usd": round(per_document * remaining, 4),
                "seconds": round(math.ceil(remaining / max(1, settings.llm_concurrency)) * latency),
            },
        }
    )
    store.checkpoints.delete(summary_key(current))
    store.checkpoints.put(summary_key(current), "", CANARY_STEP, report)
    return report


def last_canary(store: Store, settings: Settings) -> dict[str, Any] | None:
    """The last canary of the current version, if one was run."""
    return store.checkpoints.get(summary_key(current_task_suffix(settings, store.analysis)))


# --- the comparison -----------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def _words(value: Any) -> set[str]:
    return set(_WORD.findall(str(value).lower()))


def _overlap(a: set[Any], b: set[Any]) -> float:
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def agreement(old: Any, new: Any, tolerance: float) -> float:
    """How far two values of one field agree, 0 to 1: exact for enums, booleans and whole
    numbers; within ``tolerance`` for other numbers; the overlap of their words for text, and of
    their (normalised) items for lists."""
    if isinstance(old, bool) or isinstance(new, bool):
        return float(old == new)
    if isinstance(old, float | int) and isinstance(new, float | int):
        if isinstance(old, int) and isinstance(new, int):
            return float(old == new)
        return float(abs(old - new) <= tolerance)
    if isinstance(old, list) and isinstance(new, list):
        return _overlap({" ".join(sorted(_words(v))) for v in old}, {
            " ".join(sorted(_words(v))) for v in new
        })  # fmt: skip
    if isinstance(old, str) and isinstance(new, str):
        return 1.0 if old == new else _overlap(_words(old), _words(new))
    return float(old == new)


@dataclass(frozen=True)
class Pair:
    """One output before and now: a document's, or one of its sections'."""

    document_id: str
    where: str  # the document's source, and the section's index when it is one
    old: dict[str, Any]
    new: dict[str, Any]


def compare_fields(pairs: Sequence[Pair], model: type[BaseModel], tolerance: float) -> dict:
    """Per top-level field of ``model``: the mean agreement over ``pairs`` and the largest
    disagreements."""
    fields: dict[str, Any] = {}
    for name in model.model_fields:
        scored = sorted(
            ((agreement(p.old.get(name), p.new.get(name), tolerance), p) for p in pairs),
            key=lambda scored_pair: scored_pair[0],
        )
        fields[name] = {
            "agreement": round(statistics.mean(s for s, _ in scored), 4) if scored else None,
            "examples": [
                {
                    "document_id": p.document_id,
                    "source": p.where,
                    "old": p.old.get(name),
                    "new": p.new.get(name),
                }
                for s, p in scored[:EXAMPLES]
                if s < 1.0
            ],
        }
    return fields


def section_pairs(trials: Sequence[Trial]) -> tuple[list[Pair], int]:
    """The sections of the sampled documents paired by index, and how many documents were cut
    into another number of sections than before."""
    pairs: list[Pair] = []
    recut = 0
    for t in trials:
        if t.old_sections is None or t.new_sections is None:
            continue
        old = {s["index"]: s for s in t.old_sections}
        new = {s["index"]: s for s in t.new_sections}
        recut += len(old) != len(new)
        for index in sorted(old.keys() & new.keys()):
            where = f"{t.source} §{index} {old[index].get('title') or ''}".rstrip()
            pairs.append(Pair(t.document_id, where, old[index]["output"], new[index]["output"]))
    return pairs, recut


def compare(trials: Sequence[Trial], analysis: Any, tolerance: float) -> dict[str, Any]:
    """Per top-level field of the document's output: the mean agreement over the documents with
    a new output, and its largest disagreements; the same per section field for a sectioned
    analysis (a contract's clauses); the shift of the confidence field; the failures by
    category."""
    compared = [t for t in trials if t.new is not None]
    documents = [Pair(t.document_id, t.source, t.old, t.new) for t in compared if t.new]
    report: dict[str, Any] = {
        "fields": compare_fields(documents, analysis.document_model, tolerance)
    }
    if analysis.sections is not None:
        sections, recut = section_pairs(compared)
        report["sections"] = {
            "label": analysis.sections.label or "section",
            "compared": len(sections),
            "recut_documents": recut,
            "fields": compare_fields(sections, analysis.output_model, tolerance),
        }
    confidence = analysis.confidence_field
    numbers = [(p.old.get(confidence), p.new.get(confidence)) for p in documents if confidence]
    shifts = [float(n) - float(o) for o, n in numbers if _number(o) and _number(n)]  # type: ignore[arg-type]
    report["confidence_shift"] = round(statistics.mean(shifts), 4) if shifts else None
    report["failures"] = dict(Counter(t.failure for t in trials if t.failure))
    return report


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- the report as the UI shows it --------------------------------------------------------------


def to_markdown(report: dict[str, Any]) -> str:
    """The canary's report as a markdown table (a Dagster run's metadata)."""
    current, projected = report["current"], report["projected"]
    lines = [
        f"**Canary of prompt {current['prompt_version']}, model {current['model']}**: "
        f"{report['sample']} of {report['stale']} stale documents (seed {report['seed']}), "
        f"{report['sample_calls']} calls, ${report['sample_cost_usd']:.4f}",
        "",
        "| field | agreement | largest disagreement |",
        "|---|---|---|",
    ]
    lines += _rows(report["fields"])
    sections = report.get("sections")
    if sections:
        lines += [
            "",
            f"Per {sections['label']} ({sections['compared']} compared, "
            f"{sections['recut_documents']} documents cut otherwise than before):",
            "",
            "| field | agreement | largest disagreement |",
            "|---|---|---|",
            *_rows(sections["fields"]),
        ]
    if report.get("confidence_shift") is not None:
        lines.append(f"\nConfidence: {report['confidence_shift']:+.3f} on average.")
    if report["failures"]:
        failed = ", ".join(f"{c} {n}" for c, n in sorted(report["failures"].items()))
        lines.append(f"\nFailed under the new version: {failed}.")
    lines.append(
        f"\n**Projected `backfill --stale`**: {projected['documents']} more documents, "
        f"${projected['cost_usd']:.4f}, about {projected['seconds']} s."
    )
    return "\n".join(lines)


def _rows(fields: dict[str, Any]) -> list[str]:
    rows = []
    for name, field in fields.items():
        share = "-" if field["agreement"] is None else f"{field['agreement']:.0%}"
        worst = field["examples"][0] if field["examples"] else None
        shown = (
            f"{_cell(worst['source'])}: {_cell(worst['old'])} → {_cell(worst['new'])}"
            if worst
            else ""
        )
        rows.append(f"| {name} | {share} | {shown} |")
    return rows


def _cell(value: Any) -> str:
    text = " ".join(str(value).split()).replace("|", "\\|")
    return text if len(text) <= 60 else text[:59] + "…"


def agreement_png(report: dict[str, Any]) -> bytes:
    """A bar chart of each field's agreement, as PNG bytes."""
    fields = {k: v["agreement"] or 0.0 for k, v in report["fields"].items()}
    sections = report.get("sections")
    if sections:
        label = sections["label"]
        fields |= {f"{label}.{k}": v["agreement"] or 0.0 for k, v in sections["fields"].items()}
    fig, ax = pyplot().subplots(figsize=(6, 0.4 * len(fields) + 1))
    ax.barh(list(fields), [100 * v for v in fields.values()], color="#4f6bed")
    ax.set_xlim(0, 100)
    ax.set_xlabel("agreement with today's results (%)", fontsize=8)
    ax.invert_yaxis()
    ax.tick_params(labelsize=8)
    return png_of(fig)
