"""The ``documents`` dynamic partitions: one partition per document, keyed by its content id; and
the documents a run works on, when it names them.

A run covers a range of partitions (Dagster's range tags). A run that should work on some of the
documents of its range only — a backfill of scattered failures, batched into few runs — names
them in its run config (``naming_config``); the analysis step then works on those alone, and the
others of the range cost nothing: no call, no event.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

PARTITIONS_NAME = "documents"
documents_partitions = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)

# Partition keys per statement: well under SQLite's bound-parameter limit on any build.
KEYS_PER_QUERY = 500
# The analysis step's name (its op in run config) and the config key naming a run's documents.
ANALYSIS_OP = "analyse_documents"
NAMED_DOCUMENTS = "documents"


def naming_config(document_ids: Sequence[str], op: str = ANALYSIS_OP) -> dict[str, Any]:
    """Run config that makes a range run (of the analysis step ``op``) work on these documents
    of its range only."""
    return {"ops": {op: {"config": {NAMED_DOCUMENTS: list(document_ids)}}}}


def named_in(run_config: Mapping[str, Any] | None) -> set[str] | None:
    """The documents a run's config names (``naming_config``), or None: all of its range."""
    for op_config in ((run_config or {}).get("ops") or {}).values():
        named = named_by((op_config or {}).get("config"))
        if named is not None:
            return named
    return None


def named_by(op_config: Any) -> set[str] | None:
    """The documents the analysis step's own config names, or None: all of its range."""
    if isinstance(op_config, Mapping) and op_config.get(NAMED_DOCUMENTS) is not None:
        return {str(d) for d in op_config[NAMED_DOCUMENTS]}
    return None


def missing_partitions(
    instance: dg.DagsterInstance, document_ids: Sequence[str], partitions: str = PARTITIONS_NAME
) -> list[str]:
    """The documents (in order, once each) that are not yet partitions: one query per
    ``KEYS_PER_QUERY`` ids, not one per document (``get_existing_dynamic_partitions`` is the
    instance's bounded membership query, not marked public in Dagster 1.13)."""
    wanted = list(dict.fromkeys(document_ids))
    existing: set[str] = set()
    for i in range(0, len(wanted), KEYS_PER_QUERY):
        existing |= instance.get_existing_dynamic_partitions(
            partitions, wanted[i : i + KEYS_PER_QUERY]
        )
    return [d for d in wanted if d not in existing]


def add_partitions(
    instance: dg.DagsterInstance, document_ids: Sequence[str], partitions: str = PARTITIONS_NAME
) -> list[str]:
    """Add the documents that are not yet partitions; returns those it added."""
    missing = missing_partitions(instance, document_ids, partitions)
    for i in range(0, len(missing), KEYS_PER_QUERY):
        instance.add_dynamic_partitions(partitions, missing[i : i + KEYS_PER_QUERY])
    return missing
