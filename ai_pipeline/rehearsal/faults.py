"""The simulator's fault script and state: which requests fail how, and what it has counted.

:class:`FaultRule` describes one injected failure (an HTTP status, a connection reset, a hang, or a
malformed answer) and which requests it hits; :class:`SimulatorConfig` is how a simulator behaves;
:class:`SimulatorState` holds the rules, the accepted keys and the request counters that the HTTP
app updates and its controllers read.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from ai_pipeline.rehearsal.openai_rules import OPENAI_MODELS, PromptCache

DEFAULT_MODEL = "sim-analyst-1"
MAX_RECORDED_REQUESTS = 1000

FAULT_KINDS = (
    "status",
    "reset",
    "timeout",
    "truncate",
    "invalid_json",
    "missing_field",
    "wrong_type",
    "low_confidence",
    "refuse",
    "hallucinate",
    "no_usage",
    "expire",
)
# Faults that change what the model says rather than how the HTTP exchange goes ("no_usage"
# answers normally but leaves ``usage`` out of the reply, as some compatible servers do; "expire"
# leaves a batch line unanswered until its batch's window closes, and hangs a synchronous call
# as "timeout" does).
CONTENT_FAULTS = frozenset(
    ("truncate", "invalid_json", "missing_field", "wrong_type", "low_confidence", "refuse")
    + ("hallucinate",)
)


class FaultRule(BaseModel):
    """One injected failure: which requests it hits, what happens, and how often.

    ``match`` is a substring of the document text or of the Idempotency-Key ("*" for every
    request). ``times`` is how many requests it may still hit (None: unlimited). ``every`` makes
    it hit only every Nth matching request (the Nth, 2Nth, ...). ``status`` and ``retry_after``
    are used by kind "status" (``retry_after`` becomes a Retry-After header).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    match: str = "*"
    times: int | None = None
    status: int = 500
    retry_after: float | None = None
    every: int = 1

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in FAULT_KINDS:
            raise ValueError(
                f"unknown fault kind {kind!r}; expected one of {', '.join(FAULT_KINDS)}"
            )
        return kind

    @field_validator("match")
    @classmethod
    def _non_empty_match(cls, match: str) -> str:
        if not match:
            raise ValueError('match must be a non-empty substring, or "*" for every request')
        return match

    @field_validator("status")
    @classmethod
    def _error_status(cls, status: int) -> int:
        if not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP error status (400-599), got {status}")
        return status

    @field_validator("times")
    @classmethod
    def _non_negative_times(cls, times: int | None) -> int | None:
        if times is not None and times < 0:
            raise ValueError(f"times must be >= 0 or null (unlimited), got {times}")
        return times

    @field_validator("every")
    @classmethod
    def _positive_every(cls, every: int) -> int:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        return every

    @field_validator("retry_after")
    @classmethod
    def _non_negative_retry_after(cls, retry_after: float | None) -> float | None:
        if retry_after is not None and retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        return retry_after

    @classmethod
    def coerce(cls, rule: FaultRule | dict[str, Any]) -> FaultRule:
        """A FaultRule from a rule or its dict form; raises ValueError when it is invalid."""
        if isinstance(rule, FaultRule):
            return rule
        if not isinstance(rule, dict):
            raise ValueError(f"a fault rule must be an object, got {type(rule).__name__}")
        return cls.model_validate(rule)

    def matches(self, text: str, key: str) -> bool:
        return self.match == "*" or self.match in text or self.match in key

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


@dataclass
class SimulatorConfig:
    """How the simulator behaves; faults and api keys can also be replaced while it runs."""

    latency_ms: int = 0
    max_concurrency: int = 64
    api_keys: set[str] | None = None
    faults: list[FaultRule] = field(default_factory=list)
    hang_seconds: float = 30.0
    model: str = DEFAULT_MODEL
    # Appended to the requested model in each reply's ``model``, as OpenAI answers a request for
    # ``gpt-4o-mini`` as ``gpt-4o-mini-2024-07-18`` ("" answers with the name requested).
    served_model_suffix: str = ""
    # OpenAI rules mode (``openai_rules``): requests OpenAI refuses get its status and error
    # body, reasoning models report reasoning tokens, usage reports cached prompt tokens.
    openai_rules: bool = False
    # The model names served (a request for another gets 404 model_not_found). None serves any
    # name and lists ``model``; in OpenAI rules mode None serves OPENAI_MODELS and ``model``.
    models: tuple[str, ...] | None = None
    # The context window, in tokens of the document text: a longer request gets 400
    # ``context_length_exceeded`` (``param`` = ``messages``), as OpenAI answers it. None: no limit.
    context_tokens: int | None = None
    # Report ``usage.prompt_tokens_details.cached_tokens`` (None: in OpenAI rules mode only).
    prompt_caching: bool | None = None
    # The Batch API (``.batch_api``): how long a batch takes from create to completed, the
    # window after which it expires with its unfinished lines (None: never, in a rehearsal),
    # and how long a cancelled batch stays ``cancelling``.
    batch_seconds: float = 0.0
    batch_window_seconds: float | None = None
    batch_cancel_seconds: float = 0.0

    @property
    def served_models(self) -> tuple[str, ...] | None:
        """The names served, or None when any name is answered."""
        if self.models is not None:
            return self.models
        return (*OPENAI_MODELS, self.model) if self.openai_rules else None

    @property
    def caches_prompts(self) -> bool:
        return self.openai_rules if self.prompt_caching is None else self.prompt_caching

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.hang_seconds < 0:
            raise ValueError(f"hang_seconds must be >= 0, got {self.hang_seconds}")
        for name in ("batch_seconds", "batch_window_seconds", "batch_cancel_seconds"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.faults = [FaultRule.coerce(rule) for rule in self.faults]
        if self.models is not None:
            self.models = tuple(self.models)
            if not self.models or not all(isinstance(m, str) and m for m in self.models):
                raise ValueError(f"models must be non-empty names, got {self.models!r}")
        if self.api_keys is not None:
            self.api_keys = set(self.api_keys)


@dataclass
class _RuleState:
    rule: FaultRule
    remaining: int | None
    matched: int = 0


@dataclass
class _Admission:
    """What was decided about one chat request when it arrived."""

    record: dict[str, Any]
    rule: FaultRule | None
    rule_index: int | None


class SimulatorState:
    """Counters, fault rules and accepted keys shared by the app and its Python controllers.

    Mutated from the server's event loop and read from other threads (tests, the CLI), so every
    access goes through one lock that is never held across an ``await``.
    """

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._rules = [_RuleState(rule, rule.times) for rule in config.faults]
        self._api_keys = None if config.api_keys is None else set(config.api_keys)
        self._total = 0
        self._by_key: Counter[str] = Counter()
        self._tokens_by_key: Counter[str] = Counter()
        # The document text of the newest requests, per Idempotency-Key (what the model saw).
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._by_status: Counter[str] = Counter()
        # Batch lines, counted apart from synchronous calls (they are not "requests to the
        # chat endpoint"), per custom_id, and every call of every endpoint.
        self._batch_lines_by_key: Counter[str] = Counter()
        self._batch_tokens_by_key: Counter[str] = Counter()
        self._batch_lines_by_status: Counter[str] = Counter()
        self._by_endpoint: Counter[str] = Counter()
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._in_flight = 0
        self._peak_in_flight = 0
        # asyncio primitives belong to one loop; a restarted server runs a new one.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._capacity: asyncio.Semaphore | None = None
        self._hang_release: asyncio.Event | None = None
        self.prompt_cache = PromptCache()

    # -- control ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self._total,
                "by_key": dict(self._by_key),
                "tokens_by_key": dict(self._tokens_by_key),
                "tokens": sum(self._tokens_by_key.values()),
                "by_status": dict(self._by_status),
                "by_endpoint": dict(self._by_endpoint),
                "batch_lines": sum(self._batch_lines_by_key.values()),
                "batch_lines_by_key": dict(self._batch_lines_by_key),
                "batch_tokens_by_key": dict(self._batch_tokens_by_key),
                "batch_lines_by_status": dict(self._batch_lines_by_status),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak_in_flight,
                "requests": [dict(record) for record in self._requests],
            }

    def requests_for(self, key: str) -> int:
        with self._lock:
            return self._by_key.get(key, 0)

    def reset(self) -> None:
        """Clear the counters and the prompt cache; fault rules and api keys stay as they are."""
        with self._lock:
            self._total = 0
            self._by_key.clear()
            self._tokens_by_key.clear()
            self._texts.clear()
            self._by_status.clear()
            self._batch_lines_by_key.clear()
            self._batch_tokens_by_key.clear()
            self._batch_lines_by_status.clear()
            self._by_endpoint.clear()
            self._requests.clear()
            self._peak_in_flight = self._in_flight
        self.prompt_cache.clear()

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        rules = [FaultRule.coerce(rule) for rule in faults]
        with self._lock:
            self._rules = [_RuleState(rule, rule.times) for rule in rules]

    def faults(self) -> dict[str, Any]:
        with self._lock:
            return {
                "faults": [state.rule.as_dict() for state in self._rules],
                "state": [
                    {"remaining": state.remaining, "matched": state.matched}
                    for state in self._rules
                ],
            }

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        with self._lock:
            self._api_keys = None if keys is None else set(keys)

    def api_keys_summary(self) -> dict[str, Any]:
        # Never hand the keys back: the control API is unauthenticated.
        with self._lock:
            keys = self._api_keys
            return {"enforced": keys is not None, "count": 0 if keys is None else len(keys)}

    # -- request path ------------------------------------------------------------------------

    def is_authorized(self, authorization: str | None) -> bool:
        with self._lock:
            keys = self._api_keys
        if keys is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and token.strip() in keys

    def admit(
        self,
        key: str,
        authorized: bool,
        text: str | None,
        max_tokens: int | None = None,
        *,
        batch: bool = False,
    ) -> _Admission:
        """Count an arriving chat request (or a batch line, keyed by its ``custom_id``) and pick
        the fault rule that hits it, if any.

        Rules are chosen on arrival, in arrival order, so ``times`` and ``every`` mean the same
        thing however many requests run concurrently.
        """
        record: dict[str, Any] = {
            "key": key,
            "status": None,
            "authorized": authorized,
            "fault": None,
            "max_tokens": max_tokens,
            "at": datetime.now(timezone.utc).isoformat(),
        }
        if batch:
            record["batch"] = True
        with self._lock:
            if batch:
                self._batch_lines_by_key[key] += 1
            else:
                self._total += 1
                self._by_key[key] += 1
                self._requests.append(record)
            if text is not None:
                self._texts[key] = text
                self._texts.move_to_end(key)
                while len(self._texts) > MAX_RECORDED_REQUESTS:
                    self._texts.popitem(last=False)
            if not authorized or text is None:
                return _Admission(record, None, None)
            for index, state in enumerate(self._rules):
                if state.remaining == 0 or not state.rule.matches(text, key):
                    continue
                state.matched += 1
                if state.matched % state.rule.every:
                    continue
                if state.remaining is not None:
                    state.remaining -= 1
                record["fault"] = state.rule.kind
                return _Admission(record, state.rule, index)
        return _Admission(record, None, None)

    def text_for(self, key: str) -> str | None:
        """The document text the newest request with this key carried."""
        with self._lock:
            return self._texts.get(key)

    def add_usage(self, key: str, tokens: int, *, batch: bool = False) -> None:
        """The tokens a reply reported (``usage.total_tokens``), per Idempotency-Key (per
        ``custom_id`` for a batch line)."""
        with self._lock:
            (self._batch_tokens_by_key if batch else self._tokens_by_key)[key] += tokens

    def count_endpoint(self, name: str) -> None:
        """One call of an endpoint (``chat.completions``, ``files.create``, ``batches.list``…)."""
        with self._lock:
            self._by_endpoint[name] += 1

    def finish(
        self, record: dict[str, Any], status: int | str | None, fault: str | None = None
    ) -> None:
        """Record the outcome: an HTTP status, or None when the connection was reset (a batch
        line: "expired" when its batch's window closed first)."""
        with self._lock:
            record["status"] = status
            if fault is not None:
                record["fault"] = fault
            counter = self._batch_lines_by_status if record.get("batch") else self._by_status
            counter["reset" if status is None else str(status)] += 1

    def _loop_objects(self) -> tuple[asyncio.Semaphore, asyncio.Event]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._capacity is None or self._hang_release is None:
            self._loop = loop
            self._capacity = asyncio.Semaphore(self.config.max_concurrency)
            self._hang_release = asyncio.Event()
        return self._capacity, self._hang_release

    @asynccontextmanager
    async def capacity(self) -> AsyncIterator[None]:
        """Hold one of the ``max_concurrency`` slots; requests beyond that wait here."""
        semaphore, _ = self._loop_objects()
        async with semaphore:
            with self._lock:
                self._in_flight += 1
                self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            try:
                yield
            finally:
                with self._lock:
                    self._in_flight -= 1

    async def hang(self) -> None:
        """Stall like a stuck upstream, but give way at once when the server shuts down."""
        _, release = self._loop_objects()
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(release.wait(), timeout=self.config.hang_seconds)

    def release_hangs(self) -> None:
        """Wake every hanging request; must run on the server's event loop."""
        _, release = self._loop_objects()
        release.set()

    def release_hangs_from(self) -> None:
        """``release_hangs`` from another thread than the server's: the requests a "timeout"
        fault holds are answered at once, as usual (and later ones are not held)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.release_hangs)
