"""The ``documents`` dynamic partitions: one partition per document, keyed by its content id."""

from collections.abc import Sequence

import dagster as dg

PARTITIONS_NAME = "documents"
documents_partitions = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)

# Partition keys per statement: well under SQLite's bound-parameter limit on any build.
KEYS_PER_QUERY = 500


def missing_partitions(instance: dg.DagsterInstance, document_ids: Sequence[str]) -> list[str]:
    """The documents (in order, once each) that are not yet partitions: one query per
    ``KEYS_PER_QUERY`` ids, not one per document (``get_existing_dynamic_partitions`` is the
    instance's bounded membership query, not marked public in Dagster 1.13)."""
    wanted = list(dict.fromkeys(document_ids))
    existing: set[str] = set()
    for i in range(0, len(wanted), KEYS_PER_QUERY):
        existing |= instance.get_existing_dynamic_partitions(
            PARTITIONS_NAME, wanted[i : i + KEYS_PER_QUERY]
        )
    return [d for d in wanted if d not in existing]


def add_partitions(instance: dg.DagsterInstance, document_ids: Sequence[str]) -> list[str]:
    """Add the documents that are not yet partitions; returns those it added."""
    missing = missing_partitions(instance, document_ids)
    for i in range(0, len(missing), KEYS_PER_QUERY):
        instance.add_dynamic_partitions(PARTITIONS_NAME, missing[i : i + KEYS_PER_QUERY])
    return missing
