"""Jobs of OpenAI's Batch API, durably: each job's intent, file, remote batch and status, and the
state of each task (line) it carries.

Everything a crash could lose is written here before or right after it happens outside, so that
every step can be taken again without doing it twice:

- ``plan`` records the intent (the tasks, the request file's hash) before anything is uploaded,
  and claims its tasks: a task is in at most one open job (``open_task_id`` is unique);
- ``record_file`` / ``record_batch`` / ``record_remote`` follow the job as it goes out and along
  the remote lifecycle;
- ``answer_line`` marks a line answered and records its usage in one transaction, only while the
  line is pending (a compare-and-set): a line ingested twice is counted once; ``fail_line``
  settles an error line the same way;
- ``finish`` ends a job: lines left pending become unanswered and every task is released.

The rows it returns are :mod:`ai_pipeline.store.openai_batch_rows`'.
How a job is built, sent and read is ``ai_pipeline.openai_batch``'s; this module only stores it.
Not to be confused with ``ai_pipeline.store.batches`` (named sets of submitted documents).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.failures import Category
from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.openai_batch_rows import (
    BatchJob,
    BatchLine,
    JobStatus,
    LineState,
    PlannedTask,
    TasksTaken,
    job_from_row,
    line_from_row,
)
from ai_pipeline.store.spend import Usage, record_usage, release_in, reserve_in
from ai_pipeline.store.tables import openai_batch_lines, openai_batches


class OpenAIBatches:
    def __init__(self, db: Database):
        self.db = db

    # -- planning ----------------------------------------------------------------------------

    def plan(
        self,
        intent_id: str,
        *,
        model: str,
        endpoint: str,
        tasks: Sequence[PlannedTask],
        content_hash: str,
        content_bytes: int,
        budget_keys: Sequence[str] = (),
        completion_cap: int | None = None,
    ) -> BatchJob:
        """Record a job before anything is uploaded, claiming its tasks and reserving what its
        lines may cost against ``budget_keys``; raises TasksTaken, or BudgetRefused
        (``ai_pipeline.store.spend``), and records nothing, when one of its tasks is in another
        open job or a budget would be exceeded."""
        now = utcnow()

        def insert(conn: Connection) -> None:
            reserve_in(
                conn,
                budget_keys,
                sum(t.reserved_tokens for t in tasks),
                sum(t.reserved_usd for t in tasks),
            )
            conn.execute(
                sa.insert(openai_batches).values(
                    intent_id=intent_id,
                    model=model,
                    endpoint=endpoint,
                    task_count=len(tasks),
                    content_hash=content_hash,
                    content_bytes=content_bytes,
                    status=JobStatus.PLANNED.value,
                    budget_keys=list(budget_keys) or None,
                    completion_cap=completion_cap,
                    created_at=now,
                    updated_at=now,
                )
            )
            conn.execute(
                sa.insert(openai_batch_lines),
                [
                    {
                        "intent_id": intent_id,
                        "task_id": task.task_id,
                        "ordinal": ordinal,
                        "document_id": task.document_id,
                        "step": task.step,
                        "open_task_id": task.task_id,
                        "state": LineState.PENDING.value,
                        "reserved_tokens": task.reserved_tokens,
                        "reserved_usd": task.reserved_usd,
                        "updated_at": now,
                    }
                    for ordinal, task in enumerate(tasks)
                ],
            )

        try:
            self.db.write(insert)
        except sa.exc.IntegrityError as e:
            taken = self.open_jobs_of(t.task_id for t in tasks)
            raise TasksTaken(
                f"{len(taken)} of the job's tasks are in open Batch API jobs already "
                f"(e.g. {next(iter(taken.items()), ('?', '?'))})"
            ) from e
        job = self.get(intent_id)
        assert job is not None
        return job

    def open_jobs_of(self, task_ids: Iterable[str]) -> dict[str, str]:
        """The open job (its intent id) of each of these tasks that is in one."""
        query = sa.select(openai_batch_lines.c.open_task_id, openai_batch_lines.c.intent_id)
        rows = self.db.select_in(query, openai_batch_lines.c.open_task_id, task_ids)
        return {r.open_task_id: r.intent_id for r in rows}

    # -- reading -----------------------------------------------------------------------------

    def get(self, intent_id: str) -> BatchJob | None:
        rows = self.db.rows(
            sa.select(openai_batches).where(openai_batches.c.intent_id == intent_id)
        )
        return job_from_row(rows[0]) if rows else None

    def by_batch_id(self, batch_id: str) -> BatchJob | None:
        rows = self.db.rows(sa.select(openai_batches).where(openai_batches.c.batch_id == batch_id))
        return job_from_row(rows[0]) if rows else None

    def unfinished(self) -> list[BatchJob]:
        """Every job with something left to do, oldest first."""
        done = [JobStatus.INGESTED.value, JobStatus.ABANDONED.value]
        query = (
            sa.select(openai_batches)
            .where(openai_batches.c.status.not_in(done))
            .order_by(openai_batches.c.created_at, openai_batches.c.intent_id)
        )
        return [job_from_row(r) for r in self.db.rows(query)]

    def recent(self, limit: int = 50) -> list[BatchJob]:
        query = sa.select(openai_batches).order_by(openai_batches.c.created_at.desc()).limit(limit)
        return [job_from_row(r) for r in self.db.rows(query)]

    def lines(self, intent_id: str, state: LineState | None = None) -> list[BatchLine]:
        """A job's lines in their order in its request file (of one state, when given)."""
        query = sa.select(openai_batch_lines).where(openai_batch_lines.c.intent_id == intent_id)
        if state is not None:
            query = query.where(openai_batch_lines.c.state == state.value)
        return [
            line_from_row(r) for r in self.db.rows(query.order_by(openai_batch_lines.c.ordinal))
        ]

    def remote_statuses(self, intent_ids: Iterable[str]) -> dict[str, str | None]:
        """The remote batch's status of each of these jobs (None: never sent)."""
        query = sa.select(openai_batches.c.intent_id, openai_batches.c.remote_status)
        rows = self.db.select_in(query, openai_batches.c.intent_id, intent_ids)
        return {r.intent_id: r.remote_status for r in rows}

    def lines_of(self, task_ids: Iterable[str]) -> list[BatchLine]:
        """Every line these tasks had, in any job."""
        query = sa.select(openai_batch_lines)
        return [
            line_from_row(r)
            for r in self.db.select_in(query, openai_batch_lines.c.task_id, task_ids)
        ]

    def lines_of_documents(self, document_ids: Iterable[str]) -> list[BatchLine]:
        """Every line these documents had, in any job."""
        query = sa.select(openai_batch_lines)
        rows = self.db.select_in(query, openai_batch_lines.c.document_id, document_ids)
        return [line_from_row(r) for r in rows]

    def waiting(self, document_ids: Iterable[str]) -> dict[str, BatchJob]:
        """The open job each of these documents waits in (a line of it not yet settled)."""
        lines = [
            line
            for line in self.lines_of_documents(document_ids)
            if line.state == LineState.PENDING
        ]
        query = sa.select(openai_batches)
        rows = self.db.select_in(query, openai_batches.c.intent_id, {x.intent_id for x in lines})
        jobs = {job.intent_id: job for job in map(job_from_row, rows) if not job.status.finished}
        return {x.document_id: jobs[x.intent_id] for x in lines if x.intent_id in jobs}

    # -- following the job -------------------------------------------------------------------

    def _update(
        self, intent_id: str, where: sa.ColumnElement[bool] | None, **values: object
    ) -> bool:
        statement = (
            sa.update(openai_batches)
            .where(openai_batches.c.intent_id == intent_id)
            .values(updated_at=utcnow(), **values)
        )
        if where is not None:
            statement = statement.where(where)
        return bool(self.db.write(lambda conn: conn.execute(statement).rowcount))

    def record_file(self, intent_id: str, file_id: str) -> bool:
        """The request file is uploaded as ``file_id`` (kept if one was recorded before)."""
        return self._update(
            intent_id,
            openai_batches.c.file_id.is_(None),
            file_id=file_id,
            status=JobStatus.UPLOADED.value,
        )

    def record_batch(self, intent_id: str, batch_id: str, status: JobStatus) -> bool:
        """The remote batch is ``batch_id`` (kept if one was recorded before)."""
        return self._update(
            intent_id,
            openai_batches.c.batch_id.is_(None),
            batch_id=batch_id,
            status=status.value,
            remote_status=status.value,
            submitted_at=utcnow(),
        )

    def record_error(self, intent_id: str, error: str) -> bool:
        """Why the job's last step failed (it is tried again)."""
        return self._update(intent_id, None, error=error[:2000])

    def record_remote(
        self,
        intent_id: str,
        status: JobStatus,
        *,
        total: int | None,
        completed: int | None,
        failed: int | None,
        output_file_id: str | None,
        error_file_id: str | None,
        error: str | None = None,
    ) -> bool:
        """What the remote batch said of itself when last looked at (never after the job is
        finished)."""
        values: dict[str, object] = {
            "status": status.value,
            "remote_status": status.value,
            "request_total": total,
            "request_completed": completed,
            "request_failed": failed,
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
        }
        if error is not None:
            values["error"] = error
        if status.remote_ended:
            values["ended_at"] = utcnow()
        done = [JobStatus.INGESTED.value, JobStatus.ABANDONED.value]
        return self._update(intent_id, openai_batches.c.status.not_in(done), **values)

    # -- settling lines ----------------------------------------------------------------------

    def _settle(
        self,
        conn: Connection,
        intent_id: str,
        task_id: str,
        state: LineState,
        usage: Usage | None,
        **values: object,
    ) -> bool:
        """Move a pending line to ``state`` (a compare-and-set) and settle its reservation:
        into what was spent when it has ``usage``, else given back."""
        moved = conn.execute(
            sa.update(openai_batch_lines)
            .where(openai_batch_lines.c.intent_id == intent_id)
            .where(openai_batch_lines.c.task_id == task_id)
            .where(openai_batch_lines.c.state == LineState.PENDING.value)
            .values(state=state.value, open_task_id=None, updated_at=utcnow(), **values)
        ).rowcount
        if not moved:
            return False
        reserved = conn.execute(
            sa.select(
                openai_batches.c.budget_keys,
                openai_batch_lines.c.reserved_tokens,
                openai_batch_lines.c.reserved_usd,
            )
            .select_from(
                openai_batch_lines.join(
                    openai_batches, openai_batch_lines.c.intent_id == openai_batches.c.intent_id
                )
            )
            .where(openai_batch_lines.c.intent_id == intent_id)
            .where(openai_batch_lines.c.task_id == task_id)
        ).one()
        keys = list(reserved.budget_keys or [])
        if usage is not None:
            record_usage(conn, usage, keys, reserved.reserved_tokens, reserved.reserved_usd)
        else:
            release_in(conn, keys, reserved.reserved_tokens, reserved.reserved_usd)
        return True

    def answer_line(self, intent_id: str, task_id: str, usage: Usage | None) -> bool:
        """Mark a pending line answered (its checkpoint is stored) and record its usage, moving
        its reservation into what its budgets spent, in one transaction; False, and nothing
        recorded, when it was settled before."""
        return self.db.write(
            lambda conn: self._settle(conn, intent_id, task_id, LineState.ANSWERED, usage)
        )

    def fail_line(
        self,
        intent_id: str,
        task_id: str,
        state: LineState,
        *,
        category: Category | None,
        status_code: int | None,
        error: str,
        usage: Usage | None = None,
    ) -> bool:
        """Settle a pending line that has no answer to keep (an error line, expired, a reply
        not kept), with its usage when it was paid for; False, and nothing recorded, when it was
        settled before."""

        return self.db.write(
            lambda conn: self._settle(
                conn,
                intent_id,
                task_id,
                state,
                usage,
                category=category.value if category is not None else None,
                status_code=status_code,
                error=error[:2000],
            )
        )

    def finish(self, intent_id: str, status: JobStatus, error: str | None = None) -> int:
        """End a job (INGESTED or ABANDONED): lines still pending become unanswered, their
        reservations are given back, and every task is released. Returns how many lines were
        left unanswered."""
        assert status.finished
        now = utcnow()

        def end(conn: Connection) -> int:
            keys = conn.execute(
                sa.select(openai_batches.c.budget_keys).where(
                    openai_batches.c.intent_id == intent_id
                )
            ).scalar_one_or_none()
            unspent = conn.execute(
                sa.select(
                    sa.func.coalesce(sa.func.sum(openai_batch_lines.c.reserved_tokens), 0),
                    sa.func.coalesce(sa.func.sum(openai_batch_lines.c.reserved_usd), 0.0),
                )
                .where(openai_batch_lines.c.intent_id == intent_id)
                .where(openai_batch_lines.c.state == LineState.PENDING.value)
            ).one()
            release_in(conn, list(keys or []), int(unspent[0]), float(unspent[1]))
            left = conn.execute(
                sa.update(openai_batch_lines)
                .where(openai_batch_lines.c.intent_id == intent_id)
                .where(openai_batch_lines.c.state == LineState.PENDING.value)
                .values(state=LineState.UNANSWERED.value, open_task_id=None, updated_at=now)
            ).rowcount
            values: dict[str, object] = {"status": status.value, "updated_at": now}
            if error is not None:
                values["error"] = error
            conn.execute(
                sa.update(openai_batches)
                .where(openai_batches.c.intent_id == intent_id)
                .values(**values)
            )
            return int(left)

        return self.db.write(end)
