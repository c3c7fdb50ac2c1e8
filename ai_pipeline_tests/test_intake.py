"""Unit tests of ai_pipeline.intake: registering files and cutting documents into runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ai_pipeline.documents import DEFAULT_MAX_DOCUMENT_BYTES, read_document
from ai_pipeline.inbox import list_files
from ai_pipeline.intake import (
    Registered,
    batch_key,
    batches,
    contiguous_ranges,
    register_files,
    unique_in_order,
)
from ai_pipeline.store import Store
from ai_pipeline_tests.support import EXAMPLES

INBOX = EXAMPLES / "inbox"
BAD = EXAMPLES / "bad"
COPY = BAD / "copy-of-support-ticket-refund-delay.txt"
ORIGINAL = INBOX / "support-ticket-refund-delay.txt"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A Store on a new temporary SQLite file."""
    s = Store(f"sqlite:///{tmp_path / 'intake.sqlite'}")
    yield s
    s.db.dispose()


def _register_examples(store: Store) -> list[Registered]:
    paths = list_files([INBOX]).files + list_files([BAD]).files
    return register_files(store, paths, max_bytes=DEFAULT_MAX_DOCUMENT_BYTES)


def test_register_examples_counts_new_duplicate_and_rejected(store: Store) -> None:
    """The 16 inbox files are new; of the 5 bad files 4 are rejected (new) and 1 is a duplicate."""
    registered = _register_examples(store)
    assert len(registered) == 21
    first_seen = {r.document_id: r for r in reversed(registered)}
    duplicates = [r for r in registered if first_seen[r.document_id] is not r]
    rejected = [r for r in registered if r.rejected_reason]
    assert (len(first_seen), len(duplicates), len(rejected)) == (20, 1, 4)
    assert [r.source for r in duplicates] == [str(COPY)]
    assert {Path(r.source).name for r in rejected} == {
        "empty.txt",
        "binary-garbage.txt",
        "spreadsheet.xlsx",
        "scanned-no-text.pdf",
    }
    assert all(first_seen[r.document_id] is r for r in rejected)
    assert len(store.documents.rows()) == 20


def test_registered_records_carry_id_source_and_reason(store: Store) -> None:
    """Each Registered names its file and id; only rejected files carry a reason."""
    registered = {Path(r.source).name: r for r in _register_examples(store)}
    assert registered["empty.txt"].rejected_reason == "the file is empty"
    assert registered["spreadsheet.xlsx"].rejected_reason.startswith(  # type: ignore[union-attr]
        "unsupported file type '.xlsx'"
    )
    assert registered["q3-report-northwind.pdf"].rejected_reason is None
    original = registered[ORIGINAL.name]
    assert original.document_id == read_document(ORIGINAL).document_id
    assert registered[COPY.name].document_id == original.document_id
    row = store.documents.get(registered["empty.txt"].document_id)
    assert row is not None and row.rejected_reason == "the file is empty"


def test_duplicate_is_recorded_as_an_alias(store: Store) -> None:
    """The copy in examples/bad is an alias of the inbox original."""
    registered = _register_examples(store)
    original_id = next(r.document_id for r in registered if r.source == str(ORIGINAL))
    assert store.documents.sources([original_id]) == {original_id: [str(ORIGINAL), str(COPY)]}


def test_registering_again_finds_nothing_new(store: Store) -> None:
    """A second registration of the same files reports every one as already known."""
    first = _register_examples(store)
    second = _register_examples(store)
    assert [r.document_id for r in second] == [r.document_id for r in first]
    assert len(store.documents.rows()) == 20


def test_oversize_file_is_rejected_not_raised(store: Store) -> None:
    """A file over max_bytes is registered as rejected and the rest of the batch goes on."""
    small = INBOX / "support-ticket-password-reset-thanks.txt"
    big = INBOX / "postmortem-checkout-outage-march.md"
    registered = register_files(store, [big, small], max_bytes=1_000)
    assert registered[0].rejected_reason is not None
    assert registered[0].rejected_reason.startswith("too large")
    assert registered[1].rejected_reason is None
    assert len(store.documents.rows()) == 2


def test_unique_in_order_keeps_the_first_occurrence() -> None:
    """unique_in_order drops repeats and keeps first-seen order."""
    assert unique_in_order(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]
    assert unique_in_order([]) == []


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (2, [["a", "b"], ["c", "d"], ["e"]]),
        (5, [["a", "b", "c", "d", "e"]]),
        (10, [["a", "b", "c", "d", "e"]]),
        (1, [["a"], ["b"], ["c"], ["d"], ["e"]]),
    ],
)
def test_batches_cut_in_order_of_at_most_size(size: int, expected: list[list[str]]) -> None:
    """batches cuts a list into consecutive lists of at most ``size`` items."""
    assert batches(["a", "b", "c", "d", "e"], size) == expected


def test_batches_of_nothing_is_empty() -> None:
    """No ids give no batches."""
    assert batches([], 3) == []


def test_batch_key_is_order_independent_and_distinct() -> None:
    """The batch key ignores order but changes with the set of ids."""
    key = batch_key(["b", "a", "c"])
    assert key == batch_key(["a", "b", "c"]) == batch_key(iter(["c", "b", "a"]))
    assert len(key) == 16 and all(ch in "0123456789abcdef" for ch in key)
    assert batch_key(["a", "b"]) != key
    assert batch_key(["a", "b", "d"]) != key


ORDERED = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"]


def test_contiguous_ranges_split_at_gaps() -> None:
    """A key that was not selected splits the selection into two ranges."""
    assert contiguous_ranges(["k0", "k1", "k3", "k4", "k7"], ORDERED, 10) == [
        ["k0", "k1"],
        ["k3", "k4"],
        ["k7"],
    ]


def test_contiguous_ranges_respect_max_size() -> None:
    """A contiguous run longer than max_size is cut into ranges of at most max_size."""
    ranges = contiguous_ranges(ORDERED, ORDERED, 3)
    assert ranges == [["k0", "k1", "k2"], ["k3", "k4", "k5"], ["k6", "k7"]]
    assert all(len(r) <= 3 for r in ranges)


def test_contiguous_ranges_drop_unknown_keys_and_duplicates() -> None:
    """Keys not in ordered_keys are dropped; a key selected twice appears once."""
    assert contiguous_ranges(["k2", "zzz", "k1", "k2", "k9"], ORDERED, 5) == [["k1", "k2"]]
    assert contiguous_ranges(["nope"], ORDERED, 5) == []
    assert contiguous_ranges([], ORDERED, 5) == []


def test_contiguous_ranges_follow_the_order_of_ordered_keys() -> None:
    """Ranges come in the order of ordered_keys, not the order the keys were selected in."""
    selected = ["k6", "k2", "k5", "k1"]
    assert contiguous_ranges(selected, ORDERED, 10) == [["k1", "k2"], ["k5", "k6"]]
    reversed_order = list(reversed(ORDERED))
    assert contiguous_ranges(selected, reversed_order, 10) == [["k6", "k5"], ["k2", "k1"]]


def test_contiguous_ranges_cover_exactly_the_selection() -> None:
    """Every selected known key is in exactly one range and no unselected key is in any."""
    selected = {"k0", "k2", "k3", "k4", "k5", "k7"}
    ranges = contiguous_ranges(selected, ORDERED, 2)
    flat = [k for r in ranges for k in r]
    assert sorted(flat) == sorted(selected)
    assert ranges == [["k0"], ["k2", "k3"], ["k4", "k5"], ["k7"]]
    for r in ranges:
        positions = [ORDERED.index(k) for k in r]
        assert positions == list(range(positions[0], positions[0] + len(r)))
