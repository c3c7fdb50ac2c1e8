"""The ``documents`` dynamic partitions: one partition per document, keyed by its content id."""

import dagster as dg

documents_partitions = dg.DynamicPartitionsDefinition(name="documents")
