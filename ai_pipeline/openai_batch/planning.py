"""Planning Batch API jobs: which tasks of a set of documents go in a job (no checkpoint, in no
open job, not given up on), recorded one job per request file, each reserving its budgets at the
batch price. Nothing is sent here (``ai_pipeline.openai_batch.jobs`` sends)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ai_pipeline.declaration import DEFAULT_SECTION_CHARS
from ai_pipeline.openai_batch.request_files import (
    ENDPOINT,
    MAX_BYTES,
    MAX_LINES,
    BatchRequest,
    content_hash,
    file_of,
    requests_for,
    split,
)
from ai_pipeline.spend import DEFAULT_COMPLETION_RESERVE, Prices, estimate_prompt_tokens
from ai_pipeline.store import Store
from ai_pipeline.store.openai_batch_rows import BatchJob, LineState, TasksTaken
from ai_pipeline.store.spend import BudgetRefused

# How many of a task's lines may fail retryably or expire before it is no longer batched.
DEFAULT_MAX_ATTEMPTS = 3


@dataclass
class Plan:
    """What ``plan`` made of a set of documents: the jobs recorded, and what it left out."""

    jobs: list[BatchJob] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # tasks with a checkpoint already
    in_open_jobs: list[str] = field(default_factory=list)  # tasks another job carries
    not_batchable: dict[str, str] = field(default_factory=dict)  # document → why not
    # Tasks no longer sent by batch: a line failed for good (a category that is not
    # retryable), or ``max_attempts`` lines failed or expired; task → why.
    gave_up: dict[str, str] = field(default_factory=dict)
    # Tasks not planned because their job would have taken a budget past its limit.
    over_budget: list[str] = field(default_factory=list)
    budget_message: str | None = None


def plan(
    store: Store,
    document_ids: Iterable[str],
    model: str,
    *,
    section_chars: int = DEFAULT_SECTION_CHARS,
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expired_to_sync: bool = False,
    budget_keys: Sequence[str] = (),
    prices: Prices | None = None,
    completion_reserve: int = DEFAULT_COMPLETION_RESERVE,
) -> Plan:
    """Record the jobs that would analyse these documents through the Batch API: their tasks
    without a checkpoint, in no open job, and not given up on (``gave_up``), one job per file.
    ``expired_to_sync``: a task whose line expired is given up on at once (left to the
    synchronous path) rather than batched again.

    Under budgets (``budget_keys``, priced by ``prices``) each job reserves, as it is recorded,
    what its lines may cost at the batch price: their prompts' estimate and the completion limit
    they carry (at most ``completion_reserve``, as a call under a budget); a job the budget
    cannot hold is not recorded, nor any after it (``over_budget``). Nothing is sent."""
    if budget_keys and prices is None:
        raise ValueError("a plan under a budget needs the prices to reserve at")
    cap = completion_reserve if budget_keys else None
    requests, skipped = requests_for(
        store, document_ids, model, section_chars=section_chars, completion_cap=cap
    )
    if budget_keys:
        assert prices is not None
        requests = [_with_reservation(r, model, prices) for r in requests]
    ids = [r.task.task_id for r in requests]
    done = set(store.checkpoints.get_many(ids))
    taken = store.openai_batches.open_jobs_of(ids)
    gave_up = _given_up(store, ids, max_attempts, expired_to_sync=expired_to_sync)
    wanted = [
        r
        for r in requests
        if r.task.task_id not in done
        and r.task.task_id not in taken
        and r.task.task_id not in gave_up
    ]
    result = Plan(
        done=sorted(done),
        in_open_jobs=sorted(set(taken) - done),
        not_batchable=skipped,
        gave_up={t: why for t, why in gave_up.items() if t not in done and t not in taken},
    )
    parts = split(wanted, max_lines=max_lines, max_bytes=max_bytes)
    for n, part in enumerate(parts):
        try:
            job = _record(store, model, part, result, budget_keys, cap)
        except BudgetRefused as refused:
            state = store.spend.budget(refused.key)
            result.over_budget.extend(r.task.task_id for p in parts[n:] for r in p)
            result.budget_message = state.describe() if state is not None else refused.key
            break
        if job is not None:
            result.jobs.append(job)
    return result


def _with_reservation(request: BatchRequest, model: str, prices: Prices) -> BatchRequest:
    """The request with what its line reserves: its prompt's estimate and the completion limit
    it carries, at the batch price."""
    body = request.body
    prompt = estimate_prompt_tokens(model, body["messages"], body.get("response_format"))
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    completion = limit if isinstance(limit, int) else DEFAULT_COMPLETION_RESERVE
    usd = prices.price(model).for_batch().cost(prompt, completion)
    task = replace(request.task, reserved_tokens=prompt + completion, reserved_usd=usd)
    return BatchRequest(task, body)


def _record(
    store: Store,
    model: str,
    part: list[BatchRequest],
    result: Plan,
    budget_keys: Sequence[str],
    completion_cap: int | None,
    tries: int = 3,
) -> BatchJob | None:
    """Record one job; when another planner took some of its tasks meanwhile, the job is
    recorded without them (None when none is left)."""
    for _ in range(tries):
        if not part:
            return None
        data = file_of(part)
        try:
            return store.openai_batches.plan(
                uuid.uuid4().hex,
                model=model,
                endpoint=ENDPOINT,
                tasks=[r.task for r in part],
                content_hash=content_hash(data),
                content_bytes=len(data),
                budget_keys=budget_keys,
                completion_cap=completion_cap,
            )
        except TasksTaken:
            taken = store.openai_batches.open_jobs_of(r.task.task_id for r in part)
            result.in_open_jobs.extend(sorted(taken))
            part = [r for r in part if r.task.task_id not in taken]
    raise TasksTaken(f"the tasks of a job kept being taken by other planners ({tries} tries)")


def _given_up(
    store: Store, task_ids: Sequence[str], max_attempts: int, *, expired_to_sync: bool = False
) -> dict[str, str]:
    """The tasks whose earlier lines say another batch would not help: one failed for good
    (or expired, with ``expired_to_sync``), or ``max_attempts`` failed retryably or expired (a
    cancelled batch's lines do not count; a batch that failed validation counts for each)."""
    why: dict[str, str] = {}
    tries: dict[str, int] = {}
    lines = store.openai_batches.lines_of(task_ids)
    unanswered = {line.intent_id for line in lines if line.state == LineState.UNANSWERED}
    remote = store.openai_batches.remote_statuses(unanswered) if unanswered else {}
    for line in lines:
        if line.state == LineState.UNANSWERED and remote.get(line.intent_id) == "failed":
            # Its batch failed validation: that was an attempt too.
            tries[line.task_id] = tries.get(line.task_id, 0) + 1
        if line.state == LineState.FAILED and line.category and not line.category.retryable:
            why[line.task_id] = f"{line.category.value}: {line.error or ''}".strip()
        if line.state == LineState.EXPIRED and expired_to_sync:
            why.setdefault(line.task_id, "its batch line expired: left to the synchronous path")
        if line.state in (LineState.FAILED, LineState.EXPIRED):
            tries[line.task_id] = tries.get(line.task_id, 0) + 1
    for task, count in tries.items():
        if count >= max_attempts and task not in why:
            why[task] = f"{count} batch lines failed or expired"
    return why
