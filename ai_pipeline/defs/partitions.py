"""The ``documents`` dynamic partitions: one partition per document, keyed by its content id."""

import dagster as dg

PARTITIONS_NAME = "documents"
documents_partitions = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)
