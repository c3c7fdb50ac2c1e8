"""Spend: the usage of every LLM attempt, and the budgets calls reserve against before they go.

A reservation is one conditional UPDATE per budget, all in one transaction: it succeeds only when
what is spent plus what is reserved plus this call's estimate stays within every limit, so runs in
other processes reserving against the same budget at the same moment can never both pass the last
gap. Settling moves the estimate out of ``reserved`` and the real usage into ``spent``, in the same
transaction as the attempt's usage row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.tables import budgets, documents, llm_usage

ANSWER = "answer"
# A reply whose endpoint reported no usage: recorded at the reservation made for it.
ESTIMATED_ANSWER = "answer (estimated)"
ANSWERS = (ANSWER, ESTIMATED_ANSWER)


@dataclass(frozen=True)
class Usage:
    """One attempt's usage: a reply (``outcome`` ANSWER, or ESTIMATED_ANSWER when the endpoint
    reported none and the reservation stands for it) or a request that failed (its category;
    tokens are what the endpoint reported, usually none).

    ``cached_tokens`` are part of ``prompt_tokens`` (served from the prompt cache, billed lower)
    and ``reasoning_tokens`` part of ``completion_tokens`` (billed as output, not in the reply);
    None when the endpoint did not report them."""

    task_id: str
    document_id: str
    step: str
    model: str
    outcome: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    run_id: str | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    # "sync" (a call) or "batch" (a Batch API line, at the batch price).
    via: str = "sync"

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class BudgetState:
    key: str
    limit_tokens: int | None
    limit_usd: float | None
    reserved_tokens: int
    reserved_usd: float
    spent_tokens: int
    spent_usd: float

    def describe(self) -> str:
        """ "batch:… 9,870 of 10,000 tokens spent, 130 left" (and the same for USD)."""
        parts = []
        if self.limit_tokens is not None:
            left = max(0, self.limit_tokens - self.spent_tokens)
            parts.append(
                f"{self.spent_tokens:,} of {self.limit_tokens:,} tokens spent, {left:,} left"
            )
        if self.limit_usd is not None:
            left_usd = max(0.0, self.limit_usd - self.spent_usd)
            parts.append(
                f"${self.spent_usd:.4f} of ${self.limit_usd:.4f} spent, ${left_usd:.4f} left"
            )
        return f"{self.key}: " + "; ".join(parts or ["no limit"])

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "limit_tokens": self.limit_tokens,
            "limit_usd": self.limit_usd,
            "spent_tokens": self.spent_tokens,
            "spent_usd": round(self.spent_usd, 6),
            "reserved_tokens": self.reserved_tokens,
        }


@dataclass(frozen=True)
class Totals:
    """Sums over attempts; ``cached_tokens`` are within ``prompt_tokens`` and
    ``reasoning_tokens`` within ``completion_tokens`` (attempts that reported none count 0)."""

    attempts: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost_usd": round(self.cost_usd, 6),
        }


_SUMS = (
    sa.func.count(),
    sa.func.coalesce(sa.func.sum(llm_usage.c.prompt_tokens), 0),
    sa.func.coalesce(sa.func.sum(llm_usage.c.completion_tokens), 0),
    sa.func.coalesce(sa.func.sum(llm_usage.c.cost_usd), 0.0),
    sa.func.coalesce(sa.func.sum(llm_usage.c.cached_tokens), 0),
    sa.func.coalesce(sa.func.sum(llm_usage.c.reasoning_tokens), 0),
)


# Built once: a run records and reads a document's spend with every call it makes.
_PER_DOCUMENT = sa.select(llm_usage.c.document_id, *_SUMS).group_by(llm_usage.c.document_id)
_RECORD_USAGE = sa.insert(llm_usage)


def _totals(row: Any) -> Totals:
    return Totals(int(row[0]), int(row[1]), int(row[2]), float(row[3]), int(row[4]), int(row[5]))


def record_usage(
    conn: Connection,
    usage: Usage,
    keys: Sequence[str] = (),
    reserved_tokens: int = 0,
    reserved_usd: float = 0.0,
) -> None:
    """Record an attempt's usage on ``conn`` (in the caller's transaction: a Batch API line's
    usage is recorded in the one that marks the line answered), moving its reservation into
    what each budget of ``keys`` spent."""
    now = utcnow()
    conn.execute(
        _RECORD_USAGE,
        {
            "task_id": usage.task_id,
            "document_id": usage.document_id,
            "step": usage.step,
            "run_id": usage.run_id,
            "model": usage.model,
            "outcome": usage.outcome,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "cost_usd": usage.cost_usd,
            "via": usage.via,
            "created_at": now,
        },
    )
    if keys:
        conn.execute(
            sa.update(budgets)
            .where(budgets.c.key.in_(list(keys)))
            .values(
                reserved_tokens=budgets.c.reserved_tokens - reserved_tokens,
                reserved_usd=budgets.c.reserved_usd - reserved_usd,
                spent_tokens=budgets.c.spent_tokens + usage.tokens,
                spent_usd=budgets.c.spent_usd + usage.cost_usd,
                updated_at=now,
            )
        )


class BudgetRefused(Exception):
    """A reservation would take the budget ``key`` past its limit (raised in the caller's
    transaction, which then reserves nothing anywhere)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def reserve_in(conn: Connection, keys: Sequence[str], tokens: int, usd: float) -> None:
    """Reserve an estimate against every budget of ``keys`` on ``conn``, each in one conditional
    UPDATE; raises BudgetRefused for the first that it would exceed."""
    now = utcnow()
    for key in keys:
        fits = sa.and_(
            budgets.c.key == key,
            sa.or_(
                budgets.c.limit_tokens.is_(None),
                budgets.c.spent_tokens + budgets.c.reserved_tokens + tokens
                <= budgets.c.limit_tokens,
            ),
            sa.or_(
                budgets.c.limit_usd.is_(None),
                budgets.c.spent_usd + budgets.c.reserved_usd + usd <= budgets.c.limit_usd,
            ),
        )
        taken = conn.execute(
            sa.update(budgets)
            .where(fits)
            .values(
                reserved_tokens=budgets.c.reserved_tokens + tokens,
                reserved_usd=budgets.c.reserved_usd + usd,
                updated_at=now,
            )
        ).rowcount
        if not taken:
            raise BudgetRefused(key)


def release_in(conn: Connection, keys: Sequence[str], tokens: int, usd: float) -> None:
    """Give back a reservation nothing was spent against (a request that never went out)."""
    if keys and (tokens or usd):
        conn.execute(
            sa.update(budgets)
            .where(budgets.c.key.in_(list(keys)))
            .values(
                reserved_tokens=budgets.c.reserved_tokens - tokens,
                reserved_usd=budgets.c.reserved_usd - usd,
                updated_at=utcnow(),
            )
        )


class Spend:
    def __init__(self, db: Database):
        self.db = db

    # --- budgets ---------------------------------------------------------------------------

    def set_budget(self, key: str, *, tokens: int | None, usd: float | None) -> BudgetState:
        """Create a budget or change its limits; what it has spent so far stays spent."""
        now = utcnow()
        stmt = self.db.insert(budgets).values(
            key=key,
            limit_tokens=tokens,
            limit_usd=usd,
            reserved_tokens=0,
            reserved_usd=0.0,
            spent_tokens=0,
            spent_usd=0.0,
            created_at=now,
            updated_at=now,
        )
        upsert = stmt.on_conflict_do_update(
            index_elements=["key"],
            set_={"limit_tokens": tokens, "limit_usd": usd, "updated_at": now},
        )
        self.db.write(lambda conn: conn.execute(upsert))
        state = self.budget(key)
        assert state is not None
        return state

    def budget(self, key: str) -> BudgetState | None:
        rows = self.db.rows(sa.select(budgets).where(budgets.c.key == key))
        return _budget(rows[0]) if rows else None

    def existing(self, keys: Iterable[str]) -> list[str]:
        """Which of these keys name a budget."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []
        rows = self.db.rows(sa.select(budgets.c.key).where(budgets.c.key.in_(wanted)))
        found = {r.key for r in rows}
        return [k for k in wanted if k in found]

    def reserve(self, keys: Sequence[str], tokens: int, usd: float) -> BudgetState | None:
        """Reserve an estimate against every budget of ``keys`` at once; None when reserved, else
        the budget it would exceed (and nothing is reserved anywhere)."""
        if not keys:
            return None
        try:
            self.db.write(lambda conn: reserve_in(conn, keys, tokens, usd))
        except BudgetRefused as refused:
            return self.budget(refused.key)
        return None

    def settle(
        self, keys: Sequence[str], reserved_tokens: int, reserved_usd: float, usage: Usage
    ) -> None:
        """Record an attempt's usage, and move its reservation into what each budget spent."""
        settle = self.db.write if keys else self.db.write_each  # without: one insert
        settle(lambda conn: record_usage(conn, usage, keys, reserved_tokens, reserved_usd))

    # --- what was spent ----------------------------------------------------------------------

    def attempts(self, task_or_document_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Every recorded attempt of these tasks or documents, oldest first."""
        wanted = list(task_or_document_ids)
        query = (
            sa.select(llm_usage)
            .where(sa.or_(llm_usage.c.task_id.in_(wanted), llm_usage.c.document_id.in_(wanted)))
            .order_by(llm_usage.c.id)
        )
        return [dict(r._mapping) for r in self.db.rows(query)]

    def for_documents(self, document_ids: Iterable[str]) -> dict[str, Totals]:
        """Each document's spend over all its attempts (documents without any are absent)."""
        rows = self.db.select_in(_PER_DOCUMENT, llm_usage.c.document_id, document_ids)
        return {r[0]: _totals(r[1:]) for r in rows}

    def for_run(self, run_id: str) -> Totals:
        query = sa.select(*_SUMS).where(llm_usage.c.run_id == run_id)
        return _totals(self.db.rows(query)[0])

    def total(self, document_ids: Iterable[str] | None = None) -> Totals:
        if document_ids is None:
            return _totals(self.db.rows(sa.select(*_SUMS))[0])
        per = self.for_documents(document_ids).values()
        return Totals(
            sum(t.attempts for t in per),
            sum(t.prompt_tokens for t in per),
            sum(t.completion_tokens for t in per),
            sum(t.cost_usd for t in per),
            sum(t.cached_tokens for t in per),
            sum(t.reasoning_tokens for t in per),
        )

    def by_batch_api(self) -> dict[str, Totals]:
        """The spend of Batch API lines, by model: what its price is to be compared with."""
        query = (
            sa.select(llm_usage.c.model, *_SUMS)
            .where(llm_usage.c.via == "batch")
            .group_by(llm_usage.c.model)
        )
        return {r[0]: _totals(r[1:]) for r in self.db.rows(query)}

    def by_category(self) -> dict[str, Totals]:
        """The spend on documents that are not completed, by their failure category: what the
        failures cost."""
        query = (
            sa.select(documents.c.category, *_SUMS)
            .select_from(
                llm_usage.join(documents, documents.c.document_id == llm_usage.c.document_id)
            )
            .where(documents.c.state != "COMPLETED", documents.c.category.is_not(None))
            .group_by(documents.c.category)
        )
        return {r[0]: _totals(r[1:]) for r in self.db.rows(query)}

    def reanalyses(self) -> Totals:
        """The answers beyond the first of each document's step (its analysis, each section):
        calls made again for what had been answered (a reviewer's retry, a new prompt version or
        model)."""
        firsts = (
            sa.select(sa.func.min(llm_usage.c.id).label("id"))
            .where(llm_usage.c.outcome.in_(ANSWERS))
            .group_by(llm_usage.c.document_id, llm_usage.c.step)
        )
        query = sa.select(*_SUMS).where(
            llm_usage.c.outcome.in_(ANSWERS), llm_usage.c.id.not_in(firsts.scalar_subquery())
        )
        return _totals(self.db.rows(query)[0])


def _budget(row: Any) -> BudgetState:
    return BudgetState(
        key=row.key,
        limit_tokens=row.limit_tokens,
        limit_usd=row.limit_usd,
        reserved_tokens=int(row.reserved_tokens),
        reserved_usd=float(row.reserved_usd),
        spent_tokens=int(row.spent_tokens),
        spent_usd=float(row.spent_usd),
    )
