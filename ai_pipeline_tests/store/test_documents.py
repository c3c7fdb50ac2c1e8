"""Documents and their sources: registration, aliases, listings without texts, state transitions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from ai_pipeline.documents import Document, RejectedFile, load, parse_document
from ai_pipeline.failures import Category
from ai_pipeline.states import IllegalTransition, State
from ai_pipeline.store import Store
from ai_pipeline.store.rows import DocumentRow, StoredDocument


def _doc(text: str, source: str = "doc.txt") -> Document:
    return parse_document(text.encode("utf-8"), source)


def test_register_new_document_returns_true_then_false(store: Store) -> None:
    """The first registration of a document is new; registering it again is not."""
    doc = _doc("Quarterly report of Northwind Traders.", "q3.txt")
    assert store.documents.register(doc) is True
    assert store.documents.register(doc) is False
    (row,) = store.documents.rows()
    assert row.document_id == doc.document_id
    assert (row.state, row.attempts, row.rejected_reason) == (State.PENDING, 0, None)
    assert (row.source, row.kind, row.size_bytes) == ("q3.txt", "txt", doc.size_bytes)
    assert row.rejected_by_reviewer is False
    assert row.created_at.tzinfo is not None and row.updated_at.tzinfo is not None
    loaded = store.documents.load(doc.document_id)
    assert isinstance(loaded, StoredDocument) and loaded.text == doc.text


def test_listings_never_carry_a_text(store: Store) -> None:
    """rows() and get() return DocumentRow, which has no text; only load() reads it."""
    doc = _doc("A long text that listings must not load.", "long.txt")
    store.documents.register(doc)
    for row in [*store.documents.rows(), store.documents.get(doc.document_id)]:
        assert type(row) is DocumentRow
        assert not hasattr(row, "text")


def test_same_content_under_another_name_is_an_alias(store: Store) -> None:
    """A second file with the same content adds a source, not a document; the first name stays."""
    first = _doc("Same content.", "inbox/a.txt")
    second = _doc("Same content.", "inbox/copy-of-a.txt")
    assert first.document_id == second.document_id
    assert store.documents.register(first) is True
    assert store.documents.register(second) is False
    assert store.documents.register(second) is False
    sources = store.documents.sources()
    assert sources == {first.document_id: ["inbox/a.txt", "inbox/copy-of-a.txt"]}
    assert store.documents.sources([first.document_id]) == sources
    assert store.documents.sources(["unknown"]) == {}
    got = store.documents.get(first.document_id)
    assert got is not None and got.source == "inbox/a.txt"
    assert len(store.documents.rows()) == 1
    assert store.documents.known_sources(["inbox/a.txt", "inbox/b.txt"]) == {"inbox/a.txt"}


def test_rejected_file_is_registered_with_its_reason(store: Store, tmp_path: Path) -> None:
    """A rejected file becomes a PENDING document without text and with its reason."""
    path = tmp_path / "sheet.xlsx"
    path.write_bytes(b"PK\x03\x04 not a workbook")
    rejected = RejectedFile(
        document_id="0123456789abcdef0123",
        source=str(path),
        kind="xlsx",
        size_bytes=22,
        reason="unsupported file type '.xlsx'",
    )
    assert store.documents.register(rejected) is True
    row = store.documents.load(rejected.document_id)
    assert row is not None
    assert row.text is None
    assert row.rejected_reason == "unsupported file type '.xlsx'"
    assert (row.kind, row.size_bytes, row.state) == ("xlsx", 22, State.PENDING)
    assert store.documents.sources() == {rejected.document_id: [str(path)]}


def test_rejected_file_with_a_long_suffix_can_be_registered(store: Store, tmp_path: Path) -> None:
    """A file whose "suffix" is longer than 16 characters is registered like any rejected file."""
    path = tmp_path / "Meeting notes v2.final-version-approved"
    path.write_text("minutes", encoding="utf-8")
    rejected = load(path)
    assert isinstance(rejected, RejectedFile)
    assert rejected.kind == "other"
    assert store.documents.register(rejected) is True
    got = store.documents.get(rejected.document_id)
    assert got is not None and got.state == State.PENDING


def test_unknown_ids_give_none_and_nothing(store: Store) -> None:
    """Looking up an id that was never registered gives None, and no rows."""
    assert store.documents.get("does-not-exist") is None
    assert store.documents.load("does-not-exist") is None
    assert store.documents.rows(["does-not-exist"]) == []


def test_rows_filters_by_id_across_many_ids(store: Store) -> None:
    """rows(ids) returns only those documents, in registration order, for more ids than one IN
    list may hold."""
    docs = [_doc(f"document number {i}") for i in range(1200)]
    for d in docs:
        store.documents.register(d)
    wanted = [d.document_id for d in docs[::2]]
    got = store.documents.rows(wanted + ["unknown"])
    assert [r.document_id for r in got] == wanted
    assert len(store.documents.rows()) == 1200
    assert set(store.documents.sources(wanted)) == set(wanted)


def test_transitions_follow_the_state_machine_and_count_attempts(store: Store) -> None:
    """Legal moves update state, error, category and attempts; the old state is returned."""
    doc = _doc("A document that fails once and then completes.")
    store.documents.register(doc)
    did, move = doc.document_id, store.documents.transition
    assert move(did, State.QUEUED) is State.PENDING
    assert move(did, State.RUNNING, run_id="run-1", count_attempt=True) is State.QUEUED
    assert (
        move(
            did,
            State.FAILED,
            category=Category.NETWORK_TIMEOUT,
            error="timed out after 60 s",
            task_id="task-1",
        )
        is State.RUNNING
    )
    row = store.documents.get(did)
    assert row is not None
    assert (row.state, row.attempts, row.run_id, row.task_id) == (
        State.FAILED,
        1,
        "run-1",
        "task-1",
    )
    assert (row.category, row.last_error) == (Category.NETWORK_TIMEOUT, "timed out after 60 s")
    move(did, State.QUEUED)
    move(did, State.RUNNING, run_id="run-2", count_attempt=True)
    assert move(did, State.COMPLETED) is State.RUNNING
    row = store.documents.get(did)
    assert row is not None
    assert (row.state, row.attempts, row.run_id) == (State.COMPLETED, 2, "run-2")
    assert row.category is None and row.last_error is None


def test_illegal_transition_raises_and_changes_nothing(store: Store) -> None:
    """An illegal move raises IllegalTransition and leaves state and attempts as they were."""
    doc = _doc("Illegal moves are refused.")
    store.documents.register(doc)
    did = doc.document_id
    with pytest.raises(IllegalTransition) as info:
        store.documents.transition(did, State.COMPLETED, count_attempt=True)
    assert (info.value.current, info.value.target) == (State.PENDING, State.COMPLETED)
    assert "PENDING -> COMPLETED" in str(info.value)
    row = store.documents.get(did)
    assert row is not None and (row.state, row.attempts) == (State.PENDING, 0)
    store.documents.transition(did, State.CANCELLED)
    with pytest.raises(IllegalTransition, match="CANCELLED -> QUEUED"):
        store.documents.transition(did, State.QUEUED)
    row = store.documents.get(did)
    assert row is not None and row.state == State.CANCELLED


def test_a_move_through_a_state_checks_both_steps_in_one_update(store: Store) -> None:
    """``through`` moves PENDING, FAILED or QUEUED on to RUNNING as two legal steps would; a step
    the state machine forbids is refused and changes nothing."""
    docs = [_doc(f"Moved through QUEUED, number {i}.") for i in range(3)]
    for d in docs:
        store.documents.register(d)
    pending, failed, queued = (d.document_id for d in docs)
    move = store.documents.transition
    for did in (failed, queued):
        move(did, State.QUEUED)
    move(failed, State.RUNNING)
    move(failed, State.FAILED, category=Category.NETWORK_TIMEOUT)
    assert move(pending, State.RUNNING, through=State.QUEUED, run_id="r") is State.PENDING
    assert move(failed, State.RUNNING, through=State.QUEUED, run_id="r") is State.FAILED
    assert move(queued, State.RUNNING, through=State.QUEUED, run_id="r") is State.QUEUED
    rows = store.documents.rows([pending, failed, queued])
    assert {(r.state, r.run_id) for r in rows} == {(State.RUNNING, "r")}
    move(pending, State.COMPLETED)
    with pytest.raises(IllegalTransition, match="COMPLETED -> QUEUED"):
        move(pending, State.RUNNING, through=State.QUEUED)
    row = store.documents.get(pending)
    assert row is not None and row.state == State.COMPLETED


def test_same_state_transition_is_a_no_op_that_may_count_an_attempt(store: Store) -> None:
    """Moving to the current state succeeds; count_attempt still counts it."""
    doc = _doc("Same state twice.")
    store.documents.register(doc)
    did = doc.document_id
    assert store.documents.transition(did, State.PENDING) is State.PENDING
    store.documents.transition(did, State.QUEUED)
    store.documents.transition(did, State.RUNNING, count_attempt=True)
    store.documents.transition(did, State.RUNNING, count_attempt=True)
    row = store.documents.get(did)
    assert row is not None and (row.state, row.attempts) == (State.RUNNING, 2)


def test_a_move_from_the_likely_state_needs_no_read_and_any_other_moves_as_without_it(
    store: Store,
) -> None:
    """With ``likely`` right, a move is one statement (the compare-and-set), not a read and a
    write; with it wrong, or naming a state the move is not allowed from, the document is read and
    moved, or refused, from the state it is really in."""
    docs = [_doc(f"Moved from a likely state, number {i}.") for i in range(2)]
    for d in docs:
        store.documents.register(d)
    one, other = (d.document_id for d in docs)
    sent: list[str] = []
    engines = {store.db.engine, store.db._autocommit}  # noqa: SLF001
    for engine in engines:
        sa.event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    move = store.documents.transition

    def statements(call: Callable[[], object]) -> tuple[object, list[str]]:
        sent.clear()
        result = call()
        return result, [s.split()[0] for s in sent if s.split()[0] in ("SELECT", "UPDATE")]

    assert statements(lambda: move(one, State.QUEUED, likely=State.PENDING)) == (
        State.PENDING,
        ["UPDATE"],
    )
    # Wrong: it is QUEUED, not PENDING; read, then moved from QUEUED.
    assert statements(
        lambda: move(one, State.RUNNING, through=State.QUEUED, run_id="r", likely=State.PENDING)
    ) == (State.QUEUED, ["UPDATE", "SELECT", "UPDATE"])
    # A state the move is not allowed from: read at once, moved from the state read.
    assert statements(
        lambda: move(other, State.RUNNING, through=State.QUEUED, likely=State.COMPLETED)
    ) == (State.PENDING, ["SELECT", "UPDATE"])
    assert statements(lambda: move(one, State.COMPLETED, likely=State.RUNNING)) == (
        State.RUNNING,
        ["UPDATE"],
    )
    with pytest.raises(IllegalTransition, match="COMPLETED -> FAILED"):
        move(one, State.FAILED, likely=State.RUNNING)
    rows = {r.document_id: r for r in store.documents.rows([one, other])}
    assert (rows[one].state, rows[one].run_id) == (State.COMPLETED, "r")
    assert (rows[other].state, rows[other].run_id) == (State.RUNNING, None)


def test_transition_of_unknown_document_is_a_key_error(store: Store) -> None:
    """Moving a document that was never registered raises KeyError naming it."""
    with pytest.raises(KeyError, match="unknown document nope"):
        store.documents.transition("nope", State.QUEUED)


def test_a_reviewer_rejection_is_its_own_flag(store: Store) -> None:
    """mark_rejected sets rejected_by_reviewer and the message, and leaves the state alone."""
    doc = _doc("Rejected by a person.")
    store.documents.register(doc)
    store.documents.mark_rejected(doc.document_id, "您的材料存在文件损坏问题 / damaged")
    row = store.documents.get(doc.document_id)
    assert row is not None
    assert row.rejected_by_reviewer is True
    assert row.status_message == "您的材料存在文件损坏问题 / damaged"
    assert row.state == State.PENDING
    with pytest.raises(KeyError):
        store.documents.mark_rejected("nope", "x")


def test_register_many_records_a_thousand_files_in_one_call(
    store: Store, sent: list[tuple[str, int]]
) -> None:
    """register_many: new ids returned once, aliases recorded, a content known before (or twice
    in the same call) not a new document; more rows than one IN chunk."""
    known = _doc("Known before the batch.", "old.txt")
    store.documents.register(known)
    docs = [_doc(f"Document number {i}.", f"inbox/d{i:04d}.txt") for i in range(1200)]
    copies = [_doc("Document number 7.", "inbox/copy-of-7.txt"), _doc(known.text, "again.txt")]
    rejected = RejectedFile("r" * 64, "inbox/bad.pdf", "pdf", 0, "the file is empty")

    sent.clear()
    new = store.documents.register_many([*docs, *copies, rejected])

    assert new == {d.document_id for d in docs} | {rejected.document_id}
    inserts = [on_the_wire for verb, on_the_wire in sent if verb == "INSERT"]
    if store.db.dialect == "postgresql":
        # psycopg2's executemany sends each row by itself: the rows go as multi-row INSERTs,
        # a thousand at most, of the 1,201 documents and then of their 1,203 file names.
        assert inserts == [1, 1, 1, 1]
    else:
        # sqlite3's executemany runs in the driver, in-process.
        assert inserts == [1201, 1203]
    assert len(store.documents.rows()) == 1202
    sources = store.documents.sources([docs[7].document_id, known.document_id])
    assert sources[docs[7].document_id] == ["inbox/d0007.txt", "inbox/copy-of-7.txt"]
    assert sources[known.document_id] == ["old.txt", "again.txt"]
    assert store.documents.register_many(docs[:10]) == set()
    assert store.documents.register_many([]) == set()


def test_summary_listing_and_counts_never_list_every_document(store: Store) -> None:
    """summary() counts by state and category in SQL; listing() filters by state, newest change
    first, limited; count_by_state() counts a set of ids across IN chunks."""
    docs = [_doc(f"Text {i}.", f"t{i}.txt") for i in range(700)]
    store.documents.register_many(docs)
    for d in docs[:3]:
        store.documents.transition(d.document_id, State.QUEUED)
        store.documents.transition(d.document_id, State.RUNNING)
        store.documents.transition(
            d.document_id, State.FAILED, category=Category.NETWORK_TIMEOUT, error="timed out"
        )

    by_state, by_category = store.documents.summary()
    assert by_state == {"FAILED": 3, "PENDING": 697}
    assert by_category == {"NETWORK_TIMEOUT": 3}
    failed = store.documents.listing([State.FAILED])
    assert {d.document_id for d in failed} == {d.document_id for d in docs[:3]}
    assert [d.updated_at for d in failed] == sorted((d.updated_at for d in failed), reverse=True)
    assert len(store.documents.listing(limit=10)) == 10
    assert store.documents.listing([State.COMPLETED]) == []
    counts = store.documents.count_by_state([d.document_id for d in docs[:600]])
    assert counts == {State.FAILED: 3, State.PENDING: 597}


def test_queue_moves_only_pending_documents(store: Store) -> None:
    """queue(): PENDING → QUEUED in bulk; a document in any other state is left where it is."""
    docs = [_doc(f"Queued text {i}.", f"q{i}.txt") for i in range(600)]
    store.documents.register_many(docs)
    running = docs[0].document_id
    store.documents.transition(running, State.QUEUED)
    store.documents.transition(running, State.RUNNING)

    assert store.documents.queue([d.document_id for d in docs]) == 599
    counts = store.documents.count_by_state([d.document_id for d in docs])
    assert counts == {State.QUEUED: 599, State.RUNNING: 1}
    assert store.documents.queue([d.document_id for d in docs]) == 0


def test_ended_in_says_whether_these_runs_ended_every_document(store: Store) -> None:
    """True only when each document ended (completed, failed, …) in one of the runs named: one
    still running, one ended in another run, one never registered each make it False."""
    docs = [_doc(f"Contract {i} of Harbor Supplies.", f"c{i}.txt") for i in range(3)]
    for d in docs:
        store.documents.register(d)
    a, b, c = (d.document_id for d in docs)
    store.documents.queue([a, b, c])
    for doc_id, run in ((a, "run-1"), (b, "run-2"), (c, "run-1")):
        store.documents.transition(doc_id, State.RUNNING, run_id=run)
    store.documents.transition(a, State.COMPLETED)
    store.documents.transition(b, State.FAILED, category=Category.NETWORK_TIMEOUT)

    assert store.documents.ended_in([a, b], ["run-1", "run-2"]) is True
    assert store.documents.ended_in([a, b, c], ["run-1", "run-2"]) is False  # c still RUNNING
    assert store.documents.ended_in([a, b], ["run-1"]) is False  # b ended in another run
    assert store.documents.ended_in([a, "0" * 20], ["run-1"]) is False  # never registered
    assert store.documents.ended_in([], []) is True
    store.documents.transition(c, State.COMPLETED)
    assert store.documents.ended_in([a, b, c], ["run-1", "run-2"]) is True
