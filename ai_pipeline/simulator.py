"""An OpenAI-compatible LLM simulator: deterministic document analysis with fault injection.

What lives here:

* the analysis itself (:func:`analyse`): keywords, summary, sentiment, entities and confidence
  computed from the document text alone, so the same document always gets the same answer;
* :class:`FaultRule`, the description of one injected failure (an HTTP status, a connection reset,
  a hang, or a malformed answer), and :class:`SimulatorConfig`;
* :func:`create_app`, the Starlette app serving ``/v1/models``, ``/v1/chat/completions`` and the
  control API under ``/_sim/`` (stats, reset, faults, api-keys);
* :class:`SimulatorServer`, which runs the app with uvicorn in a background thread (tests, the
  demo), :func:`serve`, which runs it in the foreground (the ``simulate-llm`` command), and
  :class:`SimulatorControl`, which drives a simulator running in another process over HTTP.

Only chat completions are counted in the stats: listing models is not an LLM call, and counting
it would blur "how often was this task sent to the model", which is what the counts are for.
The control API is unauthenticated on purpose: the simulator is a local rehearsal tool.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ai_pipeline.prompts import extract_document
from ai_pipeline.serving import (
    BackgroundServer,
    ConnectionReset,
    retry_after_header,
    serve_foreground,
)

DEFAULT_MODEL = "sim-analyst-1"
MAX_SUMMARY_CHARS = 200
MAX_ENTITIES = 10
MAX_RECORDED_REQUESTS = 1000

# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------

_CJK_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{_CJK_CLASS}]")
_CJK_RUN = re.compile(f"[{_CJK_CLASS}]+")
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_WORD = re.compile(f"[{_LATIN}]+(?:['’][{_LATIN}]+)*")
# Entity tokens may carry digits and inner hyphens ("Q3", "Jean-Luc", "AT&T").
_NAME_TOKEN = re.compile(f"[{_LATIN}][{_LATIN}0-9'’&-]*")


def _words(text: str) -> frozenset[str]:
    """The whitespace-separated words of a literal: long word lists stay readable."""
    return frozenset(text.split())


_STOPWORDS = _words(
    """
    about above across after again against almost along already also although always among
    another around because been before behind being below between both could does doing done
    down during each either else enough even ever every from further have having hello hence
    here hers herself himself however into itself just less like made make many might more
    most much must myself near neither never next none nothing once only onto other others
    otherwise ours ourselves over please quite rather really regards same shall should since
    some such than thank thanks that their theirs them themselves then there therefore these
    they this those though through thus till together toward towards under unless until upon
    very want well were what whatever when whenever where whether which while whom whose why
    will with within without would yes your yours yourself yourselves dear sincerely kind best
    also still sure sent send today yesterday tomorrow
    """
)

# Capitalised words that start sentences or letters rather than name anything.
_ENTITY_STOPWORDS = _words(
    """
    The This That These Those There Then Their They Them We Our Ours Us It Its In On At A An If
    Please Dear Thank Thanks Hello Hi Hey Yes No Not None However Unfortunately Fortunately Also
    After Before When While Since Because As But And Or Nor So He She His Her Him You Your Yours
    My Me I What Why How Who Whom Where Which All Some Many Most Each Every Any Both For From To
    With Without By Of Best Kind Regards Sincerely Cheers Overall Today Yesterday Tomorrow Here
    Note Subject Re Fwd Sorry Hope Let Could Would Should Can Will Shall May Might Must Is Are
    Was Were Do Does Did Has Have Had Be Been Being One Two Three Just Only Even Still Again
    Finally First Second Third Next Last Meanwhile Moreover Furthermore Therefore Thus Although
    Though Despite During Until Over Under About Into Once Now Well Ok Okay Regarding Following
    Attached Unless Whether Such Other Another Several Also Instead Yet Perhaps Maybe Otherwise
    """
)
_MONTHS_AND_DAYS = _words(
    """
    January February March April May June July August September October November December
    Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday
    Saturday Sunday Mon Tue Tues Wed Thu Thur Thurs Fri Sat Sun
    """
)

_TITLES = _words("Dr Mr Mrs Ms Prof Sir Dame St")

# Characters that glue Chinese sentences together; a bigram containing one is rarely a topic.
_CJK_FUNCTION_CHARS = frozenset(
    "的了是在和有我们这个为与等也就都而及或被把对从到将向但并其之于以不没很会能要你他她它该此那些还又已让给由吗呢吧啊所一次"
)
# Frequent two-character adverbs and connectives made of content characters.
_CJK_STOP_BIGRAMS = _words(
    "非常 已经 需要 可以 因为 所以 但是 如果 进行 通过 现在 今天 表示 认为 然后 虽然 还是 就是 "
    "只是 或者 以及 之后 之前 以后 其中 目前 时候 非常 十分 比较 特别 一直 仍然"
)

_POSITIVE_EN = _words(
    """
    excellent delighted growth resolved great good happy pleased satisfied grateful appreciate
    appreciated outstanding success successful improved improvement efficient reliable
    recommend love fantastic impressive profit profitable smooth helpful wonderful exceeded
    perfect praise thrilled
    """
)
_NEGATIVE_EN = _words(
    """
    delay delayed delays broken refund complaint complaints outage loss losses damaged late poor
    bad terrible disappointed disappointing angry frustrated unacceptable failure failed cancel
    cancelled problem problems defective missing worst decline declined unhappy slow
    """
)
_POSITIVE_ZH = _words(
    "满意 增长 感谢 优秀 高兴 喜欢 出色 成功 顺利 提升 改善 表扬 推荐 好评 及时 专业 稳定 盈利 "
    "超出预期 解决 感激 开心 完美 可靠 信任 进步 突破 赞赏 愉快 高效"
)
_NEGATIVE_ZH = _words(
    "投诉 延迟 故障 损失 退款 失望 不满意 不满 错误 损坏 破损 缓慢 差评 糟糕 愤怒 下降 亏损 "
    "取消 丢失 延误 中断 失败 拖延 抱怨 退货 缺陷 罚款 未解决 没有解决 问题"
)
# Longest first, so that 不满意 is counted once as negative and not again as 满意.
_ZH_LEXICON = sorted(
    [(w, 1) for w in _POSITIVE_ZH] + [(w, -1) for w in _NEGATIVE_ZH],
    key=lambda p: (-len(p[0]), p[0]),
)

# A period ends a sentence only when followed by whitespace (so "3.5" and "acme.com" survive),
# and not after these abbreviations.
_ABBREVIATIONS = frozenset({"dr", "mr", "mrs", "ms", "prof", "st", "e.g", "i.e", "vs", "approx"})

_DONT_KNOW_EN = re.compile(
    r"\b(?:answer|reply|respond|say|write)(?:\s+(?:with|only|just|exactly|simply))*\s*[:\-]?\s*"
    r"[\"'“”‘’]?\s*i\s+don['’]?t\s+know",
    re.IGNORECASE,
)
_DONT_KNOW_ZH = re.compile(r"(?:回答|回复|答复|说)\s*[:：]?\s*[\"'“”‘’「『]?\s*我不知道")

_HALLUCINATED_ENTITIES = ("Globex Corporation", "Dr. Nora Vance", "Initech Holdings", "Lars Vinter")


def is_chinese(text: str) -> bool:
    """True when Han characters outnumber latin letters: the text is treated as Chinese."""
    cjk = len(_CJK_CHAR.findall(text))
    latin = sum(1 for ch in text if ch.isalpha() and not _CJK_CHAR.match(ch))
    return cjk > 0 and cjk >= latin


def estimate_tokens(text: str) -> int:
    """Roughly what a BPE tokenizer would count: one per Han character, one per 4 other chars."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def _english_keywords(text: str) -> list[str]:
    counts: Counter[str] = Counter()
    for raw in _WORD.findall(text):
        word = raw.lower().replace("’", "'").removesuffix("'s")
        if len(word) >= 4 and "'" not in word and word not in _STOPWORDS:
            counts[word] += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:3]]


def _chinese_keywords(text: str) -> list[str]:
    counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for run in _CJK_RUN.finditer(text):
        chars = run.group(0)
        # Blank out stop bigrams (same length, so positions hold) so that their characters do
        # not pair up with neighbours either: 非常满意 must give 满意, not 常满.
        for stop in sorted(_CJK_STOP_BIGRAMS):
            chars = chars.replace(stop, "  ")
        for i in range(len(chars) - 1):
            bigram = chars[i : i + 2]
            if " " in bigram or not _CJK_FUNCTION_CHARS.isdisjoint(bigram):
                continue
            counts[bigram] += 1
            first_seen.setdefault(bigram, run.start() + i)
    ranked = sorted(counts, key=lambda b: (-counts[b], first_seen[b]))
    chosen: list[str] = []
    for bigram in ranked:
        # Sliding bigrams overlap ("物流延迟" gives 物流, 流延, 延迟); sharing a character with a
        # better-ranked keyword usually means a fragment straddling two words.
        if any(set(bigram) & set(kept) for kept in chosen):
            continue
        chosen.append(bigram)
        if len(chosen) == 3:
            break
    return chosen


def extract_keywords(text: str) -> list[str]:
    """1 to 3 keywords: the most frequent content words (or Chinese bigrams) of the text."""
    keywords = _chinese_keywords(text) if is_chinese(text) else _english_keywords(text)
    if not keywords:
        keywords = _english_keywords(text) or _chinese_keywords(text)
    if not keywords:
        words = _WORD.findall(text) or _CJK_RUN.findall(text) or text.split()
        keywords = [words[0].lower()[:40]] if words else ["document"]
    return keywords


def first_sentence(text: str) -> str:
    """The first sentence of the text with whitespace collapsed (the whole text if it has none)."""
    flat = " ".join(text.split())
    for match in re.finditer(r"[.!?](?=\s|$)|[。！？]", flat):
        end = match.end()
        if match.group(0) == ".":
            before = flat[: match.start()].rsplit(" ", 1)[-1].lower()
            if before in _ABBREVIATIONS:
                continue
        sentence = flat[:end].strip()
        if any(ch.isalnum() for ch in sentence):
            return sentence
    return flat


def summarise(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    """The first sentence, cut at a word boundary with an ellipsis when longer than ``limit``."""
    sentence = first_sentence(text)
    if len(sentence) <= limit:
        return sentence
    cut = sentence[: limit - 1]
    space = cut.rfind(" ")
    # Chinese has no spaces; a boundary far back would throw most of the sentence away.
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-–—") + "…"


def score_sentiment(text: str) -> int:
    """Positive minus negative lexicon hits (English words and Chinese phrases)."""
    score = 0
    for raw in _WORD.findall(text):
        word = raw.lower()
        if word in _POSITIVE_EN:
            score += 1
        elif word in _NEGATIVE_EN:
            score -= 1
    remaining = text
    for phrase, weight in _ZH_LEXICON:
        hits = remaining.count(phrase)
        if hits:
            score += weight * hits
            remaining = remaining.replace(phrase, " ")
    return score


def sentiment_label(text: str) -> str:
    score = score_sentiment(text)
    return "positive" if score > 0 else "negative" if score < 0 else "neutral"


def _starts_sentence(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    if not before or "\n" in text[len(before) : start]:
        return True
    return before[-1] in '.!?。！？:;"“(-•*'


def extract_entities(text: str, limit: int = MAX_ENTITIES) -> list[str]:
    """Runs of capitalised words, minus sentence openers, months and days; verbatim substrings."""
    spans: list[tuple[int, int, str]] = []
    for match in _NAME_TOKEN.finditer(text):
        word = match.group(0).rstrip("'’-&")
        for suffix in ("'s", "’s"):
            word = word.removesuffix(suffix)
        spans.append((match.start(), match.start() + len(word), word))
    lowercase_words = {w.lower() for _, _, w in spans if w[:1].islower()}

    entities: list[str] = []
    segment: list[tuple[int, int, str]] = []

    def flush() -> None:
        if not segment:
            return
        start, end = segment[0][0], segment[-1][1]
        single = len(segment) == 1
        # A lone capitalised word opening a sentence is only a name if the text never uses it
        # in lower case ("Shipping was late ... the shipping" is not an entity).
        common = (
            single and _starts_sentence(text, start) and segment[0][2].lower() in lowercase_words
        )
        name = text[start:end]
        bare_title = single and segment[0][2] in _TITLES
        if not common and not bare_title and name not in entities:
            entities.append(name)
        segment.clear()

    previous_end: int | None = None
    for start, end, word in spans:
        capitalised = len(word) >= 2 and word[0].isupper()
        excluded = word in _ENTITY_STOPWORDS or word in _MONTHS_AND_DAYS
        gap = text[previous_end:start] if previous_end is not None else None
        # "Dr. Nora Vance": a title's period does not end the name.
        adjacent = gap == " " or (gap == ". " and bool(segment) and segment[-1][2] in _TITLES)
        if not capitalised or excluded or not adjacent:
            flush()
        if capitalised and not excluded:
            segment.append((start, end, word))
        previous_end = end
    flush()
    return entities[:limit]


def confidence_for(text: str) -> float:
    """A stable pseudo-confidence in [0.80, 0.97] derived from the text's hash."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)
    return round(0.80 + (digest % 18) / 100, 2)


def analyse(text: str) -> dict[str, Any]:
    """The simulator's deterministic analysis of a document, as the model's JSON answer."""
    return {
        "keywords": extract_keywords(text),
        "summary": summarise(text),
        "sentiment": sentiment_label(text),
        "entities": extract_entities(text),
        "confidence": confidence_for(text),
    }


def dont_know_reply(text: str) -> str | None:
    """The reply of a model that follows an instruction in the text to answer "I don't know"."""
    if _DONT_KNOW_ZH.search(text):
        return "我不知道。"
    if _DONT_KNOW_EN.search(text):
        return "I don't know."
    return None


# ---------------------------------------------------------------------------------------------
# Faults and configuration
# ---------------------------------------------------------------------------------------------

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
)
# Faults that change what the model says rather than how the HTTP exchange goes.
CONTENT_FAULTS = frozenset(FAULT_KINDS[3:])


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

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.hang_seconds < 0:
            raise ValueError(f"hang_seconds must be >= 0, got {self.hang_seconds}")
        self.faults = [FaultRule.coerce(rule) for rule in self.faults]
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
        self._by_status: Counter[str] = Counter()
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._in_flight = 0
        self._peak_in_flight = 0
        # asyncio primitives belong to one loop; a restarted server runs a new one.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._capacity: asyncio.Semaphore | None = None
        self._hang_release: asyncio.Event | None = None

    # -- control ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self._total,
                "by_key": dict(self._by_key),
                "by_status": dict(self._by_status),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak_in_flight,
                "requests": [dict(record) for record in self._requests],
            }

    def requests_for(self, key: str) -> int:
        with self._lock:
            return self._by_key.get(key, 0)

    def reset(self) -> None:
        """Clear the counters; fault rules and api keys stay as they are."""
        with self._lock:
            self._total = 0
            self._by_key.clear()
            self._by_status.clear()
            self._requests.clear()
            self._peak_in_flight = self._in_flight

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

    def admit(self, key: str, authorized: bool, text: str | None) -> _Admission:
        """Count an arriving chat request and pick the fault rule that hits it, if any.

        Rules are chosen on arrival, in arrival order, so ``times`` and ``every`` mean the same
        thing however many requests run concurrently.
        """
        record: dict[str, Any] = {
            "key": key,
            "status": None,
            "authorized": authorized,
            "fault": None,
            "at": datetime.now(timezone.utc).isoformat(),
        }
        with self._lock:
            self._total += 1
            self._by_key[key] += 1
            self._requests.append(record)
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

    def finish(self, record: dict[str, Any], status: int | None, fault: str | None = None) -> None:
        """Record the outcome: an HTTP status, or None when the connection was reset."""
        with self._lock:
            record["status"] = status
            if fault is not None:
                record["fault"] = fault
            self._by_status["reset" if status is None else str(status)] += 1

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


# ---------------------------------------------------------------------------------------------
# HTTP app
# ---------------------------------------------------------------------------------------------


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


_STATUS_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "The request was invalid."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", "permission_denied", "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    409: ("invalid_request_error", "conflict", "The request conflicts with another request."),
    422: ("invalid_request_error", "unprocessable_entity", "The request could not be processed."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded."),
    504: ("server_error", "gateway_timeout", "The upstream server timed out."),
}


def _status_error(status: int, note: str, headers: dict[str, str] | None = None) -> JSONResponse:
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    type_, code, message = _STATUS_ERRORS.get(status, (default_type, None, "Request failed."))
    return JSONResponse(
        _error_body(f"{message} ({note})", type_, code), status_code=status, headers=headers
    )


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _parse_chat_body(raw: bytes) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """(model, messages, error message) of a chat completion request body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None, [], "The request body is not valid JSON."
    if not isinstance(body, dict):
        return None, [], "The request body must be a JSON object."
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None, [], "'messages' must be a list of message objects."
    if body.get("stream"):
        return None, [], "The simulator does not support stream=true."
    model = body.get("model")
    return (model if isinstance(model, str) and model else None), messages, None


def _document_text(messages: list[dict[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            return extract_document(_message_text(message.get("content")))
    return None


def _faulty_content(kind: str, analysis: dict[str, Any], text: str) -> str:
    chinese = is_chinese(text)
    if kind == "refuse":
        return (
            "抱歉，我无法回答这个问题。"
            if chinese
            else "I'm sorry, but I can't help with that request."
        )
    result = dict(analysis)
    if kind == "missing_field":
        result.pop("summary", None)
    elif kind == "wrong_type":
        result["confidence"] = "high"
    elif kind == "low_confidence":
        result["confidence"] = 0.42
    elif kind == "hallucinate":
        invented = [name for name in _HALLUCINATED_ENTITIES if name not in text][:2]
        result["entities"] = [*result["entities"], *invented]
    content = json.dumps(result, ensure_ascii=False)
    if kind == "invalid_json":
        if chinese:
            return f"好的！以下是分析结果：{content} 希望对你有帮助！"
        return f"Sure! Here is the analysis: {content} Hope this helps!"
    return content


def create_app(config: SimulatorConfig) -> Starlette:
    """The simulator's ASGI app; its :class:`SimulatorState` is ``app.state.simulator``."""
    state = SimulatorState(config)

    async def list_models(request: Request) -> Response:
        if not state.is_authorized(request.headers.get("authorization")):
            return _status_error(401, "the simulator does not accept this key")
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": config.model, "object": "model", "created": 0, "owned_by": "simulator"}
                ],
            }
        )

    async def retrieve_model(request: Request) -> Response:
        if not state.is_authorized(request.headers.get("authorization")):
            return _status_error(401, "the simulator does not accept this key")
        model_id = request.path_params["model"]
        return JSONResponse(
            {"id": model_id, "object": "model", "created": 0, "owned_by": "simulator"}
        )

    async def chat_completions(request: Request) -> Response:
        key = request.headers.get("idempotency-key", "")
        authorized = state.is_authorized(request.headers.get("authorization"))
        model, messages, error = _parse_chat_body(await request.body())
        text = None if error else _document_text(messages)
        if error is None and text is None:
            error = "The request has no user message."
        admission = state.admit(key, authorized, text)
        record, rule = admission.record, admission.rule
        note = f"simulated by fault rule #{admission.rule_index}"

        async with state.capacity():
            if config.latency_ms:
                await asyncio.sleep(config.latency_ms / 1000)

            if not authorized:
                state.finish(record, 401)
                return _status_error(401, "the simulator does not accept this key")
            if error is not None or text is None:
                state.finish(record, 400)
                return JSONResponse(
                    _error_body(error or "Bad request.", "invalid_request_error", None),
                    status_code=400,
                )
            fault_header = {"x-simulator-fault": rule.kind} if rule else {}
            if rule is not None and rule.kind == "status":
                headers = dict(fault_header)
                if rule.retry_after is not None:
                    headers["retry-after"] = retry_after_header(rule.retry_after)
                state.finish(record, rule.status)
                return _status_error(rule.status, note, headers)
            if rule is not None and rule.kind == "reset":
                state.finish(record, None)
                return ConnectionReset()
            if rule is not None and rule.kind == "timeout":
                await state.hang()

            finish_reason, builtin_fault = "stop", None
            refusal = dont_know_reply(text)
            # A configured fault wins over the built-in refusal: it is what the user asked for.
            if rule is not None and rule.kind in CONTENT_FAULTS:
                content = _faulty_content(rule.kind, analyse(text), text)
                if rule.kind == "truncate":
                    content, finish_reason = content[: len(content) // 2], "length"
            elif refusal is not None:
                content, builtin_fault = refusal, "dont_know"
            else:
                content = json.dumps(analyse(text), ensure_ascii=False)
            state.finish(record, 200, builtin_fault)
            return _completion(model, messages, content, finish_reason, fault_header)

    def _completion(
        model: str | None,
        messages: list[dict[str, Any]],
        content: str,
        finish_reason: str,
        headers: dict[str, str],
    ) -> JSONResponse:
        prompt_tokens = sum(estimate_tokens(_message_text(m.get("content"))) for m in messages)
        completion_tokens = estimate_tokens(content)
        request_id = uuid.uuid4().hex
        return JSONResponse(
            {
                "id": f"chatcmpl-sim-{request_id}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model or config.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content, "refusal": None},
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
            headers={"x-request-id": request_id, **headers},
        )

    async def get_stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    async def post_reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    async def faults(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
                rules = body["faults"] if isinstance(body, dict) else None
                if not isinstance(rules, list):
                    raise ValueError('expected {"faults": [rule, ...]}')
                state.set_faults(rules)
            except (ValueError, KeyError, ValidationError) as exc:
                return JSONResponse(_error_body(str(exc), "invalid_request_error", None), 400)
        return JSONResponse(state.faults())

    async def api_keys(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError as exc:
                return JSONResponse(_error_body(str(exc), "invalid_request_error", None), 400)
            keys = body.get("api_keys", ...) if isinstance(body, dict) else ...
            if keys is None:
                state.set_api_keys(None)
            elif isinstance(keys, list) and all(isinstance(k, str) and k for k in keys):
                state.set_api_keys(keys)
            else:
                message = 'expected {"api_keys": ["key", ...]} or {"api_keys": null}'
                return JSONResponse(_error_body(message, "invalid_request_error", None), 400)
        return JSONResponse(state.api_keys_summary())

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "model": config.model})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return JSONResponse(
            _error_body(
                f"{request.method} {request.url.path} is not served", "invalid_request_error", None
            ),
            status_code=status,
        )

    app = Starlette(
        routes=[
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/_sim/stats", get_stats, methods=["GET"]),
            Route("/_sim/reset", post_reset, methods=["POST"]),
            Route("/_sim/faults", faults, methods=["GET", "POST"]),
            Route("/_sim/api-keys", api_keys, methods=["GET", "POST"]),
            Route("/_sim/health", health, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )
    app.state.simulator = state
    return app


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


class SimulatorServer(BackgroundServer):
    """The simulator on a uvicorn server in a background thread (port 0 picks a free port)."""

    name = "LLM simulator"

    def __init__(
        self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or SimulatorConfig()
        app = create_app(self.config)
        self.state: SimulatorState = app.state.simulator
        # Hanging requests are released first, so that stopping takes no time.
        super().__init__(app, host, port, on_shutdown=self.state.release_hangs)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.root_url}/v1"

    def stats(self) -> dict[str, Any]:
        """The same document as ``GET /_sim/stats``."""
        return self.state.stats()

    def requests_for(self, key: str) -> int:
        """How many chat requests carried this Idempotency-Key ("" for none)."""
        return self.state.requests_for(key)

    def reset(self) -> None:
        self.state.reset()

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        self.state.set_faults(faults)

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        self.state.set_api_keys(keys)


def serve(config: SimulatorConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the simulator in the foreground until interrupted; prints its base URL first."""
    app = create_app(config)
    serve_foreground(
        app,
        host,
        port,
        banner=lambda url: (
            f"LLM simulator: OpenAI base URL {url}/v1 (control API under {url}/_sim/)"
        ),
        on_shutdown=app.state.simulator.release_hangs,
    )


class SimulatorControl:
    """Drive a simulator in another process over its ``/_sim/`` control API."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        root = base_url.rstrip("/")
        self.root_url = root.removesuffix("/v1")
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        with httpx.Client(timeout=self.timeout) as client:
            response = client.request(method, f"{self.root_url}/_sim/{path}", json=payload)
        if response.status_code == 400:
            raise ValueError(response.json().get("error", {}).get("message", response.text))
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "stats")  # type: ignore[no-any-return]

    def requests_for(self, key: str) -> int:
        return int(self.stats()["by_key"].get(key, 0))

    def reset(self) -> None:
        self._call("POST", "reset")

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "faults")  # type: ignore[no-any-return]

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        # Validate here too, so a typo fails with the same ValueError as in-process.
        rules = [FaultRule.coerce(rule).as_dict() for rule in faults]
        self._call("POST", "faults", {"faults": rules})

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        self._call("POST", "api-keys", {"api_keys": None if keys is None else sorted(keys)})


__all__ = [
    "CONTENT_FAULTS",
    "DEFAULT_MODEL",
    "FAULT_KINDS",
    "FaultRule",
    "SimulatorConfig",
    "SimulatorControl",
    "SimulatorServer",
    "SimulatorState",
    "analyse",
    "create_app",
    "dont_know_reply",
    "serve",
]


if __name__ == "__main__":  # pragma: no cover
    serve(SimulatorConfig(), "127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8000)
