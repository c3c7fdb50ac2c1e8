"""Runs' signs of life: each run that works on documents stores the time of its last beat and
its process, and whatever judges runs (Dagster's run monitoring, through the run launcher) reads
them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ai_pipeline.processes import ProcessRef
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.rows import aware
from ai_pipeline.store.tables import run_beats


@dataclass(frozen=True)
class Beat:
    run_id: str
    at: datetime
    process: ProcessRef | None


class RunBeats:
    def __init__(self, db: Database):
        self.db = db

    def beat(self, run_id: str, process: ProcessRef | None) -> None:
        """The run is alive now, in ``process``."""
        values = {
            "run_id": run_id,
            "beat_at": utcnow(),
            "process": process.text() if process else None,
        }
        statement = (
            self.db.insert(run_beats)
            .values(**values)
            .on_conflict_do_update(
                index_elements=["run_id"],
                set_={"beat_at": values["beat_at"], "process": values["process"]},
            )
        )
        self.db.write_each(lambda conn: conn.execute(statement))

    def forget(self, run_id: str, process: ProcessRef | None) -> None:
        """The run's work in ``process`` ended: its beats are no longer a sign of anything."""
        statement = sa.delete(run_beats).where(run_beats.c.run_id == run_id)
        if process is not None:
            statement = statement.where(run_beats.c.process == process.text())
        self.db.write_each(lambda conn: conn.execute(statement))

    def last(self, run_id: str) -> Beat | None:
        """The run's last beat; None for a run that never beat."""
        rows = self.db.rows(sa.select(run_beats).where(run_beats.c.run_id == run_id))
        if not rows:
            return None
        row = rows[0]
        return Beat(row.run_id, aware(row.beat_at), ProcessRef.parse(row.process))
