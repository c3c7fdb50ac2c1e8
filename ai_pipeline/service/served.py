"""The analyses one service process serves: every analysis of the code location ``ai-pipeline
serve`` loads (``AI_PIPELINE_DEFINITIONS``, else the product's own; ``ai_pipeline.defs.site``
gives each one's settings), each with its own settings and results database, opened when a
request first needs it.

A submission names its analysis, or goes to the default one: the one ``--analysis`` names, else
the first of the code location — the analysis every ``ai-pipeline`` command defaults to. A task
id belongs to one analysis: it is the engine's own id for the document under that analysis's
declaration and model, and its task is in that analysis's results database, where that
analysis's submissions sensor (and no other) picks it up.

Nothing here answers HTTP: ``app`` and ``review_page`` do.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ai_pipeline.errors import InputError
from ai_pipeline.service.estimate import Estimator
from ai_pipeline.settings import Settings, SettingsError
from ai_pipeline.states import State
from ai_pipeline.store import Store, open_store
from ai_pipeline.store.tasks import TenantTask
from ai_pipeline.tasks import ANALYSE_STEP, task_id, task_suffix


class UnknownAnalysis(InputError):
    """A request names an analysis the service does not serve (the message names those it does)."""


@dataclass
class Served:
    """One analysis the service serves: its name, its settings, its results database."""

    name: str
    settings: Settings
    _store: Store | None = field(default=None, init=False, repr=False)
    _estimator: Estimator | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def store(self) -> Store:
        """The analysis's results database, opened on first use (it may block: call it in a
        worker thread)."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings)
            return self._store

    @property
    def estimator(self) -> Estimator:
        store = self.store
        with self._lock:
            if self._estimator is None:
                config = self.settings
                self._estimator = Estimator(store, config.llm_concurrency, config.section_chars)
            return self._estimator

    @property
    def suffix(self) -> str:
        """What the analysis's task ids end with (its declaration's tag and its model)."""
        config = self.settings
        return task_suffix(ANALYSE_STEP, config.declaration.tag(), config.analysis_model)

    def task_id(self, document_id: str) -> str:
        """The document's task id under this analysis: exactly the one its runs use."""
        config = self.settings
        return task_id(document_id, ANALYSE_STEP, config.declaration.tag(), config.analysis_model)


class Analyses:
    """The analyses served, in the code location's order; ``default`` is the one a submission
    that names none goes to."""

    def __init__(self, served: Sequence[Served], default: str | None = None):
        if not served:
            raise SettingsError("the code location holds no analysis to serve")
        self._by_name = {s.name: s for s in served}
        self.default = self.named(default) if default else served[0]

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self) -> Iterator[Served]:
        return iter(self._by_name.values())

    def named(self, name: str | None) -> Served:
        """The analysis ``name``; the default for None; UnknownAnalysis naming those served."""
        if name is None:
            return self.default
        found = self._by_name.get(name)
        if found is None:
            raise UnknownAnalysis(
                f"no analysis {name[:80]!r} here: this service serves {', '.join(self.names)}"
            )
        return found

    def find(self, tenant_id: str, task: str) -> tuple[Served, TenantTask] | None:
        """The tenant's task and the analysis it belongs to; None for an unknown id and for
        another tenant's, alike. The analysis whose current task ids end like this one is asked
        first; the others too, for a task submitted under an earlier declaration."""
        ordered = sorted(self, key=lambda s: not task.endswith(s.suffix))
        for served in ordered:
            found = served.store.tasks.get(tenant_id, task)
            if found is not None:
                return served, found
        return None

    def listing(
        self,
        tenant_id: str,
        states: Iterable[State] | None,
        limit: int,
        offset: int,
        name: str | None = None,
    ) -> tuple[list[tuple[Served, TenantTask]], int]:
        """A page of the tenant's tasks of the analysis ``name`` (of every one for None), newest
        first, and how many there are."""
        chosen = [self.named(name)] if name is not None else list(self)
        wanted = None if states is None else list(states)
        if len(chosen) == 1:
            page, total = chosen[0].store.tasks.listing(tenant_id, wanted, limit, offset)
            return [(chosen[0], t) for t in page], total
        # Each analysis's newest offset + limit, merged: the page is among them.
        rows: list[tuple[Served, TenantTask]] = []
        total = 0
        for served in chosen:
            page, count = served.store.tasks.listing(tenant_id, wanted, offset + limit, 0)
            rows += [(served, t) for t in page]
            total += count
        rows.sort(key=lambda row: row[1].created_at, reverse=True)
        return rows[offset : offset + limit], total


def load_analyses(
    config: Settings, by_name: Mapping[str, Settings] | None = None, default: str | None = None
) -> Analyses:
    """The analyses ``by_name`` (each with the settings its runs use), in their order; None: the
    one analysis ``config`` names."""
    found = by_name or {config.declaration.name: config}
    return Analyses([Served(name, settings) for name, settings in found.items()], default)
