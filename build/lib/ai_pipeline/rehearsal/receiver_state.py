"""The reference receiver's fault script and state: scripted failures, accepted notices, counters.

:class:`ReceiverFault` is one scripted failure (an HTTP status with a JSON error body, a connection
reset, "accepted, then the answer was lost", a delay) and :class:`ReceiverConfig` the receiver's
configuration; :class:`ReceiverState` keeps the accepted notices (SQLite: a file, or memory) and the
counters that the HTTP app in :mod:`.receiver` updates.

The accept is one ``INSERT OR IGNORE`` on a table whose primary key is the Idempotency-Key, so it
is atomic however many requests race, and across processes sharing one state file. Request
counters live in memory and restart at zero; the notices are what persists.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal["status", "reset", "accept_then_reset", "delay"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)

# ---------------------------------------------------------------------------------------------
# Faults and configuration
# ---------------------------------------------------------------------------------------------


class ReceiverFault(BaseModel):
    """One scripted failure of ``POST /notices``, applied before the idempotency logic.

    ``match`` is a substring of the Idempotency-Key ("*" for every request); ``times`` is how
    many requests it may still hit (None: every one). Kinds:

    * ``status``: answer ``status`` with ``{"error": error, "code": code}`` (defaults from the
      status: 422 gives ``UNPROCESSABLE_ENTITY``) and a Retry-After header when ``retry_after``;
    * ``reset``: drop the connection without answering; nothing is stored;
    * ``accept_then_reset``: store the notice, then drop the connection: the downstream has it but
      the sender never hears so, and its retry with the same key must get 409;
    * ``delay``: wait ``seconds``, then carry on normally.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    match: str = Field(default="*", min_length=1)
    times: int | None = Field(default=None, ge=0)
    status: int = Field(default=503, ge=400, le=599)
    error: str | None = None
    code: str | None = None
    retry_after: float | None = Field(default=None, ge=0)
    seconds: float = Field(default=1.0, ge=0)

    @classmethod
    def coerce(cls, rule: ReceiverFault | dict[str, Any]) -> ReceiverFault:
        """A ReceiverFault from a rule or its dict form; raises ValueError when it is invalid."""
        return cls.model_validate(rule)  # a ReceiverFault passes through as it is

    def hits(self, key: str) -> bool:
        return self.match == "*" or self.match in key

    def error_body(self) -> dict[str, str]:
        try:
            known = HTTPStatus(self.status)
            phrase, name = known.phrase, known.name
        except ValueError:
            phrase, name = "Request failed", "ERROR"
        return {"error": self.error or phrase, "code": self.code or name}


@dataclass
class ReceiverConfig:
    """Fault rules (replaceable while running) and where accepted notices are kept.

    ``state_file`` is a SQLite database; None keeps the notices in memory, so a new receiver
    starts knowing no keys (the same :class:`ReceiverServer` keeps them across stop and start).
    """

    faults: list[ReceiverFault] = field(default_factory=list)
    state_file: str | None = None

    def __post_init__(self) -> None:
        self.faults = [ReceiverFault.coerce(rule) for rule in self.faults]
        if self.state_file is not None:
            self.state_file = os.fspath(self.state_file)


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class _NoticeStore:
    """The accepted notices in SQLite, one row per key; callers serialise access."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self.path or ":memory:", timeout=10, isolation_level=None, check_same_thread=False
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS notices ("
                "key TEXT PRIMARY KEY, body TEXT NOT NULL, received_at TEXT NOT NULL)"
            )
            self._conn = conn
        return self._conn

    def insert_if_absent(self, key: str, body: Any) -> bool:
        cursor = self._db().execute(
            "INSERT OR IGNORE INTO notices (key, body, received_at) VALUES (?, ?, ?)",
            (key, json.dumps(body, ensure_ascii=False), _now()),
        )
        return cursor.rowcount == 1

    def rows(self) -> list[dict[str, Any]]:
        query = "SELECT key, body, received_at FROM notices ORDER BY rowid"
        return [
            {"key": key, "body": json.loads(body), "received_at": received_at}
            for key, body, received_at in self._db().execute(query)
        ]

    def count(self, key: str) -> int:
        query = "SELECT COUNT(*) FROM notices WHERE key = ?"
        return int(self._db().execute(query, (key,)).fetchone()[0])

    def clear(self) -> None:
        self._db().execute("DELETE FROM notices")

    def release(self) -> None:
        """Close a file-backed database (reopened on next use); memory is kept."""
        if self.path is not None and self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass
class _RuleUse:
    """A fault rule and how many requests it has hit so far."""

    rule: ReceiverFault
    hit: int = 0

    @property
    def remaining(self) -> int | None:
        return None if self.rule.times is None else self.rule.times - self.hit


class ReceiverState:
    """Accepted notices, counters and fault rules, shared by the app and its Python controllers.

    Used from the server's event loop and from other threads (tests, the CLI): every access goes
    through one lock, never held across an ``await``.
    """

    def __init__(self, config: ReceiverConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._store = _NoticeStore(config.state_file)
        self._rules = [_RuleUse(rule) for rule in config.faults]
        self._requests = 0
        self._by_key: Counter[str] = Counter()
        self._by_status: Counter[str] = Counter()
        # Wakes delayed requests when the server shuts down; belongs to one event loop.
        self._wake: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    # -- control ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            notices = self._store.rows()
            return {
                "requests": self._requests,
                "requests_by_key": dict(self._by_key),
                "accepted_by_key": dict(Counter(notice["key"] for notice in notices)),
                "by_status": dict(self._by_status),
                "notices": notices,
            }

    def accepted(self, key: str) -> int:
        """How many notices are stored under this key: 0 or 1."""
        with self._lock:
            return self._store.count(key)

    def requests_for(self, key: str) -> int:
        """How many ``POST /notices`` carried this Idempotency-Key ("" for none)."""
        with self._lock:
            return self._by_key.get(key, 0)

    def reset(self) -> None:
        """Forget every notice and counter; fault rules stay as they are."""
        with self._lock:
            self._store.clear()
            self._requests = 0
            self._by_key.clear()
            self._by_status.clear()

    def set_faults(self, faults: Iterable[ReceiverFault | dict[str, Any]]) -> None:
        uses = [_RuleUse(ReceiverFault.coerce(rule)) for rule in faults]
        with self._lock:
            self._rules = uses

    def faults(self) -> dict[str, Any]:
        """The rules, and beside each how often it hit and may still hit (null: always)."""
        with self._lock:
            uses = [(use.rule, use.hit, use.remaining) for use in self._rules]
        return {
            "faults": [rule.model_dump() for rule, _, _ in uses],
            "state": [{"remaining": left, "hit": hit} for _, hit, left in uses],
        }

    def close(self) -> None:
        """Release the state file, if any (it is reopened when next needed)."""
        with self._lock:
            self._store.release()

    # -- request path ------------------------------------------------------------------------

    def arrived(self, key: str) -> None:
        with self._lock:
            self._requests += 1
            self._by_key[key] += 1

    def answered(self, status: int | None) -> None:
        """Count an outcome: an HTTP status, or None when the connection was dropped."""
        with self._lock:
            self._by_status["reset" if status is None else str(status)] += 1

    def fault_for(self, key: str) -> ReceiverFault | None:
        """The first rule that still hits this key, used up by one; None when none does."""
        with self._lock:
            for use in self._rules:
                if use.remaining != 0 and use.rule.hits(key):
                    use.hit += 1
                    return use.rule
        return None

    def accept(self, key: str, body: Any) -> bool:
        """Store the notice unless the key is known; True when it was stored now."""
        with self._lock:
            return self._store.insert_if_absent(key, body)

    async def delay(self, seconds: float) -> None:
        """Sleep, but give way at once when the server shuts down."""
        loop = asyncio.get_running_loop()
        if self._wake is None or self._wake_loop is not loop:
            self._wake, self._wake_loop = asyncio.Event(), loop
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    def wake_delayed(self) -> None:
        """Let every delayed request carry on; runs on the server's event loop."""
        if self._wake is not None:
            self._wake.set()
