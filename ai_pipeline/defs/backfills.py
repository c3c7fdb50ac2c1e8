"""Failed-only backfills: which documents a rerun can fix, and a real Dagster backfill for them.

Dagster reruns whole partitions and cannot select by failure reason; we can. A document is picked
when Dagster shows it FAILED (or our store does), and its category says a rerun can help: by default
the categories that need a person (input quality, model refusals and schema problems, hallucination,
business rejection) are left out, and DEAD_LETTER documents (their retry budget spent) always are,
until ``ai-pipeline requeue`` puts them back.

The backfill is a real one: it shows on the UI's Backfills page and the daemon runs it, in runs of
contiguous documents (the assets' ``BackfillPolicy``); checkpoints make every rerun free of repeated
LLM calls.
"""

import hashlib
import string
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from ai_pipeline.defs.assets import ANALYSIS_RESULTS, analyse_documents
from ai_pipeline.defs.partitions import PARTITIONS_NAME, documents_partitions
from ai_pipeline.failures import Category
from ai_pipeline.states import State
from ai_pipeline.store import Store

PEOPLE_CATEGORIES = frozenset(c for c in Category if c.needs_person)
BACKFILL_TAG = "ai_pipeline/backfill"


@dataclass
class BackfillPlan:
    """The documents a failed-only backfill would rerun, and those it leaves out (with why)."""

    selected: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def document_ids(self) -> list[str]:
        return [d["document_id"] for d in self.selected]


def plan_failed_backfill(
    instance: dg.DagsterInstance,
    store: Store,
    *,
    categories: Iterable[str] | None = None,
    since: datetime | None = None,
) -> BackfillPlan:
    """Documents FAILED in Dagster or in the store, filtered by category and time."""
    wanted = {Category(c) for c in categories} if categories else None
    keys = instance.get_dynamic_partitions(PARTITIONS_NAME)
    dagster_status = (
        instance.get_status_by_partition(ANALYSIS_RESULTS, keys, documents_partitions) or {}
    )
    failed_in_dagster = {
        k for k, v in dagster_status.items() if v == dg.AssetPartitionStatus.FAILED
    }
    plan = BackfillPlan()
    for doc in store.get_documents():
        document_id, state = doc["document_id"], State(doc["state"])
        if document_id not in failed_in_dagster and state != State.FAILED:
            continue
        category = Category(doc["category"]) if doc["category"] else None
        entry = {
            "document_id": document_id,
            "source": doc["source"],
            "state": state.value,
            "category": category.value if category else None,
            "attempts": doc["attempts"],
            "error": doc["last_error"],
        }
        reason = _skip_reason(doc, state, category, wanted, since)
        if reason:
            plan.skipped.append({**entry, "skipped": reason})
        elif document_id in keys:
            plan.selected.append(entry)
    return plan


def _skip_reason(
    doc: dict[str, Any],
    state: State,
    category: Category | None,
    wanted: set[Category] | None,
    since: datetime | None,
) -> str | None:
    if state == State.DEAD_LETTER:
        return "dead letter: retry budget spent (ai-pipeline requeue puts it back)"
    if doc.get("status_message"):
        return "rejected by a reviewer"
    if wanted is not None:
        if category not in wanted:
            return f"category {category.value if category else 'none'} not selected"
    elif category in PEOPLE_CATEGORIES:
        return f"{category.value} needs a person (ai-pipeline review)"  # type: ignore[union-attr]
    if since is not None and doc["updated_at"] is not None:
        updated = doc["updated_at"]
        if updated.tzinfo is None:
            updated = updated.replace(tzinfo=since.tzinfo)
        if updated < since:
            return "failed before --since"
    return None


def backfill_id_for(name: str) -> str:
    """A deterministic backfill id (eight lower-case letters, like Dagster's own) for a name."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return "".join(string.ascii_lowercase[b % 26] for b in digest[:8])


def launch_backfill(
    instance: dg.DagsterInstance,
    document_ids: Sequence[str],
    *,
    title: str,
    tags: dict[str, str] | None = None,
    backfill_id: str | None = None,
    include_report: bool = False,
) -> str:
    """Create an asset backfill of the analysis assets for these documents; the daemon runs it.

    Returns the backfill id; when ``backfill_id`` names an existing backfill nothing new is made
    (a retried schedule tick must not launch twice).
    """
    # Checked against dagster 1.13.27: there is no public API to create an asset backfill outside
    # the UI or a sensor, so this uses the same constructor the UI's GraphQL mutation does.
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id

    from ai_pipeline.definitions import defs

    backfill_id = backfill_id or make_new_backfill_id()
    if instance.get_backfill(backfill_id) is not None:
        return backfill_id
    selection = list(analyse_documents.keys)
    if include_report:
        from ai_pipeline.defs.report import failure_report

        selection.append(failure_report.key)
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id,
        asset_graph=defs.get_repository_def().asset_graph,
        partition_names=list(document_ids),
        asset_selection=selection,
        backfill_timestamp=time.time(),
        tags={BACKFILL_TAG: "failed", **(tags or {})},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=title,
        description=f"{len(document_ids)} documents",
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill_id


def wait_for_backfill(
    instance: dg.DagsterInstance, backfill_id: str, *, timeout: float, poll: float = 2.0
) -> str:
    """Wait until the backfill is done (the daemon must be running); returns its final status."""
    from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES

    deadline = time.monotonic() + timeout
    while True:
        backfill = instance.get_backfill(backfill_id)
        if backfill is None:
            raise KeyError(f"no backfill {backfill_id}")
        if backfill.status in BULK_ACTION_TERMINAL_STATUSES:
            return backfill.status.value
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"backfill {backfill_id} still {backfill.status.value} after {timeout:g} s "
                "(is dagster-daemon running?)"
            )
        time.sleep(poll)
