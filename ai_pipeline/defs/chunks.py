"""A big launch as several backfills ("chunks") that an operator can open in the Dagster UI.

Dagster's page of one backfill polls for every partition it targets: at 100,000 documents its
largest answer weighed 4.6 MB (polled every ~2.7 s), at 10,000 0.46 MB, and its table counts a
whole batch in one row per asset (``benchmarks/scale.py``, benchmarks/README.md). So a launch
of more than ``MAX_DOCUMENTS_PER_BACKFILL`` documents (``AI_PIPELINE_BACKFILL_DOCUMENTS``
overrides it) becomes several backfills of at most that many, equal in size and in the order of
the documents, each titled with its part ("batch X, part 3/10") and tagged with it (``PART_TAG``).
All their runs share the run queue, so the run size is chosen once for the whole launch
(``planned_run_size``) rather than per chunk.

A batch (``submit``) is cut by its whole document list, not by what is pending, so its parts stay
the same from one submit to the next; each part is followed on its own: a part whose backfill is
still queued or running launches nothing, and a part launched again gets the next deterministic id
(``next_part_backfill_id``), so two submits that race, or a submit retried after it stopped
half-way, launch each part once. This module holds the cutting and the launching; what a launch
reports and how it is waited for are ``ai_pipeline.defs.relaunch``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from ai_pipeline.defs.backfills import (
    backfill_id_for,
    launch_backfill,
    planned_run_size,
    settled_once_runs_end,
)
from ai_pipeline.defs.dagster_private import (
    BULK_ACTION_TERMINAL_STATUSES,
    BulkActionsFilter,
    BulkActionStatus,
)
from ai_pipeline.defs.site import ANALYSIS_TAG, DEFAULT_SITE, Site
from ai_pipeline.intake import BATCH_TAG
from ai_pipeline.settings import Settings

# The most documents one backfill takes. Measured with benchmarks/scale.py (benchmarks/README.md,
# a shared two-core machine): a backfill page showed its table in 3.7 s at 10,000 documents (0.46 MB
# the largest answer it polls for), 4.1 s at 25,000 (1.15 MB), 10-14 s at 100,000 (4.6 MB).
MAX_DOCUMENTS_PER_BACKFILL = 10_000

# The tag that says which part of a launch a backfill is: "3/10".
PART_TAG = "ai_pipeline/part"


@dataclass(frozen=True)
class Chunk:
    """One part of a launch: its number (from 1), how many parts, and its documents."""

    part: int
    parts: int
    document_ids: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.part}/{self.parts}"

    def title(self, title: str) -> str:
        """The backfill's title: the launch's, with the part when there are several."""
        return title if self.parts == 1 else f"{title}, part {self.label}"


@dataclass(frozen=True)
class Launched:
    """A backfill a launch names: launched now (``new``) or found still queued or running, and
    the documents it was launched for (or, found running, the documents of its part)."""

    backfill_id: str
    chunk: Chunk
    new: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "backfill_id": self.backfill_id,
            "part": self.chunk.label,
            "documents": len(self.chunk.document_ids),
            "launched": self.new,
        }


def split(document_ids: Sequence[str], most: int) -> list[Chunk]:
    """The documents in their order, cut into as few parts of at most ``most`` as can be, of
    equal size (give or take one)."""
    ids = list(dict.fromkeys(document_ids))
    if not ids:
        return []
    parts = -(-len(ids) // max(1, most))
    size, extra = divmod(len(ids), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(Chunk(i + 1, parts, tuple(ids[start:end])))
        start = end
    return chunks


def documents_per_backfill(settings: Settings) -> int:
    """``AI_PIPELINE_BACKFILL_DOCUMENTS`` when set, else ``MAX_DOCUMENTS_PER_BACKFILL``."""
    return settings.backfill_documents or MAX_DOCUMENTS_PER_BACKFILL


def launch_chunks(
    instance: dg.DagsterInstance,
    asset_graph: Any,
    chunks: Sequence[Chunk],
    *,
    title: str,
    tags: Mapping[str, str],
    ids: Sequence[str | None] | None = None,
    site: Site = DEFAULT_SITE,
) -> list[Launched]:
    """One backfill per chunk (``launch_backfill``; ``ids``: each one's id, None for a new
    one), its runs sized for all the chunks together: they share the run queue."""
    run_size = planned_run_size(instance, sum(len(c.document_ids) for c in chunks))
    return [
        Launched(
            launch_backfill(
                instance,
                asset_graph,
                chunk.document_ids,
                title=chunk.title(title),
                tags={**tags, PART_TAG: chunk.label},
                backfill_id=backfill_id,
                site=site,
                run_size=run_size,
            ),
            chunk,
            True,
        )
        for chunk, backfill_id in zip(chunks, ids or [None] * len(chunks), strict=True)
    ]


def batch_part_backfill_id(site: Site, batch_id: str, chunk: Chunk, earlier: int) -> str:
    """The id of a batch part's backfill after ``earlier`` backfills of that part: the same on
    every machine and every submit, a new one each time the part is launched again."""
    return backfill_id_for(site.name(f"batch-{batch_id}-part-{chunk.label}-{earlier}"))


@dataclass(frozen=True)
class BatchBackfills:
    """The backfills of a batch still queued or running, by part."""

    # Part label → the backfill of that part still queued or running.
    active: dict[str, str]
    # A backfill still running that covers every part: launched before parts were (no part
    # tag), or under another number of parts.
    whole: str | None


def batch_backfill_list(instance: dg.DagsterInstance, batch_id: str) -> list[dict[str, Any]]:
    """Every backfill of a batch, oldest first: id, title, part and status (what ``ai-pipeline
    batch`` lists, so that an operator knows which pages to open). The queued and running ones
    are looked up by status too (see ``batch_backfills``)."""
    statuses = [s for s in BulkActionStatus if s not in BULK_ACTION_TERMINAL_STATUSES]
    by_tag = instance.get_backfills(filters=BulkActionsFilter(tags={BATCH_TAG: batch_id}))
    active = instance.get_backfills(filters=BulkActionsFilter(statuses=statuses))
    found = {
        b.backfill_id: b for b in [*by_tag, *active] if b.tags.get(BATCH_TAG) == batch_id
    }.values()
    return [
        {
            "backfill_id": b.backfill_id,
            "title": b.title,
            "part": b.tags.get(PART_TAG),
            "status": b.status.value,
        }
        for b in sorted(found, key=lambda b: (b.backfill_timestamp, b.tags.get(PART_TAG, "")))
    ]


def batch_backfills(
    instance: dg.DagsterInstance, batch_id: str, parts: int, analysis: str
) -> BatchBackfills:
    """The backfills of ``batch_id`` (of the analysis ``analysis``) still queued or running. By
    status, and their tags read here: Dagster's filter by tag reads the runs' tags on an
    instance whose backfill-tags index is not built, and misses a backfill with no run yet."""
    active: dict[str, str] = {}
    whole = None
    statuses = [s for s in BulkActionStatus if s not in BULK_ACTION_TERMINAL_STATUSES]
    for backfill in instance.get_backfills(filters=BulkActionsFilter(statuses=statuses)):
        tags = backfill.tags
        if tags.get(BATCH_TAG) != batch_id or tags.get(ANALYSIS_TAG, analysis) != analysis:
            continue
        label = tags.get(PART_TAG, "")
        if label.endswith(f"/{parts}"):
            active.setdefault(label, str(backfill.backfill_id))
        elif whole is None:
            whole = str(backfill.backfill_id)
    return BatchBackfills(active, whole)


def next_part_backfill_id(
    instance: dg.DagsterInstance, site: Site, batch_id: str, chunk: Chunk
) -> str:
    """The first of the part's ids (``batch_part_backfill_id`` after 0, 1, 2 … earlier
    backfills) that names no backfill yet."""
    earlier = 0
    while instance.get_backfill(batch_part_backfill_id(site, batch_id, chunk, earlier)):
        earlier += 1
    return batch_part_backfill_id(site, batch_id, chunk, earlier)


@dataclass
class BatchLaunch:
    """A submit's backfills: those of its parts still queued or running, and the parts to
    launch (their pending documents) with their ids."""

    running: list[Launched]
    to_launch: list[Chunk]
    ids: list[str]

    @property
    def pending(self) -> list[str]:
        return [d for c in self.to_launch for d in c.document_ids]


def plan_batch(
    instance: dg.DagsterInstance,
    batch_id: str,
    document_ids: Sequence[str],
    pending: Sequence[str],
    *,
    most: int,
    ended_in: Callable[[Sequence[str], list[str]], bool],
    not_done: Callable[[Sequence[str]], list[str]],
    site: Site = DEFAULT_SITE,
) -> BatchLaunch:
    """Which parts of the batch (``split`` of its ``document_ids``) still have a backfill
    queued or running, and which have ``pending`` documents and none: those are launched. A
    backfill whose runs are over and ended every pending document of its part (``ended_in``:
    whether these documents all ended in these runs) is running only by the daemon's record (a
    ``--wait`` may have returned on that already, before they closed): its part is launched again
    for what is still ``not_done``."""
    parts = split(document_ids, most)
    found = batch_backfills(instance, batch_id, len(parts), site.declaration.name)
    todo = set(pending)

    def still_running(backfill_id: str, documents: Sequence[str]) -> bool:
        over = settled_once_runs_end(instance, backfill_id, lambda runs: ended_in(documents, runs))
        return not over

    plan = BatchLaunch([], [], [])
    whole = [d for d in document_ids if d in todo]
    if found.whole is not None and whole:
        if still_running(found.whole, whole):
            plan.running.append(Launched(found.whole, Chunk(1, 1, tuple(document_ids)), False))
            return plan
        todo = set(not_done(document_ids))
    for chunk in parts:
        mine = [d for d in chunk.document_ids if d in todo]
        if not mine:
            continue
        active = found.active.get(chunk.label)
        if active is not None and still_running(active, mine):
            plan.running.append(Launched(active, chunk, False))
            continue
        if active is not None:
            mine = not_done(chunk.document_ids)
            if not mine:
                continue
        plan.to_launch.append(Chunk(chunk.part, chunk.parts, tuple(mine)))
        plan.ids.append(next_part_backfill_id(instance, site, batch_id, chunk))
    return plan
