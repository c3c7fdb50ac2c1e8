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
==================  ==========================================================================

The tables are in ``tables``, the typed rows the parts return in ``rows``. Dagster knows nothing of
this package; ``ai_pipeline.defs.resources`` wires it in.
"""

from __future__ import annotations

import threading

from ai_pipeline.store.batches import Batches
from ai_pipeline.store.checkpoints import Checkpoints
from ai_pipeline.store.database import Database, normalise_url
from ai_pipeline.store.documents import Documents
from ai_pipeline.store.events import Events
from ai_pipeline.store.results import Results
from ai_pipeline.store.reviews import Reviews


class Store:
    """The results database. Safe to share between threads; create one per process."""

    def __init__(self, url: str):
        self.db = Database(url)
        self.url = self.db.url
        self.documents = Documents(self.db)
        self.checkpoints = Checkpoints(self.db)
        self.results = Results(self.db)
        self.events = Events(self.db)
        self.reviews = Reviews(self.db)
        self.batches = Batches(self.db)

    @property
    def dialect(self) -> str:
        return self.db.dialect


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def get_store(url: str) -> Store:
    """One Store (one engine, one pool) per database URL per process."""
    url = normalise_url(url)
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = Store(url)
        return store


def dispose_stores() -> None:
    """Close every cached Store's connections (tests and a shutting-down process)."""
    with _stores_lock:
        for store in _stores.values():
            store.db.dispose()
        _stores.clear()
