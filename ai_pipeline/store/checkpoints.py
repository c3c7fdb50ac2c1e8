"""Checkpoints: the stored result of one task, keyed by its task id; first write wins.

A checkpoint's existence means its task is done: before any external call the pipeline looks it up,
and stores the call's result here before doing anything else with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.tables import checkpoints


def _loads(value: str | None) -> Any:
    return json.loads(value) if value is not None else None


# Built once: a run reads and writes a checkpoint per document (``ai_pipeline.store.documents``).
_GET = sa.select(checkpoints.c.payload).where(checkpoints.c.task_id == sa.bindparam("task_id"))
_MANY = sa.select(checkpoints.c.task_id, checkpoints.c.payload)


class Checkpoints:
    def __init__(self, db: Database):
        self.db = db
        # The dialect's INSERT … ON CONFLICT DO NOTHING RETURNING the payload (a row only when
        # this insert wrote it), the row bound at execution.
        self._put = db.insert(checkpoints).on_conflict_do_nothing().returning(checkpoints.c.payload)

    def get(self, task_id: str) -> dict[str, Any] | None:
        """The stored payload of a task, or None when the task has not been done."""
        rows = self.db.rows(_GET, {"task_id": task_id})
        return _loads(rows[0].payload) if rows else None

    def get_many(self, task_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        rows = self.db.select_in(_MANY, checkpoints.c.task_id, task_ids)
        return {r.task_id: _loads(r.payload) for r in rows}

    def put(
        self, task_id: str, document_id: str, step: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """Store a task's result durably; if one exists already, keep it and return it."""
        row = {
            "task_id": task_id,
            "document_id": document_id,
            "step": step,
            "payload": json.dumps(payload, ensure_ascii=False, sort_keys=True),
            "created_at": utcnow(),
        }
        inserted = self.db.write_each(lambda conn: conn.execute(self._put, row).first())
        if inserted is not None:  # the row is this call's: what it stored, without reading it
            return dict(_loads(inserted.payload))
        stored = self.get(task_id)  # another writer's, kept
        assert stored is not None
        return stored

    def delete(self, task_id: str) -> bool:
        """Forget a task's result (a reviewer asked for a new answer); True if there was one."""
        delete = sa.delete(checkpoints).where(checkpoints.c.task_id == task_id)
        return bool(self.db.write(lambda conn: conn.execute(delete).rowcount))

    def count_for(self, document_id: str, step_prefix: str) -> int:
        """How many of a document's checkpoints have a step starting with ``step_prefix`` (a long
        document's sections done, for its progress)."""
        query = (
            sa.select(sa.func.count())
            .select_from(checkpoints)
            .where(checkpoints.c.document_id == document_id)
            .where(checkpoints.c.step.startswith(step_prefix, autoescape=True))
        )
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))

    def recent_latencies_ms(self, step_prefix: str, limit: int) -> list[int]:
        """The LLM latency of the newest ``limit`` checkpoints whose step starts with
        ``step_prefix`` (the submission service's estimate of a call's time)."""
        query = (
            sa.select(checkpoints.c.payload)
            .where(checkpoints.c.step.startswith(step_prefix, autoescape=True))
            .order_by(checkpoints.c.created_at.desc())
            .limit(limit)
        )
        latencies = (_loads(r.payload).get("latency_ms") for r in self.db.rows(query))
        return [int(ms) for ms in latencies if isinstance(ms, int | float)]

    def count(self, step: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(checkpoints)
        if step:
            query = query.where(checkpoints.c.step == step)
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))
