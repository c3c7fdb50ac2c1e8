"""What LLM calls cost, and the budgets that stop them before they are exceeded.

- :class:`Prices`: USD per million prompt, cached prompt and completion tokens, per model. A
  default table for common OpenAI models is packaged (``data/prices.json``);
  ``AI_PIPELINE_PRICES_FILE`` (JSON or YAML, the same shape) overrides and extends it; a model in
  neither is priced by the two ``AI_PIPELINE_PRICE_PER_1K_*`` settings. A dated model name
  (``gpt-4o-mini-2024-07-18``) takes the price of its longest listed prefix. A reply is priced as
  billed: its uncached prompt tokens at the prompt price, those served from the prompt cache
  (``usage.prompt_tokens_details.cached_tokens``) at the cached price (the prompt price when the
  table has none), and its completion tokens — reasoning tokens included — at the completion
  price.
- :func:`estimate_prompt_tokens`: tiktoken's count for a model it knows, when its encoding can be
  loaded: the encodings of the priced models (o200k_base, cl100k_base) ship in
  ``data/tiktoken/``, so no network is needed for them; others are downloaded once or read from
  ``TIKTOKEN_CACHE_DIR``. Otherwise an estimate that errs high (one token per Han character, one
  per three other characters).
- :class:`Meter`: one run's spending. Before each request it reserves the estimate (the prompt's
  tokens plus the completion limit the request carries, and their price at the uncached prompt
  price) against every budget the run is under; when one would be exceeded the request is not
  sent (BUDGET_REACHED). Under a budget the request asks for at most ``completion_reserve``
  completion tokens (``max_tokens`` or ``max_completion_tokens``), and what it reserves is the
  limit it carries, so no reply costs more than was reserved for it: a reasoning model's
  ``max_completion_tokens`` counts its reasoning tokens too, so they are within the reservation
  (the reserve must leave it room to reason). After it, the real usage is recorded for the
  attempt — whether the answer then passes its checks or not, and for failed requests too — and
  settled against the budgets; a reply that reports no usage is settled at its reservation (the
  estimate), recorded with the outcome ``answer (estimated)``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.settings import Settings, SettingsError
from ai_pipeline.store import Store
from ai_pipeline.store.database import StoreUnavailable
from ai_pipeline.store.spend import ANSWER, ESTIMATED_ANSWER, Usage
from ai_pipeline.tasks import document_of, step_of

logger = logging.getLogger(__name__)

DEFAULT_COMPLETION_RESERVE = 1024
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
# Per message, the chat format adds a few tokens around the content; the reply is primed with 3.
_PER_MESSAGE = 4
_PRIMING = 3


class PricesError(ValueError):
    pass


@dataclass(frozen=True)
class Price:
    """USD per million tokens; cached prompt tokens at ``cached_prompt_per_million`` (None: at
    the prompt price, as for a model without prompt caching)."""

    prompt_per_million: float
    completion_per_million: float
    cached_prompt_per_million: float | None = None
    # The Batch API's price of this model, when the table gives one (``batch_prompt``,
    # ``batch_completion``, ``batch_cached_prompt``); else half of each price (``for_batch``).
    batch: Price | None = None

    def for_batch(self) -> Price:
        """The price of a Batch API line: the table's batch columns, else half of each price
        (OpenAI's Batch API discount)."""
        if self.batch is not None:
            return self.batch
        return Price(
            self.prompt_per_million / 2,
            self.completion_per_million / 2,
            None if self.cached_prompt_per_million is None else self.cached_prompt_per_million / 2,
        )

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What a call costs; ``cached_tokens`` are of ``prompt_tokens``, and the completion's
        reasoning tokens are of ``completion_tokens`` (billed as output)."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = (
            self.prompt_per_million
            if self.cached_prompt_per_million is None
            else self.cached_prompt_per_million
        )
        return (
            (prompt_tokens - cached) * self.prompt_per_million
            + cached * cached_price
            + completion_tokens * self.completion_per_million
        ) / 1_000_000


class Prices:
    def __init__(self, models: Mapping[str, Price], fallback: Price):
        self.models = dict(models)
        self.fallback = fallback

    @classmethod
    def load(
        cls,
        prices_file: str | None = None,
        *,
        per_1k_prompt: float = 0.00015,
        per_1k_completion: float = 0.0006,
    ) -> Prices:
        packaged = resources.files("ai_pipeline").joinpath("data/prices.json").read_text("utf-8")
        models = _parse(json.loads(packaged), "the packaged price table")
        if prices_file:
            path = Path(prices_file)
            try:
                data = yaml.safe_load(path.read_text("utf-8"))
            except (OSError, yaml.YAMLError) as e:
                raise PricesError(f"AI_PIPELINE_PRICES_FILE {path}: {e}") from e
            models.update(_parse(data, f"AI_PIPELINE_PRICES_FILE {path}"))
        return cls(models, Price(per_1k_prompt * 1000, per_1k_completion * 1000))

    @classmethod
    def of(cls, settings: Settings) -> Prices:
        """The settings' table: AI_PIPELINE_PRICES_FILE over the packaged one, the per-1k
        settings for a model in neither; a bad file is a SettingsError naming it."""
        try:
            return cls.load(
                settings.prices_file,
                per_1k_prompt=settings.price_per_1k_prompt_tokens,
                per_1k_completion=settings.price_per_1k_completion_tokens,
            )
        except PricesError as e:
            raise SettingsError(str(e)) from e

    def price(self, model: str) -> Price:
        if model in self.models:
            return self.models[model]
        prefixes = [m for m in self.models if model.startswith(m)]
        return self.models[max(prefixes, key=len)] if prefixes else self.fallback

    def cost(
        self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> float:
        return self.price(model).cost(prompt_tokens, completion_tokens, cached_tokens)

    def batch_cost(
        self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> float:
        """What a Batch API line costs (``Price.for_batch``)."""
        return self.price(model).for_batch().cost(prompt_tokens, completion_tokens, cached_tokens)


def _parse(data: Any, where: str) -> dict[str, Price]:
    """``{"models": {name: {"prompt": usd_per_1M, "completion": usd_per_1M,
    "cached_prompt": usd_per_1M (optional), "batch_prompt", "batch_completion",
    "batch_cached_prompt": the Batch API's, usd_per_1M (optional; both or none of the first
    two)}}}``."""
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise PricesError(f"{where}: expected a mapping 'models: {{name: {{prompt, completion}}}}'")
    out = {}
    for name, entry in models.items():
        try:
            cached = entry.get("cached_prompt")
            batch = None
            if "batch_prompt" in entry or "batch_completion" in entry:
                batch_cached = entry.get("batch_cached_prompt")
                batch = Price(
                    float(entry["batch_prompt"]),
                    float(entry["batch_completion"]),
                    None if batch_cached is None else float(batch_cached),
                )
            out[str(name)] = Price(
                float(entry["prompt"]),
                float(entry["completion"]),
                None if cached is None else float(cached),
                batch,
            )
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PricesError(
                f"{where}: model {name!r} needs numeric 'prompt' and 'completion' and, when "
                "given, 'cached_prompt', and 'batch_prompt' with 'batch_completion' (USD per "
                "million tokens)"
            ) from e
    return out


# --- token estimates ------------------------------------------------------------------------

_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()
# The encodings shipped with the package, in tiktoken's cache layout (data/tiktoken/README.md);
# o200k_harmony is built from o200k_base's file.
SHIPPED_ENCODINGS_DIR = Path(__file__).parent / "data" / "tiktoken"
_BLOB_OF = {"o200k_harmony": "o200k_base"}


def _is_shipped(encoding_name: str) -> bool:
    blob = _BLOB_OF.get(encoding_name, encoding_name)
    url = f"https://openaipublic.blob.core.windows.net/encodings/{blob}.tiktoken"
    return (SHIPPED_ENCODINGS_DIR / hashlib.sha1(url.encode()).hexdigest()).is_file()


def _load_encoding(model: str) -> Any:
    """tiktoken's encoding for a model (KeyError: a model it does not know). A shipped encoding
    is read from the package — tiktoken still checks its SHA-256 — never downloaded; the
    others as tiktoken does (its cache, else the network)."""
    import tiktoken

    name = tiktoken.encoding_name_for_model(model)
    if not _is_shipped(name):
        return tiktoken.get_encoding(name)
    # tiktoken takes its cache folder from the environment only; it is pointed at the package
    # for this one load (tiktoken keeps the encoding it built), then put back.
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHIPPED_ENCODINGS_DIR)
    try:
        return tiktoken.get_encoding(name)
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved


def _encoding(model: str) -> Any:
    """tiktoken's encoding for a model, or None (not an OpenAI model, or not loadable here)."""
    with _encodings_lock:
        if model not in _encodings:
            try:
                _encodings[model] = _load_encoding(model)
            except KeyError:
                _encodings[model] = None
            except Exception as e:  # no network and no cache: estimate instead, say so once
                logger.warning(
                    "tiktoken cannot load the encoding of %s (%s); estimating tokens from "
                    "characters",
                    model,
                    type(e).__name__,
                )
                _encodings[model] = None
        return _encodings[model]


def estimate_text_tokens(text: str) -> int:
    """Errs high against BPE tokenizers: each Han character is a token, and three other
    characters are (English averages about four)."""
    han = len(_HAN.findall(text))
    return han + math.ceil((len(text) - han) / 3)


def count_tokens(model: str, text: str) -> int:
    """A text's tokens for a model: tiktoken's count when it can, else the estimate."""
    encoding = _encoding(model)
    if encoding is not None:
        return len(encoding.encode(text, disallowed_special=()))
    return estimate_text_tokens(text)


def estimate_prompt_tokens(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    response_format: Mapping[str, Any] | None = None,
) -> int:
    """The prompt tokens of a request: its messages, and the JSON schema of its reply's format
    (OpenAI counts a Structured Outputs schema in the prompt; counted as written, it errs
    high)."""
    counted = sum(count_tokens(model, str(m.get("content") or "")) for m in messages)
    if response_format and response_format.get("type") == "json_schema":
        counted += count_tokens(model, json.dumps(response_format, separators=(",", ":")))
    return counted + _PER_MESSAGE * len(messages) + _PRIMING


# --- a run's meter -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    task_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    usd: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Meter:
    """The spending of one run's calls: reserved against its budgets, recorded per attempt."""

    def __init__(
        self,
        store: Store,
        prices: Prices,
        *,
        run_id: str | None = None,
        budget_keys: Sequence[str] = (),
        completion_reserve: int = DEFAULT_COMPLETION_RESERVE,
    ):
        self.store = store
        self.prices = prices
        self.run_id = run_id
        self.budget_keys = list(budget_keys)
        self.completion_reserve = completion_reserve

    @property
    def max_completion_tokens(self) -> int | None:
        """The completion limit a request must carry at most: the reserve when the run is under
        a budget, so that a long reply cannot overshoot it; None otherwise."""
        return self.completion_reserve if self.budget_keys else None

    def reserve(
        self,
        task_id: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        completion_tokens: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> Reservation:
        """Reserve a request's estimate: its prompt and ``completion_tokens``, the completion
        limit it carries (``completion_reserve`` when not given) — for a reasoning model that
        limit counts its reasoning too, so the reservation covers it. Raises BUDGET_REACHED
        (nothing reserved) when it would take a budget past its limit."""
        completion = self.completion_reserve if completion_tokens is None else completion_tokens
        prompt = estimate_prompt_tokens(model, messages, response_format)
        usd = self.prices.cost(model, prompt, completion)
        tokens = prompt + completion
        refused = self.store.spend.reserve(self.budget_keys, tokens, usd)
        if refused is not None:
            raise ClassifiedError(
                Category.BUDGET_REACHED,
                f"not sent: this call needs about {tokens:,} tokens (${usd:.4f}) and the budget "
                f"would be exceeded — {refused.describe()}",
            )
        return Reservation(task_id, model, prompt, completion, usd)

    def settle(
        self,
        reservation: Reservation,
        *,
        outcome: str = ANSWER,
        model: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        usage_reported: bool = True,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> Usage:
        """Record what a request used (nothing reported: 0) and release its reservation, priced
        as billed: ``cached_tokens`` (of the prompt's) at the cached price, ``reasoning_tokens``
        (of the completion's) as output.

        A reply (``outcome`` ANSWER) whose endpoint reported no usage (``usage_reported``
        False) was paid for all the same: it is settled at its reservation, as
        ``answer (estimated)``, so that the budget keeps binding."""
        model = model or reservation.model
        prompt, completion = prompt_tokens or 0, completion_tokens or 0
        cost = self.prices.cost(model, prompt, completion, cached_tokens or 0)
        if outcome == ANSWER and not usage_reported:
            prompt, completion = reservation.prompt_tokens, reservation.completion_tokens
            cached_tokens = reasoning_tokens = None
            outcome, cost = ESTIMATED_ANSWER, reservation.usd
            logger.warning(
                "%s: the reply reported no usage; settled at its reservation (%s tokens, $%.6f)",
                reservation.task_id,
                f"{reservation.tokens:,}",
                cost,
            )
        usage = Usage(
            task_id=reservation.task_id,
            document_id=document_of(reservation.task_id),
            step=step_of(reservation.task_id),
            model=model,
            outcome=outcome,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=cost,
            run_id=self.run_id,
            cached_tokens=cached_tokens,
            reasoning_tokens=reasoning_tokens,
        )
        try:
            self.store.spend.settle(self.budget_keys, reservation.tokens, reservation.usd, usage)
        except StoreUnavailable as e:
            # The answer it paid for matters more than its bookkeeping: it goes on to its
            # checkpoint; the reservation stays held, which errs on the side of the budget.
            logger.warning("usage of %s not recorded: %s", reservation.task_id, e.message)
        return usage


# --- which budgets a run is under ------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """The limits a command sets (``--budget-tokens``, ``--budget-usd``); None: no limit."""

    tokens: int | None = None
    usd: float | None = None

    @classmethod
    def of(cls, tokens: int | None, usd: float | None) -> Budget | None:
        return None if tokens is None and usd is None else cls(tokens, usd)


# A run tag naming budgets (comma-separated keys) set by `run --budget-*`; a batch's budget is
# found by the batch tag its backfill's runs carry.
BUDGET_TAG = "ai_pipeline/budget"


def batch_budget_key(batch_id: str) -> str:
    return f"batch:{batch_id}"


def run_budget_key(run_id: str) -> str:
    return f"run:{run_id}"


def run_budgets(
    store: Store,
    tags: Mapping[str, str],
    *,
    run_id: str | None,
    batch_id: str | None,
    tokens: int | None,
    usd: float | None,
) -> list[str]:
    """The budgets a run reserves against: its own (the AI_PIPELINE_RUN_BUDGET_* settings, made
    here), the ones its tag names, and its batch's when the batch has one."""
    keys = []
    if run_id and (tokens is not None or usd is not None):
        keys.append(store.spend.set_budget(run_budget_key(run_id), tokens=tokens, usd=usd).key)
    named = [k.strip() for k in tags.get(BUDGET_TAG, "").split(",") if k.strip()]
    if batch_id:
        named.append(batch_budget_key(batch_id))
    return keys + store.spend.existing(named)
