"""Documents and their sources: registration, state along the state machine, and listings.

A document is registered once per content id; each further file with that content only adds an
alias in ``document_sources``. Its state moves only along ``ai_pipeline.states``: ``transition`` is a
compare-and-set, so two writers cannot both move a document out of the same state. Listings return
:class:`DocumentRow` (no text); only ``load`` reads a document's text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.documents import Document, RejectedFile
from ai_pipeline.failures import Category
from ai_pipeline.states import IllegalTransition, State, check_transition
from ai_pipeline.store.database import IN_CHUNK, Database
from ai_pipeline.store.rows import DocumentRow, StoredDocument
from ai_pipeline.store.tables import document_sources, documents

_ROW_COLUMNS = [c for c in documents.columns if c.name != "text"]

# The statements a run makes for every document, built once: SQLAlchemy builds and hashes a
# statement each time one is made, which cost several times executing it (benchmarks/README.md).
_ONE = documents.c.document_id == sa.bindparam("document_id")
_GET = sa.select(*_ROW_COLUMNS).where(_ONE)
_LOAD = sa.select(documents).where(_ONE)
_STATE = sa.select(documents.c.state, documents.c.run_id).where(_ONE)
_SOURCES = sa.select(document_sources).order_by(
    document_sources.c.first_seen_at, document_sources.c.source
)
_KNOWN_SOURCES = sa.select(document_sources.c.source)
# The compare-and-set of ``transition``, per set of columns it writes (and whether it also
# compares the run and counts an attempt): the values are bound as ``set_<column>``.
_MOVES: dict[tuple[tuple[str, ...], bool, bool], Any] = {}


def _move_statement(columns: tuple[str, ...], on_run: bool, count_attempt: bool) -> Any:
    key = (columns, on_run, count_attempt)
    statement = _MOVES.get(key)
    if statement is None:
        where = [
            documents.c.document_id == sa.bindparam("at_document_id"),
            documents.c.state == sa.bindparam("at_state"),
        ]
        if on_run:
            where.append(documents.c.run_id == sa.bindparam("at_run_id"))
        values: dict[str, Any] = {c: sa.bindparam(f"set_{c}") for c in columns}
        if count_attempt:
            values["attempts"] = documents.c.attempts + 1
        statement = _MOVES[key] = sa.update(documents).where(*where).values(values)
    return statement


# The states in which a run leaves a document it has dealt with.
ENDED = (State.COMPLETED, State.FAILED, State.DEAD_LETTER, State.CANCELLED)


class ConcurrentChange(RuntimeError):
    """Another writer moved the document first (a compare-and-set that lost)."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Documents:
    def __init__(self, db: Database):
        self.db = db

    def register(self, doc: Document | RejectedFile) -> bool:
        """Record a document and the file name it came under; True when the document is new.

        A second file with the same content only adds an alias: the document is not analysed again.
        """
        return doc.document_id in self.register_many([doc])

    def register_many(self, docs: Sequence[Document | RejectedFile]) -> set[str]:
        """Record documents and their file names in one transaction; returns the ids that were new.

        The ids already known are looked up ``IN_CHUNK`` at a time and the rows inserted with one
        ``INSERT … ON CONFLICT DO NOTHING`` executed for many rows: registering a thousand files
        costs a few statements, not a thousand transactions. A content already known only adds
        an alias.
        """
        if not docs:
            return set()
        return self.db.write(lambda conn: self.register_in(conn, docs))

    def register_in(self, conn: Connection, docs: Sequence[Document | RejectedFile]) -> set[str]:
        """``register_many`` inside the caller's transaction (with what else it records)."""
        now = utcnow()
        rows: dict[str, dict[str, Any]] = {}
        aliases: dict[tuple[str, str], dict[str, Any]] = {}
        for doc in docs:
            rejected = doc if isinstance(doc, RejectedFile) else None
            rows.setdefault(
                doc.document_id,
                {
                    "document_id": doc.document_id,
                    "source": doc.source,
                    "kind": doc.kind,
                    "size_bytes": doc.size_bytes,
                    "text": doc.text if isinstance(doc, Document) else None,
                    "rejected_reason": rejected.reason if rejected else None,
                    "state": State.PENDING.value,
                    "attempts": 0,
                    "rejected_by_reviewer": False,
                    "cancel_requested": False,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            # A microsecond apart: the file names of one call keep the order they came in.
            aliases.setdefault(
                (doc.document_id, doc.source),
                {
                    "document_id": doc.document_id,
                    "source": doc.source,
                    "first_seen_at": now + timedelta(microseconds=len(aliases)),
                },
            )

        ids = list(rows)
        known: set[str] = set()
        for i in range(0, len(ids), IN_CHUNK):
            chunk = ids[i : i + IN_CHUNK]
            known.update(
                conn.execute(
                    sa.select(documents.c.document_id).where(documents.c.document_id.in_(chunk))
                ).scalars()
            )
        new = [rows[d] for d in ids if d not in known]
        # Many rows, few statements: sqlite3's executemany in C, on PostgreSQL multi-row INSERTs.
        if new:
            conn.execute(
                self.db.for_many_rows(self.db.insert(documents).on_conflict_do_nothing()), new
            )
        conn.execute(
            self.db.for_many_rows(self.db.insert(document_sources).on_conflict_do_nothing()),
            list(aliases.values()),
        )
        return {r["document_id"] for r in new}

    def get(self, document_id: str) -> DocumentRow | None:
        rows = self.db.rows(_GET, {"document_id": document_id})
        return DocumentRow.from_row(rows[0]) if rows else None

    def load(self, document_id: str) -> StoredDocument | None:
        """The document with its text (the only read of a text)."""
        rows = self.db.rows(_LOAD, {"document_id": document_id})
        return StoredDocument.from_row(rows[0]) if rows else None

    def rows(self, document_ids: Iterable[str] | None = None) -> list[DocumentRow]:
        """Documents (all, or these) in registration order, without their texts."""
        query = sa.select(*_ROW_COLUMNS).order_by(documents.c.created_at, documents.c.document_id)
        if document_ids is None:
            return [DocumentRow.from_row(r) for r in self.db.rows(query)]
        rows = self.db.select_in(query, documents.c.document_id, document_ids)
        return sorted(map(DocumentRow.from_row, rows), key=lambda d: (d.created_at, d.document_id))

    def rows_in_state(self, state: State) -> list[DocumentRow]:
        """The documents in one state (an indexed query), in registration order."""
        query = (
            sa.select(*_ROW_COLUMNS)
            .where(documents.c.state == state.value)
            .order_by(documents.c.created_at, documents.c.document_id)
        )
        return [DocumentRow.from_row(r) for r in self.db.rows(query)]

    def summary(self) -> tuple[dict[str, int], dict[str, int]]:
        """Counts of every document by state, and of those not completed by category: one grouped
        query, whatever the number of documents."""
        query = sa.select(documents.c.state, documents.c.category, sa.func.count()).group_by(
            documents.c.state, documents.c.category
        )
        by_state: dict[str, int] = {}
        by_category: dict[str, int] = {}
        for state, category, n in self.db.rows(query):
            by_state[state] = by_state.get(state, 0) + n
            if category and state != State.COMPLETED.value:
                by_category[category] = by_category.get(category, 0) + n
        return dict(sorted(by_state.items())), dict(sorted(by_category.items()))

    def listing(
        self, states: Iterable[State] | None = None, limit: int | None = None
    ) -> list[DocumentRow]:
        """Documents in these states (all states: None), the most recently changed first, at most
        ``limit`` of them: what ``status`` shows at 100,000 documents without reading them all."""
        query = sa.select(*_ROW_COLUMNS).order_by(
            documents.c.updated_at.desc(), documents.c.document_id
        )
        if states is not None:
            query = query.where(documents.c.state.in_([s.value for s in states]))
        if limit is not None:
            query = query.limit(limit)
        return [DocumentRow.from_row(r) for r in self.db.rows(query)]

    def count_in(self, states: Iterable[State]) -> int:
        """How many documents, of all, are in these states (the state column is indexed)."""
        query = (
            sa.select(sa.func.count())
            .select_from(documents)
            .where(documents.c.state.in_([s.value for s in states]))
        )
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))

    def count_by_state(self, document_ids: Iterable[str]) -> dict[State, int]:
        """How many of these documents are in each state (one grouped query per chunk of ids)."""
        wanted = list(dict.fromkeys(document_ids))
        counts: dict[State, int] = {}

        def count(conn: Connection) -> dict[State, int]:
            counts.clear()
            for i in range(0, len(wanted), IN_CHUNK):
                query = (
                    sa.select(documents.c.state, sa.func.count())
                    .where(documents.c.document_id.in_(wanted[i : i + IN_CHUNK]))
                    .group_by(documents.c.state)
                )
                for state, n in conn.execute(query):
                    counts[State(state)] = counts.get(State(state), 0) + n
            return dict(counts)

        return self.db.read(count)

    def ended_in(self, document_ids: Iterable[str], run_ids: Iterable[str]) -> bool:
        """Whether every one of these documents has ended (COMPLETED, FAILED, DEAD_LETTER or
        CANCELLED) in one of these runs: what a backfill's runs made of them, before Dagster's
        backfill daemon comes round to saying so."""
        wanted, runs = list(dict.fromkeys(document_ids)), list(run_ids)
        if not runs:
            return not wanted

        def ended(conn: Connection) -> int:
            found = 0
            for i in range(0, len(wanted), IN_CHUNK):
                query = (
                    sa.select(sa.func.count())
                    .select_from(documents)
                    .where(documents.c.document_id.in_(wanted[i : i + IN_CHUNK]))
                    .where(documents.c.state.in_([s.value for s in ENDED]))
                    .where(documents.c.run_id.in_(runs))
                )
                found += int(conn.execute(query).scalar_one())
            return found

        return self.db.read(ended) == len(wanted)

    def sources(self, document_ids: Iterable[str] | None = None) -> dict[str, list[str]]:
        """Every file name each document arrived under, first seen first."""
        if document_ids is None:
            rows = self.db.rows(_SOURCES)
        else:
            rows = self.db.select_in(_SOURCES, document_sources.c.document_id, document_ids)
            # Each chunk comes back in order; together they must be ordered again.
            rows.sort(key=lambda r: (r.first_seen_at, r.source))
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r.document_id, []).append(r.source)
        return out

    def known_sources(self, sources: Iterable[str]) -> set[str]:
        """Which of these file paths have been registered before (under any content)."""
        rows = self.db.select_in(_KNOWN_SOURCES, document_sources.c.source, sources)
        return {r.source for r in rows}

    def transition(
        self,
        document_id: str,
        target: State,
        *,
        category: Category | None = None,
        error: str | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
        count_attempt: bool = False,
        reset_attempts: bool = False,
        expected_run_id: str | None = None,
        through: State | None = None,
        expected: State | None = None,
        likely: State | None = None,
    ) -> State:
        """Move a document to ``target`` if the state machine allows it; returns the old state.
        With ``through``, the move passes through that state first (unless the document is in it
        already), each step checked, in one update.

        The update is a compare-and-set on the state read (and on ``expected_run_id``, when
        given: the run that holds it), so two writers cannot both move a document out of the same
        state; the loser gets ConcurrentChange. With ``expected``, a document no longer in that
        state (the caller read it earlier) is a ConcurrentChange too. With ``likely``, the state
        the caller knows the document to be in (it holds its claim), the compare-and-set is
        tried on that state first, without the read: when it holds, the outcome is the one the
        read would have led to; when not, the document is read and moved as without it.
        """

        def allowed(current: State) -> None:
            if through is not None:
                check_transition(document_id, current, through)
            check_transition(document_id, through or current, target)

        def moved_from(conn: Connection, current: State) -> bool:
            """The compare-and-set: whether the document was in ``current`` and is moved now."""
            values: dict[str, Any] = {"state": target.value, "updated_at": utcnow()}
            if target == State.COMPLETED:
                values.update(category=None, last_error=None)
            if category is not None:
                values["category"] = category.value
            if error is not None:
                values["last_error"] = error
            if task_id is not None:
                values["task_id"] = task_id
            if run_id is not None:
                values["run_id"] = run_id
            if reset_attempts:
                values["attempts"] = 0
            update = _move_statement(
                tuple(values),
                on_run=expected_run_id is not None,
                count_attempt=count_attempt and not reset_attempts,
            )
            params = {f"set_{c}": v for c, v in values.items()}
            params.update(at_document_id=document_id, at_state=current.value)
            if expected_run_id is not None:
                params["at_run_id"] = expected_run_id
            return bool(conn.execute(update, params).rowcount)

        def move(conn: Connection) -> State:
            if likely is not None and expected in (None, likely):
                try:
                    allowed(likely)
                except IllegalTransition:
                    pass  # read, and fail or move as the state read says
                else:
                    if moved_from(conn, likely):
                        return likely
            row = conn.execute(_STATE, {"document_id": document_id}).first()
            if row is None:
                raise KeyError(f"unknown document {document_id}")
            current = State(row.state)
            if expected is not None and current != expected:
                raise ConcurrentChange(
                    f"document {document_id} is {current.value} now, not {expected.value}"
                )
            if expected_run_id is not None and row.run_id != expected_run_id:
                raise ConcurrentChange(
                    f"document {document_id} is held by run {row.run_id}, not {expected_run_id}"
                )
            allowed(current)
            if not moved_from(conn, current):
                raise ConcurrentChange(f"document {document_id} changed state concurrently")
            return current

        # The update checks what was read by itself: no transaction needed around the two.
        return self.db.write_each(move)

    def queue(self, document_ids: Iterable[str]) -> int:
        """Move those of these documents that are PENDING to QUEUED, one UPDATE per chunk of ids
        (a sensor tick of a thousand new documents is two statements); returns how many moved."""
        check_transition("-", State.PENDING, State.QUEUED)
        wanted = list(dict.fromkeys(document_ids))

        def move(conn: Connection) -> int:
            moved = 0
            for i in range(0, len(wanted), IN_CHUNK):
                moved += conn.execute(
                    sa.update(documents)
                    .where(documents.c.document_id.in_(wanted[i : i + IN_CHUNK]))
                    .where(documents.c.state == State.PENDING.value)
                    .values(state=State.QUEUED.value, updated_at=utcnow())
                ).rowcount
            return moved

        return self.db.write(move)

    def request_cancel(self, document_id: str) -> bool:
        """Ask the run that holds a RUNNING document to stop it (``Analyser`` checks before it
        goes on); False when it is not RUNNING any more."""
        return bool(
            self.db.write(
                lambda conn: (
                    conn.execute(
                        sa.update(documents)
                        .where(documents.c.document_id == document_id)
                        .where(documents.c.state == State.RUNNING.value)
                        .values(cancel_requested=True, updated_at=utcnow())
                    ).rowcount
                )
            )
        )

    def set_task_id(self, document_id: str, task: str) -> None:
        """The task a completed document's current analysis came from (after a re-analysis)."""
        update = (
            sa.update(documents)
            .where(documents.c.document_id == document_id)
            .values(task_id=task, updated_at=utcnow())
        )
        self.db.write(lambda conn: conn.execute(update))

    def set_sections(self, document_id: str, sections: int) -> None:
        """Record how many sections a long document was cut into (what progress counts)."""
        self.db.write(
            lambda conn: conn.execute(
                sa.update(documents)
                .where(documents.c.document_id == document_id)
                .where(sa.or_(documents.c.sections.is_(None), documents.c.sections != sections))
                .values(sections=sections)
            )
        )

    def cancel_requested(self, document_id: str) -> bool:
        rows = self.db.rows(
            sa.select(documents.c.cancel_requested).where(documents.c.document_id == document_id)
        )
        return bool(rows and rows[0][0])

    def mark_rejected(self, document_id: str, message: str) -> None:
        """A reviewer rejected the document: it is settled, and ``message`` says why."""
        updated = self.db.write(
            lambda conn: (
                conn.execute(
                    sa.update(documents)
                    .where(documents.c.document_id == document_id)
                    .values(rejected_by_reviewer=True, status_message=message, updated_at=utcnow())
                ).rowcount
            )
        )
        if not updated:
            raise KeyError(f"unknown document {document_id}")
