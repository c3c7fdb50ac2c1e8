"""Launching work through Dagster: what the command line (or any front end) asks of the pipeline.

Every way of processing documents goes through the Dagster instance in ``DAGSTER_HOME``, so what it
does shows in the UI like a sensor's runs:

- ``register_inbox``: a folder's files become documents (``ai_pipeline.intake``) and partitions;
- ``execute``: documents are analysed in this process, in range runs of the analysis job;
- ``process_inbox``: both, for the documents not yet completed (``ai-pipeline run``, the demo);
- ``approve``: a reviewer's approval (``ai_pipeline.review``), then the document re-submitted.

Backfills and named batches go through a ``Launcher`` too (``ai_pipeline.defs.relaunch``). The code
location's ``Definitions`` and the analysis's site in it are handed in by the caller (the CLI loads
them: ``ai_pipeline.defs.location``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from ai_pipeline import periodic
from ai_pipeline.defs.backfills import (
    DAGSTER_BACKFILL_TAG,
    wait_for_backfill,
)
from ai_pipeline.defs.dagster_private import repository_of
from ai_pipeline.defs.document_trace import trace_with_runs
from ai_pipeline.defs.jobs import range_tags
from ai_pipeline.defs.logs import TASK_LINES_TAG
from ai_pipeline.defs.partitions import add_partitions
from ai_pipeline.defs.run_ends import mark_failed_runs
from ai_pipeline.defs.sensors import run_statuses
from ai_pipeline.defs.site import DEFAULT_SITE, Site
from ai_pipeline.documents import display_path
from ai_pipeline.errors import InputError
from ai_pipeline.failures import RUN_FAULTS
from ai_pipeline.inbox import list_files
from ai_pipeline.intake import (
    contiguous_ranges,
    register_files,
    unique_in_order,
)
from ai_pipeline.progress import Pace, Progress
from ai_pipeline.reconcile import RUN_OVER, fail_unstarted, reconcile
from ai_pipeline.reporting import status_report
from ai_pipeline.review import approve as record_approval
from ai_pipeline.settings import Settings
from ai_pipeline.spend import BUDGET_TAG, Budget
from ai_pipeline.states import State
from ai_pipeline.store import Store, open_store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.documents import ENDED
from ai_pipeline.store.rows import Decision, DocumentRow
from ai_pipeline.tasks import SECTION_STEP_PREFIX

QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# Documents per range run of `run` (one after another in this process) when
# AI_PIPELINE_DOCUMENTS_PER_RUN is unset.
RUN_DOCUMENTS_PER_RUN = 25


def _silent(message: str) -> None:
    pass


# A run of at most this many documents also shows how far its long documents are ("clause 4/12").
SECTIONS_SHOWN_UP_TO = 10


def _sections_line(store: Store, document_ids: Sequence[str]) -> str:
    """`` · clause k/n`` for each running document cut into sections (as its analysis names
    them), the one it is analysing next."""
    sections = store.analysis.sections
    label = sections.label if sections is not None else "section"
    parts = []
    for doc in store.documents.rows(document_ids):
        if doc.state == State.RUNNING and doc.sections:
            done = store.checkpoints.count_for(doc.document_id, SECTION_STEP_PREFIX)
            parts.append(f"{label} {min(done + 1, doc.sections)}/{doc.sections}")
    return "".join(f" · {p}" for p in parts)


@dataclass(frozen=True)
class Registration:
    """What registering a folder did: files read, their documents, what was left out and why."""

    files: int
    document_ids: list[str]
    skipped: list[dict[str, str]]
    settling: list[str]


def failure_of(doc: DocumentRow) -> dict[str, Any]:
    return {"category": doc.category.value if doc.category else None, "error": doc.last_error}


def returned(
    run_id: str, lookup: Callable[[Sequence[str]], Mapping[str, str]]
) -> Callable[[Sequence[str]], Mapping[str, str]]:
    """``lookup``, except that ``run_id`` — a run that returned in this process — is over."""

    def statuses(run_ids: Sequence[str]) -> Mapping[str, str]:
        try:
            found = dict(lookup(run_ids))
        except Exception:  # the instance's storage is away: the leases still decide the others
            found = {}
        if run_id in run_ids and found.get(run_id) not in RUN_OVER:
            found[run_id] = "FAILURE"
        return found

    return statuses


@dataclass
class Launcher:
    """The pipeline's operations against one Dagster instance and code location."""

    instance: dg.DagsterInstance
    definitions: dg.Definitions
    # The settings of the site's analysis; None: from the site and the environment.
    settings: Settings = field(default=None)  # type: ignore[assignment]
    progress: Callable[[str], None] = _silent
    # A line that replaces the previous one (documents done / failed / pending, rate, ETA).
    live: Callable[[str], None] = _silent
    # Which analysis of the code location (``ai_pipeline.defs.site``).
    site: Site = DEFAULT_SITE

    def __post_init__(self) -> None:
        if self.settings is None:
            self.settings = Settings.load(**self.site.settings_overrides)

    @property
    def store(self) -> Store:
        return open_store(self.settings)

    def _registering(self, total: int) -> Callable[[int], None]:
        return lambda n: self.live(f"registering files: {n}/{total}")

    def _watching(self, document_ids: Sequence[str]) -> Callable[[bool], None]:
        """A callable that shows how far these documents have come: on the live line, or (when
        called with True, at the end) as a message that stays."""
        if self.live is _silent:
            return lambda final: None
        progress = Progress(len(document_ids))
        store = self.store

        def show(final: bool) -> None:
            line = progress.line(store.documents.count_by_state(document_ids))
            if not final and len(document_ids) <= SECTIONS_SHOWN_UP_TO:
                line += _sections_line(store, document_ids)
            (self.progress if final else self.live)(line)

        return show

    @contextmanager
    def _watched(self, document_ids: Sequence[str], every: float = 2.0) -> Iterator[None]:
        """Show the progress of these documents every ``every`` seconds while the block runs."""
        if self.live is _silent:
            yield
            return
        show = self._watching(document_ids)

        def live() -> None:
            with contextlib.suppress(Exception):  # progress must never break the work
                show(False)

        try:
            with periodic.every(every, live, name="progress"):
                yield
        finally:
            with contextlib.suppress(Exception):
                show(True)

    def wait(
        self,
        backfill_id: str,
        document_ids: Sequence[str],
        timeout: float,
        targeted: Sequence[str] | None = None,
    ) -> str:
        """Wait for a backfill of ``targeted`` (default: ``document_ids``), showing the progress
        of ``document_ids``; returns the status it ends in as soon as its runs have settled every
        targeted document in the results store, without waiting for those runs to close or the
        backfill daemon's next loop to record it."""
        self.progress(f"waiting for backfill {backfill_id} (run by the daemon) …")
        show = self._watching(document_ids)
        targeted = list(document_ids if targeted is None else targeted)
        # Every second while the end is far, more often as the last documents settle.
        pace = Pace(len(set(targeted)))
        store = self.store
        counted: dict[State, int] = {}

        def polled() -> None:
            counted.clear()
            counted.update(store.documents.count_by_state(targeted))
            pace.saw(counted)
            show(False)

        def ended_in(run_ids: list[str]) -> bool:
            # While this poll's count has a document not ended, it has not: no need to ask which
            # runs the others ended in (a second pass over every document, each poll).
            if any(state not in ENDED for state in counted):
                return False
            return store.documents.ended_in(targeted, run_ids)

        status = wait_for_backfill(
            self.instance,
            backfill_id,
            timeout=timeout,
            poll=pace.next_wait,
            on_poll=polled,
            ended_in=ended_in,
            all_completed=lambda: self._all_completed(targeted),
        )
        # A document whose run died is not pending: it failed, retryably — also one its run
        # never started, before the reconcile sensor's next tick says so.
        reconcile(self.store, run_statuses(self.instance))
        runs = self.instance.get_runs(dg.RunsFilter(tags={DAGSTER_BACKFILL_TAG: backfill_id}))
        mark_failed_runs(self.instance, self.store, runs, self.site)
        show(True)
        return status

    def _all_completed(self, document_ids: Sequence[str]) -> bool:
        counts = self.store.documents.count_by_state(document_ids)
        return counts.get(State.COMPLETED, 0) == len(set(document_ids))

    # --- processing --------------------------------------------------------------------------

    def register_inbox(self, inbox: Path) -> Registration:
        """Register every file of ``inbox`` as a document and a partition (``ai_pipeline.inbox``
        says which entries are files, which are skipped and why; files changed within the settle
        time are left for the next run)."""
        if not inbox.is_dir():
            raise InputError(f"inbox {display_path(inbox)} is not a directory")
        listing = list_files([inbox], settle_seconds=self.settings.settle_seconds)
        registered = register_files(
            self.store,
            listing.files,
            max_bytes=self.settings.max_document_bytes,
            progress=self._registering(len(listing.files)),
        )
        document_ids = unique_in_order(r.document_id for r in registered)
        add_partitions(self.instance, document_ids, self.site.partitions)
        registration = Registration(
            files=len(listing.files),
            document_ids=document_ids,
            skipped=[s.as_dict() for s in listing.skipped],
            settling=[display_path(p) for p in listing.settling],
        )
        self.progress(
            f"{registration.files} files → {len(document_ids)} documents "
            f"({registration.files - len(document_ids)} duplicates)"
        )
        for entry in registration.skipped:
            self.progress(f"skipped {entry['path']}: {entry['reason']}")
        if registration.settling:
            self.progress(
                f"{len(registration.settling)} files changed in the last "
                f"{self.settings.settle_seconds:g} s (still being written?): left for the next run"
            )
        return registration

    def not_done(self, document_ids: Sequence[str]) -> list[str]:
        """The documents not completed, here or in Dagster.

        Done means done in both places: a run killed after a document's results were written but
        before Dagster heard of it leaves the document COMPLETED here and unmaterialized there; a
        rerun re-reports it from its checkpoints without an LLM call. A document a reviewer
        rejected is settled: it is reported, never analysed again.
        """
        docs = {d.document_id: d for d in self.store.documents.rows(document_ids)}
        candidates = [d for d in document_ids if not (d in docs and docs[d].rejected_by_reviewer)]
        in_dagster = (
            self.instance.get_status_by_partition(
                self.site.results_key, candidates, self.site.partitions_def
            )
            or {}
        )
        return [
            d
            for d in candidates
            if d not in docs
            or docs[d].state != State.COMPLETED
            or in_dagster.get(d) != dg.AssetPartitionStatus.MATERIALIZED
        ]

    def execute(
        self, document_ids: Sequence[str], *, verbose: bool = False, budget: str | None = None
    ) -> list[dict[str, Any]]:
        """Analyse documents in this process through Dagster, in range runs of contiguous
        partitions, all under the budget ``budget`` names (when given); returns one
        ``{"run_id", "documents", "success"}`` per run."""
        budget_tags = {BUDGET_TAG: budget} if budget else {}
        job = self.repository.get_job(self.site.job_name)
        ordered = self.instance.get_dynamic_partitions(self.site.partitions)
        size = self.settings.documents_per_run or RUN_DOCUMENTS_PER_RUN
        ranges = contiguous_ranges(document_ids, ordered, size)
        runs = []
        with self._watched([d for batch in ranges for d in batch]):
            for i, batch in enumerate(ranges, 1):
                self.progress(f"run {i}/{len(ranges)}: {len(batch)} documents …")
                result = job.execute_in_process(
                    instance=self.instance,
                    # In this process Dagster would mirror the compute log to the terminal.
                    tags={**range_tags(batch), TASK_LINES_TAG: "events", **budget_tags},
                    raise_on_error=False,
                    # The run's events are in the instance (and the UI); the terminal gets the
                    # table.
                    run_config=None if verbose else QUIET_RUN_CONFIG,
                )
                runs.append(
                    {"run_id": result.run_id, "documents": len(batch), "success": result.success}
                )
                # The run has returned in this process: it holds nothing any more, whatever
                # Dagster could record of its end (its storage may have been down just then).
                reconcile(self.store, returned(result.run_id, run_statuses(self.instance)))
                if not result.success:
                    # A run that failed on its own account may leave documents it never started:
                    # each gets the reason (RUN_INTERRUPTED), not a silent PENDING.
                    with contextlib.suppress(StoreUnavailable):
                        fail_unstarted(self.store, result.run_id, self._untouched(batch))
                outcome = "succeeded" if result.success else "had failures"
                self.progress(f"run {i}/{len(ranges)}: {outcome}")
        return runs

    def process_inbox(
        self, inbox: Path, *, verbose: bool = False, budget: Budget | None = None
    ) -> dict[str, Any]:
        """Register the inbox's files and analyse every document not yet completed, within the
        budget when one is given (one budget for the whole command, all its runs)."""
        registration = self.register_inbox(inbox)
        todo = self.not_done(registration.document_ids)
        self.progress(f"{len(todo)} to analyse")
        key = None
        if budget is not None and todo:
            key = f"launch:{uuid.uuid4().hex}"
            self.store.spend.set_budget(key, tokens=budget.tokens, usd=budget.usd)
        runs = self.execute(todo, verbose=verbose, budget=key)
        left = self.left_by_failed_runs(todo) if not all(r["success"] for r in runs) else []
        if left:
            # A run that failed on its own account (its database away past the retries, its
            # worker gone) leaves documents no outcome of theirs explains: one more wave.
            self.progress(f"{len(left)} documents left by a run that failed: one more run for them")
            runs += self.execute(left, verbose=verbose, budget=key)
        report = self.outcome(registration.document_ids, [r["run_id"] for r in runs])
        state = self.store.spend.budget(key) if key else None
        spent = [self.store.spend.for_run(r["run_id"]) for r in runs]
        return {
            "inbox": display_path(inbox),
            "files": registration.files,
            "skipped": registration.skipped,
            "settling": registration.settling,
            "runs": runs,
            **report,
            "spend": {
                "attempts": sum(t.attempts for t in spent),
                "prompt_tokens": sum(t.prompt_tokens for t in spent),
                "completion_tokens": sum(t.completion_tokens for t in spent),
                "cost_usd": round(sum(t.cost_usd for t in spent), 6),
            },
            "budget": state.as_dict() if state else None,
        }

    def _untouched(self, document_ids: Sequence[str]) -> list[str]:
        """Those of the documents no run has started or stopped (no category: not held)."""
        return [
            d.document_id
            for d in self.store.documents.rows(document_ids)
            if d.state in (State.PENDING, State.QUEUED) and d.category is None
        ]

    def left_by_failed_runs(self, document_ids: Sequence[str]) -> list[str]:
        """The documents not done (``not_done``) for a reason of the run's, not theirs: completed
        here but not materialized in Dagster (re-reported from their checkpoints, no call), never
        started, or stopped by the run's end or its database (``RUN_INTERRUPTED``,
        ``DATABASE_UNAVAILABLE``). A document's own failure, or the run's settings
        (``CONFIGURATION``), is not the run's to redo."""
        undone = self.not_done(document_ids)
        docs = {d.document_id: d for d in self.store.documents.rows(undone)}
        return [
            d
            for d in undone
            if d in docs
            and (
                docs[d].state == State.COMPLETED
                or (docs[d].state in (State.PENDING, State.QUEUED) and docs[d].category is None)
                or (docs[d].category in RUN_FAULTS and docs[d].state != State.DEAD_LETTER)
            )
        ]

    def outcome(self, document_ids: Sequence[str], run_ids: Sequence[str]) -> dict[str, Any]:
        """The status of these documents after the given runs, with the ones another run still
        holds listed apart ("in progress elsewhere": left to that run, not failed)."""
        report = status_report(self.store, document_ids)
        mine = set(run_ids)
        report["in_progress_elsewhere"] = [
            {"document_id": d["document_id"], "run_id": d["run_id"]}
            for d in report["documents"]
            if d["state"] == State.RUNNING.value and d["run_id"] not in mine
        ]
        return report

    def status(
        self,
        document_ids: Sequence[str] | None = None,
        *,
        states: Iterable[State] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Documents' states (``reporting.status_report``), after moving out of RUNNING those
        whose run is over."""
        interrupted = reconcile(self.store, run_statuses(self.instance))
        report = status_report(self.store, document_ids, states=states, limit=limit)
        report["reconciled"] = [i.document_id for i in interrupted]
        return report

    # --- tracing -----------------------------------------------------------------------------

    def trace(self, any_id: str) -> dict[str, Any]:
        """A document's story with what Dagster holds of it (``document_trace``)."""
        return trace_with_runs(self.instance, self.store, any_id)

    # --- review ------------------------------------------------------------------------------

    def approve(
        self,
        document_id: str,
        *,
        decision: Decision | None,
        by: str,
        note: str | None = None,
        verbose: bool = False,
    ) -> dict[str, Any]:
        """Record the approval, then re-submit the document through Dagster under its task id."""
        approval = record_approval(self.store, document_id, decision=decision, by=by, note=note)
        self.progress(
            f"approved ({approval.decision.value}); re-submitting {document_id} under task "
            f"{approval.task_id}"
        )
        runs = self.execute([document_id], verbose=verbose)
        report = {"runs": runs, **status_report(self.store, [document_id])}
        report["history"] = [
            {"event": h.event, "detail": h.detail, "at": h.at.isoformat()}
            for h in self.store.events.history(document_id)
        ]
        return report

    @property
    def asset_graph(self) -> Any:
        """The code location's asset graph (what a backfill is planned against)."""
        return self.repository.asset_graph

    @property
    def repository(self) -> Any:
        """The code location's repository, built against this launcher's instance."""
        return repository_of(self.definitions, self.instance)
