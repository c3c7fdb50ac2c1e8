"""A backfill's planned runs are never written over by a plan made before them.

The backfill planner (``backfill_planner``) plans a backfill the UI created by writing its runs
into it — compare and set, only if nobody wrote it since it was read
(``dagster_private.replace_backfill``) — and starts them. Dagster's backfill daemon does not write
that way: an iteration that read the backfill before the planner's write plans it from what it
read, reads it again only to see whether it was canceled, writes its own plan over the stored one
(``update_backfill`` writes whatever it is given) and submits that plan's runs. Every document of
the backfill then ran in two runs, the planner's and Dagster's (nothing was paid twice: the second
run found the first one's checkpoints; a test saw it about one time in five).

The project's run storages (``sqlite_storage`` for the embedded default, ``pg_storage`` for
PostgreSQL) write a backfill by compare and set too, and refuse a write that puts runs under new ids
in place of runs still waiting to be submitted (``submitting_run_requests``). Dagster itself plans a
backfill's next runs only when none are waiting (it submits those first, in the next iterations), so
such a write can only come from a plan made before the stored one. The daemon's iteration stops at
the refusal, before it submits anything, logs it as a failure it will retry, and on its next loop
submits the stored plan's runs (those the planner started already exist and are skipped).
dagster-postgres's own storage (``storage: postgres`` rather than ``deploy/dagster.yaml``'s pooled
one) writes as Dagster does.
"""

from __future__ import annotations

import os
from typing import Any

from ai_pipeline.accelerator.internals import (
    BulkActionsTable,
    db_select,
    deserialize_value,
    serialize_value,
)
from ai_pipeline.defs.dagster_private import PartitionBackfill

# Writes that found the backfill changed between reading and writing it, then tried again.
ATTEMPTS = 5

# Dagster 1.13's switch that makes its backfill daemon wait for a code location that does not load
# for a moment (a code server restarting on a loaded machine), where it would otherwise fail the
# backfill and terminate its running runs.
BACKFILLS_WAIT_FOR_CODE = "DAGSTER_BACKFILL_RETRY_DEFINITION_CHANGED_ERROR"


def backfills_wait_for_code() -> None:
    """Turn that switch on in this process (the daemon's, where it is read), unless the
    deployment set it: the accelerated run storages call it when they are built."""
    os.environ.setdefault(BACKFILLS_WAIT_FOR_CODE, "1")


class PlanMadeMeanwhile(Exception):
    """A backfill write that would replace the runs its stored plan is waiting to submit.

    Not a ``DagsterError``: Dagster's backfill daemon retries an iteration that fails with anything
    else (``_is_retryable_backfill_error``)."""


def replaces_waiting_runs(stored: PartitionBackfill, new: PartitionBackfill) -> bool:
    """Whether writing ``new`` over ``stored`` would put runs under other ids in place of the runs
    ``stored`` is waiting to submit."""
    if not stored.submitting_run_requests:
        return False
    return not set(new.reserved_run_ids or ()) <= set(stored.reserved_run_ids or ())


class BackfillsComparedAndSet:
    """A run storage's ``update_backfill`` as compare and set on the stored body, refusing a plan
    made before the stored one (``PlanMadeMeanwhile``); for a class whose ``connect()`` yields a
    connection in a transaction, as Dagster's SQL run storages do."""

    def update_backfill(self: Any, partition_backfill: PartitionBackfill) -> None:
        from dagster import DagsterInvariantViolationError

        backfill_id = partition_backfill.backfill_id
        text = serialize_value(partition_backfill)
        mine = BulkActionsTable.c.key == backfill_id
        for _ in range(ATTEMPTS):
            with self.connect() as conn:
                body = conn.execute(db_select([BulkActionsTable.c.body]).where(mine)).scalar()
            if body is None:
                raise DagsterInvariantViolationError(
                    f"Backfill {backfill_id} is not present in storage"
                )
            stored = deserialize_value(body, PartitionBackfill)
            if replaces_waiting_runs(stored, partition_backfill):
                raise PlanMadeMeanwhile(
                    f"backfill {backfill_id} not written: its stored plan has "
                    f"{len(stored.submitting_run_requests)} runs waiting to be submitted, and "
                    "this write would replace them with a plan made before it (the backfill "
                    "planner planned it meanwhile); its runs are submitted next"
                )
            with self.connect() as conn:
                written = conn.execute(
                    BulkActionsTable.update()
                    .where(mine, BulkActionsTable.c.body == body)
                    .values(status=partition_backfill.status.value, body=text)
                ).rowcount
            if written == 1:
                return
        raise RuntimeError(
            f"backfill {backfill_id} not written: it changed under each of {ATTEMPTS} attempts"
        )
