"""What the project's event-log storages change in Dagster's, on SQLite and PostgreSQL alike.

Creating a run writes, for each asset check it plans, one ``asset_check_executions`` row per
partition of the run, and Dagster 1.13.27 (``SqlEventLogStorage._store_asset_check_evaluation_planned``)
puts the whole planned event in every one of those rows — an event that names the run's partition
subset, every document key of the range. Both the work and the bytes grew with the square of the
documents per run: for a run of 2,500 documents, each check's rows held 2,500 copies of a 50 kB
event (125 MB per check, half a gigabyte per run), serialized 2,500 times; the backfill daemon
took about 30 s to create such a run on SQLite, 97 % of it in that method (py-spy,
``benchmarks/README.md``), and the fourth run of a batch started two minutes after the first.

:class:`CheckRowsPerDocument` writes the same rows — the same columns and values — except
that each row's event is the planned event narrowed to that row's own partition (what the row
stands for; the event log keeps the run's whole event), in one executemany: planning a run's
checks costs time and space in proportion to its documents. Nothing reads a planned row's
partition subset: Dagster reads its type, asset, check, run and time. The embedded default's
event log (``ai_pipeline.accelerator.sqlite``) and the production one
(``ai_pipeline.accelerator.postgres``) both take it.

A run that names the documents of its range it works on (``ai_pipeline.defs.partitions``) gets
rows for those alone: the others of its range keep the check status they had.

It also remembers that the asset-check table exists: Dagster asks the database (a table
inspection on a connection of its own) before it stores each check evaluation, four times per
document, and a table that exists stays; a missing one is asked about again.

:class:`WritesRemembered` keeps two more answers a run worker would otherwise ask the database for
on every event (py-spy of a run worker, ``benchmarks/README.md``): the asset-key table's columns
(Dagster inspects the table for each materialization it stores), and the latest materialization
this process stored per asset and partition, which the document's check evaluations name as their
target right after it (``defs.checks``) instead of reading it back.

:class:`EventsSerializedOnce` writes a check evaluation's row in ``asset_check_executions`` as
Dagster does (``_update_asset_check_evaluation``: the planned row of its run and partition
updated, or a row inserted when there is none) with the event's text that its event-log row got,
instead of serializing the event a second time, and with one statement built once instead of a new
one holding the values for every evaluation: after grouped writes, that method was three tenths
of a run's step thread, four times per document (py-spy, ``benchmarks/README.md``). An asset's
row, which holds its latest materialization event and all, is made of that text too.

:class:`GroupedWrites` lets a run's step write the events of the documents that finished while it
wrote the previous ones in one transaction per database (``grouped_writes``), each event still
through Dagster's own ``store_event``. Event by event, a document's nine events took 20 to 30
transactions (the run's database, then the index: the event again, its asset's row, a check's
row), and a step that wrote them so fell behind its LLM calls: at 3,000 documents on two cores a
run's step went on for 34 s after its last answer (``benchmarks/README.md``). Dagster's own batched
writes (``DAGSTER_EVENT_BATCH_SIZE``) do not reach events a step yields, and on SQLite write one by
one anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterInvariantViolationError
from sqlalchemy import and_, bindparam

from ai_pipeline.accelerator.acceleration import EVENTS
from ai_pipeline.accelerator.internals import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    AssetEventSummaryRecord,
    DefaultPartitionsSubset,
    SqlEventLogStorageTable,
    copy_record,
    db_select,
    serialize_value,
)
from ai_pipeline.defs.partitions import named_in

# The events a run's step writes per document, which the storages' ``store_event`` write with one
# insert statement built once.
STEP_EVENTS = frozenset(
    (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION)
)


class CheckRowsPerDocument:
    """Mixin for a ``SqlEventLogStorage``: a run's planned events name its range (one per asset,
    not one per document, as ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS`` asks of Dagster),
    and the rows of a planned check evaluation are written for the documents the run names, each
    with the planned event of its own partition (checked against dagster 1.13.27: the method it
    overrides has this body, with ``serialize_value(event)`` of the whole event in every row); the
    check table's existence remembered once seen. The product finds ``EVENTS`` on it: the failed
    documents' own planned events are written by the analysis step."""

    ai_pipeline_acceleration = EVENTS
    _has_check_table = False

    @property
    def supports_partition_subset_in_asset_materialization_planned_events(self) -> bool:
        return True

    @property
    def supports_asset_checks(self) -> bool:
        if not self._has_check_table:
            self._has_check_table = bool(super().supports_asset_checks)  # type: ignore[misc]
        return self._has_check_table

    def _named_documents(self, run_id: str) -> set[str] | None:
        """The documents the run names in its config, or None (all of its range)."""
        if not self.has_instance:  # type: ignore[attr-defined]
            return None
        run = self._instance.get_run_by_id(run_id)  # type: ignore[attr-defined]
        return named_in(run.run_config) if run is not None else None

    def _store_asset_check_evaluation_planned(self, event: Any, event_id: int | None) -> None:
        assert event.dagster_event is not None
        planned = event.dagster_event.event_specific_data
        keys = (
            planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        )
        named = self._named_documents(event.run_id)
        if named is not None:
            keys = [k for k in keys if k in named]
        row = {
            "asset_key": planned.asset_key.to_string(),
            "check_name": planned.check_name,
            "run_id": event.run_id,
            "execution_status": AssetCheckExecutionRecordStatus.PLANNED.value,
            "evaluation_event_timestamp": self._event_insert_timestamp(event),  # type: ignore[attr-defined]
            "evaluation_event_storage_id": event_id,
        }

        def planned_for(key: str | None) -> str:
            if key is None:
                return serialize_value(event)
            one = copy_record(planned, partitions_subset=DefaultPartitionsSubset({key}))
            dagster_event = event.dagster_event._replace(event_specific_data=one)
            return serialize_value(event._replace(dagster_event=dagster_event))

        if not keys:
            return
        texts = _each_key(planned_for, keys)
        with self.index_connection() as conn:  # type: ignore[attr-defined]
            conn.execute(
                AssetCheckExecutionsTable.insert(),
                [
                    {**row, "partition": key, "evaluation_event": text}
                    for key, text in zip(keys, texts, strict=True)
                ],
            )


# A partition key no document has: the planned event is serialized once with it, then each key's
# text is that one with the stand-in's JSON replaced by the key's.
_STAND_IN = "\x00ai_pipeline:partition\x00"


def _each_key(serialized: Callable[[str | None], str], keys: list[str | None]) -> list[str]:
    """``serialized(key)`` for every key, serializing once: a batch's planned check rows were
    12,000 serializations of the same event for 3,000 documents. Where the stand-in does not
    appear exactly once (a key of None, a Dagster that writes a subset otherwise), each key is
    serialized by itself."""
    template = serialized(_STAND_IN)
    quoted = serialize_value(_STAND_IN)
    if None in keys or template.count(quoted) != 1:
        return [serialized(key) for key in keys]
    before, after = template.split(quoted)
    return [before + serialize_value(key) + after for key in keys]


_CHECKS = AssetCheckExecutionsTable.c
# The planned row of a check evaluation's run and partition; the values to set are the statement's
# other parameters (named as their columns, so SQLAlchemy sets those).
_UPDATE_CHECK_ROW = AssetCheckExecutionsTable.update().where(
    and_(
        _CHECKS.asset_key == bindparam("row_asset_key"),
        _CHECKS.check_name == bindparam("row_check_name"),
        _CHECKS.run_id == bindparam("row_run_id"),
        _CHECKS.partition == bindparam("row_partition"),
    )
)
INSERT_CHECK_ROW = AssetCheckExecutionsTable.insert()


# Events whose event-log text a thread keeps for the rows written after them (``EventsSerializedOnce``):
# a check's row right after its evaluation, an asset's row at the end of a group, whose latest
# materialization of each asset is among its last few events.
REMEMBERED_TEXTS = 64


class EventsSerializedOnce:
    """Mixin for a ``SqlEventLogStorage``: an event's text made once, for its event-log row, and
    used again for the rows that hold the event too. A check evaluation's row is written with it
    and one statement built once (checked against dagster 1.13.27: the method it overrides,
    ``_update_asset_check_evaluation``, has this body, serializing the event again and building its
    update and insert from the values); so is a materialization's asset row, its latest
    materialization (``_get_asset_entry_values``: Dagster serializes the record holding the event,
    event and all). Each thread remembers the texts of the last events whose event-log rows it
    made (``_event_to_row``, which both storages' ``store_event`` use)."""

    def _event_to_row(self, event: Any) -> dict[str, Any]:
        row: dict[str, Any] = super()._event_to_row(event)  # type: ignore[misc]
        local = self.__dict__.setdefault("_texts", threading.local())
        texts: OrderedDict[int, tuple[Any, str]] | None = getattr(local, "texts", None)
        if texts is None:
            texts = local.texts = OrderedDict()
        texts[id(event)] = (event, row["event"])  # the event kept: its id is not reused meanwhile
        if len(texts) > REMEMBERED_TEXTS:
            texts.popitem(last=False)
        return row

    def _text_of(self, event: Any) -> str | None:
        """The text this thread gave ``event``'s event-log row, if it is among the last ones."""
        local = self.__dict__.get("_texts")
        texts = getattr(local, "texts", None) if local is not None else None
        known = texts.get(id(event)) if texts else None
        return known[1] if known is not None and known[0] is event else None

    def _serialized(self, event: Any) -> str:
        """The text of ``event``: the one its event-log row got, if this thread made it lately."""
        text = self._text_of(event)
        return text if text is not None else serialize_value(event)

    def _get_asset_entry_values(
        self, event: Any, event_id: int, has_asset_key_index_cols: bool
    ) -> dict[str, Any]:
        text = self._text_of(event)
        dagster_event = event.dagster_event
        if text is None or dagster_event is None or not dagster_event.is_step_materialization:
            return super()._get_asset_entry_values(  # type: ignore[misc,no-any-return]
                event, event_id, has_asset_key_index_cols
            )
        # Checked against dagster 1.13.27: its values for a step's materialization, the record
        # ``serialize_value(EventLogRecord(storage_id, event_log_entry=event))`` made of the
        # event's text (the same bytes: tested).
        values: dict[str, Any] = {
            "last_materialization": (
                f'{{"__class__": "EventLogRecord", "event_log_entry": {text}, '
                f'"storage_id": {int(event_id)}}}'
            ),
            "last_run_id": event.run_id,
        }
        if has_asset_key_index_cols:
            values["last_materialization_timestamp"] = datetime.fromtimestamp(
                event.timestamp, timezone.utc
            )
        return values

    def _update_asset_check_evaluation(self, event: Any, event_id: int | None) -> None:
        evaluation = event.dagster_event.event_specific_data
        if evaluation.partition is None:  # the row of an unpartitioned check: Dagster's own way
            super()._update_asset_check_evaluation(event, event_id)  # type: ignore[misc]
            return
        key, values = self._check_row(event, event_id)
        with self.index_connection() as conn:  # type: ignore[attr-defined]
            updated = conn.execute(
                _UPDATE_CHECK_ROW,
                {
                    **values,
                    **{f"row_{k}": v for k, v in key.items()},
                    "row_partition": evaluation.partition,
                },
            ).rowcount
            if updated == 0:  # no planned row (a run that did not plan this check)
                updated = conn.execute(INSERT_CHECK_ROW, {**key, **values}).rowcount
        if updated > 1:
            raise too_many_check_rows(updated, evaluation)

    def _check_row(self, event: Any, event_id: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The key (asset, check, run) of a partitioned check evaluation's row and the values
        its row gets, the partition among them."""
        evaluation = event.dagster_event.event_specific_data
        target = evaluation.target_materialization_data
        status = (
            AssetCheckExecutionRecordStatus.SUCCEEDED
            if evaluation.passed
            else AssetCheckExecutionRecordStatus.FAILED
        )
        values = {
            "execution_status": status.value,
            "evaluation_event": self._serialized(event),
            "evaluation_event_timestamp": self._event_insert_timestamp(event),  # type: ignore[attr-defined]
            "evaluation_event_storage_id": event_id,
            "materialization_event_storage_id": target.storage_id if target else None,
            "partition": evaluation.partition,
        }
        key = {
            "asset_key": evaluation.asset_key.to_string(),
            "check_name": evaluation.check_name,
            "run_id": event.run_id,
        }
        return key, values


def too_many_check_rows(updated: int, evaluation: Any) -> DagsterInvariantViolationError:
    """Dagster's error for an evaluation that updated more than its one planned row."""
    return DagsterInvariantViolationError(
        f"Updated {updated} rows for asset check evaluation {evaluation.asset_check_key} "
        "as a result of duplicate AssetCheckPlanned events."
    )


# Partitions whose latest materialization a process keeps in memory: a document's checks are
# evaluated right after its materialization, so the last few hundred are plenty.
REMEMBERED_MATERIALIZATIONS = 4096


class WritesRemembered:
    """Mixin for a ``SqlEventLogStorage``: a column of the asset-key table, once seen, is not
    inspected again (columns are added by migrations, never dropped while a process runs), and the
    latest materialization stored by this process per asset and partition is kept
    (``latest_materialization``)."""

    def _has_asset_key_col_on_connection(self, conn: Any, column_name: str) -> bool:
        seen: set[str] = self.__dict__.setdefault("_asset_key_columns_seen", set())
        if column_name in seen:
            return True
        found = bool(super()._has_asset_key_col_on_connection(conn, column_name))  # type: ignore[misc]
        if found:
            seen.add(column_name)
        return found

    def _store_asset_event(self, conn: Any, event: Any, event_id: int) -> None:
        super()._store_asset_event(conn, event, event_id)  # type: ignore[misc]
        self._remember(event, event_id)

    def _remember(self, event: Any, event_id: int) -> None:
        dagster_event = event.dagster_event
        if dagster_event is None or not dagster_event.is_step_materialization:
            return
        partition = dagster_event.partition
        if partition is None:
            return
        latest: OrderedDict[tuple[str, str], tuple[int, str, float]] = self.__dict__.setdefault(
            "_latest_materializations", OrderedDict()
        )
        key = (dagster_event.asset_key.to_string(), partition)
        latest[key] = (event_id, event.run_id, event.timestamp)
        latest.move_to_end(key)
        while len(latest) > REMEMBERED_MATERIALIZATIONS:
            latest.popitem(last=False)

    def latest_materialization(
        self, asset_key: Any, partition: str
    ) -> tuple[int, str, float] | None:
        """(storage id, run id, timestamp) of the latest materialization of ``asset_key`` for
        ``partition`` that this process stored, or None."""
        latest = self.__dict__.get("_latest_materializations")
        return latest.get((asset_key.to_string(), partition)) if latest else None


class SummaryKeysParsedOnce:
    """Mixin for a ``SqlEventLogStorage``: ``get_asset_event_summary_records`` as Dagster 1.13.27
    has it (``SqlEventLogStorage``: the same query, the same records), each distinct asset key
    string of its rows parsed once instead of once per row.

    The backfill daemon reads every new materialization through it, a thousand rows a page, once
    for each backfill still open; at 100,000 documents (ten backfills) it was two fifths of the
    daemon, and parsing each row's key (a JSON decode and a checked ``AssetKey``) a third of that
    (py-spy, ``benchmarks/README.md``)."""

    def get_asset_event_summary_records(
        self,
        event_type: DagsterEventType,
        asset_key: AssetKey | None = None,
        run_id: str | None = None,
        storage_ids: Sequence[int] | None = None,
        after_storage_id: int | None = None,
        before_storage_id: int | None = None,
        limit: int | None = None,
        ascending: bool = False,
    ) -> list[AssetEventSummaryRecord]:
        table = SqlEventLogStorageTable
        query = db_select(
            [table.c.id, table.c.run_id, table.c.asset_key, table.c.partition, table.c.timestamp]
        ).where(table.c.dagster_event_type == event_type.value)
        if asset_key is not None:
            query = query.where(table.c.asset_key == asset_key.to_string())
            details = next(iter(self._get_assets_details([asset_key])))  # type: ignore[attr-defined]
            if details and details.last_wipe_timestamp:
                wiped = datetime.fromtimestamp(details.last_wipe_timestamp, timezone.utc)
                query = query.where(table.c.timestamp > wiped.replace(tzinfo=None))
        else:
            query = query.where(table.c.asset_key.isnot(None))
        if run_id is not None:
            query = query.where(table.c.run_id == run_id)
        if storage_ids is not None:
            query = query.where(table.c.id.in_(storage_ids))
        if after_storage_id is not None:
            query = query.where(table.c.id > after_storage_id)
        if before_storage_id is not None:
            query = query.where(table.c.id < before_storage_id)
        if limit:
            query = query.limit(limit)
        query = query.order_by(table.c.id.asc() if ascending else table.c.id.desc())
        with self.index_connection() as conn:  # type: ignore[attr-defined]
            rows = conn.execute(query).fetchall()

        keys: dict[str, AssetKey] = {}
        if asset_key is not None:
            keys[asset_key.to_string()] = asset_key

        def parsed(key_string: str) -> AssetKey:
            key = keys.get(key_string) or AssetKey.from_db_string(key_string)
            if key is None:  # not a row of the query, which has an asset key
                raise DagsterInvariantViolationError("event-log row without an asset key")
            keys[key_string] = key
            return key

        return [
            AssetEventSummaryRecord(
                storage_id=storage_id,
                run_id=row_run_id,
                asset_key=parsed(key_string),
                partition=partition,
                timestamp=timestamp.replace(tzinfo=timezone.utc).timestamp(),
            )
            for storage_id, row_run_id, key_string, partition, timestamp in rows
        ]


# The key of the cross-run index database among a group's connections (Dagster's SQLite shard name).
INDEX = "index"


# Events Dagster buffers per batch before it hands them to ``store_event_batch``; a run's planned
# events (one per asset and check, a dozen) are one batch.
EVENT_BATCH_SIZE = 100


def batch_planned_events() -> None:
    """Have Dagster write the planned events of each run it creates as one batch, where the
    deployment has not chosen otherwise (``DAGSTER_EVENT_BATCH_SIZE``, read by every
    ``DagsterInstance`` of the process when it handles an event; unset, every event is written
    alone). The SQLite storage writes a batch as one group, one transaction: written one by one,
    each took the event log's write lock again, and with four runs writing their documents'
    events the daemon's run creation waited so long for it, nine times, that at 100,000 documents
    runs stayed NOT_STARTED past the 120 s after which Dagster's run monitoring fails them."""
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", str(EVENT_BATCH_SIZE))


class Group:
    """The connections one ``grouped_writes`` holds open, each in its transaction, and the
    asset-key rows it has still to write (per asset: the latest materialization and its id)."""

    def __init__(self) -> None:
        self.connections: dict[Any, Any] = {}
        self.assets: dict[str, tuple[Any, int]] = {}
        self.flushing = False
        # What a storage holds back until the group ends (``_send_deferred``), its own to shape.
        self.deferred: Any = None


class GroupedWrites:
    """Mixin for a ``SqlEventLogStorage``: ``grouped_writes()`` writes the events stored inside it
    — each through Dagster's own ``store_event``, unchanged — in one transaction per database,
    committed when it ends, instead of two to four transactions per event.

    Every materialization also rewrites its asset's row in the asset-key table (the latest
    materialization, serialized once more); inside a group that row is written once per asset,
    for the group's latest materialization of it, which is the row the event-by-event writes
    leave. The storage's ``_connect`` hands out the group's connection to each database
    (``_grouped``: opened and begun on first use) while this thread is in a group, and
    ``_group_lock`` is what the process's other threads wait on meanwhile. What a group wrote is
    seen by its own thread at once and by everyone else when it commits; a group that raises
    leaves nothing."""

    def _group(self) -> Group | None:
        local = self.__dict__.get("_grouping")
        return getattr(local, "group", None) if local is not None else None

    def _group_lock(self) -> Any:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def grouped_writes(self) -> Iterator[None]:
        local = self.__dict__.setdefault("_grouping", threading.local())
        if getattr(local, "group", None) is not None:
            yield  # inside a group already: its transactions take these writes too
            return
        group = Group()
        with self._group_lock():
            local.group = group
            try:
                yield
                self._send_deferred(group)
                if group.assets:
                    group.flushing = True
                    with self.index_connection() as conn:  # type: ignore[attr-defined]
                        self._store_asset_events(conn, list(group.assets.values()))
                # The runs' databases before the index, as the event-by-event writes commit.
                for key in sorted(group.connections, key=lambda k: k == INDEX):
                    group.connections[key].commit()
            except BaseException:
                for conn in group.connections.values():
                    with contextlib.suppress(Exception):
                        conn.rollback()
                raise
            finally:
                local.group = None
                for conn in group.connections.values():
                    with contextlib.suppress(Exception):
                        conn.close()

    def _store_asset_events(self, conn: Any, events: list[tuple[Any, int]]) -> None:
        """The asset rows of a group's end: for each asset, its latest materialization and id."""
        for event, event_id in events:
            self._store_asset_event(conn, event, event_id)

    def _send_deferred(self, group: Group) -> None:
        """Writes what the storage held back of ``group`` (``Group.deferred``): none here."""

    def _grouped(self, key: Any, connect: Callable[[], Any]) -> Any:
        """The group's connection to database ``key`` (``INDEX`` for the cross-run index, which
        commits last), begun: opened with ``connect`` on first use."""
        group = self._group()
        assert group is not None
        conn = group.connections.get(key)
        if conn is None:
            conn = group.connections[key] = connect()
            conn.begin()
        return conn

    def _store_asset_event(self, conn: Any, event: Any, event_id: int) -> None:
        group = self._group()
        dagster_event = event.dagster_event
        if (
            group is None
            or group.flushing
            or dagster_event is None
            or not dagster_event.is_step_materialization
        ):
            super()._store_asset_event(conn, event, event_id)  # type: ignore[misc]
            return
        group.assets[dagster_event.asset_key.to_string()] = (event, event_id)
        remember = getattr(self, "_remember", None)
        if remember is not None:
            remember(event, event_id)
