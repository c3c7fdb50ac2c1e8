"""The results IO manager: one upserted row per document, loaded back as a pandas DataFrame.

It owns the writes to the results table. A range step cannot hand Dagster one ``Output`` per
document, so the analysis step writes each validated document through ``upsert`` — the same code
path ``handle_output`` uses — and downstream assets (the failure report) read the rows through
``load_input``, one column per field of the analysis's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg

from ai_pipeline.defs.resources import ResultsStore
from ai_pipeline.store.rows import ResultRow

if TYPE_CHECKING:
    import pandas as pd


class ResultsIOManager(dg.ConfigurableIOManager):
    """Upserts analysis results into the results database it shares with the rest of the run."""

    results_store: ResultsStore

    def upsert(self, rows: Sequence[ResultRow]) -> int:
        """Insert or update one row per document (never a plain insert)."""
        return self.results_store.get().results.upsert(rows)

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        records = obj.to_dict("records") if hasattr(obj, "to_dict") else list(obj)
        fields = self.results_store.get().results.fields
        rows = [
            r if isinstance(r, ResultRow) else ResultRow.from_record(r, fields) for r in records
        ]
        context.add_output_metadata({"rows_upserted": self.upsert(rows)})

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        # A downstream of every document (the report) asks for all of them: no IN list at all.
        wanted = None
        if context.has_asset_partitions and context.asset_partitions_def is not None:
            keys = list(context.asset_partition_keys)
            every = context.asset_partitions_def.get_partition_keys(
                dynamic_partitions_store=context.instance
            )
            wanted = None if set(keys) >= set(every) else keys
        results = self.results_store.get().results
        rows = results.get(wanted)
        import pandas as pd  # here, not at import: only the report reads rows back

        columns = [c.name for c in results.table.columns]
        return pd.DataFrame([r.as_record() for r in rows], columns=columns)
