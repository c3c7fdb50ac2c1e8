"""Intake: files become registered documents, and new documents are cut into run-sized batches.

Shared by the inbox sensor and the CLI so that both register documents the same way: a file is
read, its content id computed and recorded with the file name; a file whose content is already
known only adds an alias; a file that cannot be read is recorded too, as a document that will fail
with INPUT_QUALITY_ISSUE and a reason naming the file, and the rest of the batch goes on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ai_pipeline.documents import Document, RejectedFile, load
from ai_pipeline.store import Store


@dataclass(frozen=True)
class Registered:
    document_id: str
    source: str
    rejected_reason: str | None = None
    # The first file of its content this store has seen (not an alias of a known document).
    new: bool = False


FILES_PER_TRANSACTION = 500


def register_files(
    store: Store,
    paths: Iterable[Path],
    *,
    max_bytes: int,
    progress: Callable[[int], None] | None = None,
) -> list[Registered]:
    """Read and record each file, ``FILES_PER_TRANSACTION`` files to a transaction; never raises
    for a bad file. ``progress`` hears the number of files registered so far after each
    transaction."""
    out: list[Registered] = []
    chunk: list[Document | RejectedFile] = []

    def flush() -> None:
        new = store.documents.register_many(chunk)
        out.extend(
            Registered(
                document_id=doc.document_id,
                source=doc.source,
                rejected_reason=doc.reason if isinstance(doc, RejectedFile) else None,
                new=doc.document_id in new,
            )
            for doc in chunk
        )
        chunk.clear()
        if progress is not None:
            progress(len(out))

    for path in paths:
        chunk.append(load(path, max_bytes=max_bytes))
        if len(chunk) >= FILES_PER_TRANSACTION:
            flush()
    if chunk:
        flush()
    return out


def unique_in_order(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def batches(document_ids: Sequence[str], size: int) -> list[list[str]]:
    return [list(document_ids[i : i + size]) for i in range(0, len(document_ids), size)]


# The run tag of a batch's backfill and of its runs: the batch id.
BATCH_TAG = "ai_pipeline/batch"


def batch_key(document_ids: Iterable[str]) -> str:
    """A deterministic id for a set of documents (order does not matter)."""
    digest = hashlib.sha256("\n".join(sorted(document_ids)).encode("utf-8")).hexdigest()
    return digest[:16]


def contiguous_ranges(
    selected: Iterable[str], ordered_keys: Sequence[str], max_size: int
) -> list[list[str]]:
    """Cut ``selected`` keys into runs of contiguous partitions of at most ``max_size`` each.

    A range run covers every partition between its first and last key, so a range must not jump
    over a key that was not selected (it would be run again for nothing).
    """
    position = {key: i for i, key in enumerate(ordered_keys)}
    wanted = sorted({k for k in selected if k in position}, key=position.__getitem__)
    ranges: list[list[str]] = []
    for key in wanted:
        current = ranges[-1] if ranges else None
        if (
            current is not None
            and len(current) < max_size
            and position[key] == position[current[-1]] + 1
        ):
            current.append(key)
        else:
            ranges.append([key])
    return ranges
