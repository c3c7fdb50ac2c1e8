"""The results database: documents and their state, checkpoints, results, failure events, reviews.

One :class:`Store` per database URL per process (``get_store``), holding one engine and one part per
kind of thing stored:

==================  ==========================================================================
``documents``       registration, sources (aliases), state transitions (``.documents``)
``checkpoints``     the stored result of each task: its existence means the task is done
``results``         one upserted analysis row per document, ever
``events``          failure events (every classification) and each document's history
``reviews``         the review queue, reviewers' overrides, quarantined outputs, the outbox
``batches``         named sets of documents submitted together
``openai_batches``  jobs of OpenAI's Batch API and the state of each task (line) they carry
``leases``          which run works on which task now: one owner per task
``run_beats``       each run's last sign of life, and its process
``replans``         a backfill's queued runs replaced by fewer, and the runs each took over
``call_slots``      the global cap on LLM calls in flight: one slot per call, N slots in all
``tasks``           tasks submitted over HTTP and the tenant each belongs to
``spend``           the usage and cost of every LLM attempt; budgets reserved before each call
``secrets``         secrets every web process on the database shares (the review forms' key)
==================  ==========================================================================

Every call retries a lost connection for a while (``database``), then raises StoreUnavailable.

The tables are in ``tables``, the typed rows the parts return in ``rows``. Dagster knows nothing of
this package; ``ai_pipeline.defs.resources`` wires it in.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ai_pipeline import analyses
from ai_pipeline.declaration import Declaration
from ai_pipeline.errors import InputError
from ai_pipeline.store.batches import Batches
from ai_pipeline.store.beats import RunBeats
from ai_pipeline.store.checkpoints import Checkpoints
from ai_pipeline.store.database import DEFAULT_RETRY_SECONDS, Database, normalise_url, redact_url
from ai_pipeline.store.documents import Documents
from ai_pipeline.store.events import Events
from ai_pipeline.store.leases import Leases
from ai_pipeline.store.openai_batches import OpenAIBatches
from ai_pipeline.store.replans import Replans
from ai_pipeline.store.results import Results
from ai_pipeline.store.reviews import Reviews
from ai_pipeline.store.secrets import Secrets
from ai_pipeline.store.slots import CallSlots
from ai_pipeline.store.spend import Spend
from ai_pipeline.store.tables import store_info
from ai_pipeline.store.tasks import TenantTasks

if TYPE_CHECKING:
    from ai_pipeline.settings import Settings


class Store:
    """The results database. Safe to share between threads; create one per process."""

    def __init__(
        self,
        url: str,
        *,
        retry_seconds: float | None = None,
        analysis: Declaration = analyses.DEFAULT,
    ):
        self.db = (
            Database(url) if retry_seconds is None else Database(url, retry_seconds=retry_seconds)
        )
        self.url = self.db.url
        self.documents = Documents(self.db)
        self.checkpoints = Checkpoints(self.db)
        self.analysis = analysis
        _hold(self.db, analysis.name)
        self.results = Results(self.db, analysis.document_model)
        self.events = Events(self.db)
        self.reviews = Reviews(self.db)
        self.batches = Batches(self.db)
        self.openai_batches = OpenAIBatches(self.db)
        self.leases = Leases(self.db)
        self.run_beats = RunBeats(self.db)
        self.replans = Replans(self.db)
        self.call_slots = CallSlots(self.db)
        self.tasks = TenantTasks(self.db, self.documents)
        self.spend = Spend(self.db)
        self.secrets = Secrets(self.db)

    def use(self, analysis: Declaration) -> None:
        """Work for a changed declaration of the same analysis (a new release of it): task ids
        built after follow it, and its output's fields are the results columns."""
        if analysis is self.analysis:
            return
        if analysis.document_model is not self.analysis.document_model:
            self.results = Results(self.db, analysis.document_model)
        self.analysis = analysis

    @property
    def dialect(self) -> str:
        return self.db.dialect


class OtherAnalysis(InputError, ValueError):
    """The results database holds another analysis's results."""


def _hold(db: Database, name: str) -> None:
    """Mark the database as holding ``name``'s results (a new one, or one from before analyses
    were named), or refuse it when it holds another's: its results table has their columns."""
    key = store_info.c.key == "analysis"
    claim = db.insert(store_info).values(key="analysis", value=name)
    db.write(lambda conn: conn.execute(claim.on_conflict_do_nothing(index_elements=["key"])))
    held = db.read(lambda conn: conn.execute(sa.select(store_info.c.value).where(key)).scalar_one())
    if held != name:
        raise OtherAnalysis(
            f"the results database {redact_url(db.url)} holds the results of the analysis "
            f"{held!r}, not {name!r}: give each analysis a database of its own "
            "(AI_PIPELINE_DATABASE_URL)"
        )


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def get_store(
    url: str,
    *,
    retry_seconds: float = DEFAULT_RETRY_SECONDS,
    analysis: Declaration = analyses.DEFAULT,
) -> Store:
    """One Store (one engine, one pool) per database URL per process. A results database holds
    the results of one analysis."""
    url = normalise_url(url)
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = Store(url, retry_seconds=retry_seconds, analysis=analysis)
        elif store.analysis.name != analysis.name:
            raise ValueError(
                f"the results database {redact_url(url)} is open for the analysis "
                f"{store.analysis.name!r}, not {analysis.name!r}: each analysis has its own"
            )
        else:
            store.use(analysis)
        store.db.retry_seconds = retry_seconds
        return store


def open_store(settings: Settings) -> Store:
    """The results database the settings name, for their analysis, retried as long as they
    say."""
    return get_store(
        settings.database_url,
        retry_seconds=settings.db_retry_seconds,
        analysis=settings.declaration,
    )


def dispose_stores() -> None:
    """Close every cached Store's connections (tests and a shutting-down process)."""
    with _stores_lock:
        for store in _stores.values():
            store.db.dispose()
        _stores.clear()
