"""What the plain core asks of Dagster about a run: whether it is over.

``ai_pipeline.claims`` takes over at once a claim whose owning run is over (its worker killed on
another machine and marked failed by Dagster's run monitoring, a run terminated from the UI),
instead of waiting out the claim's expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dagster as dg

from ai_pipeline.reconcile import RUN_OVER


def run_is_over(
    instance: dg.DagsterInstance, *, recheck_seconds: float = 2.0
) -> Callable[[str], bool]:
    """Whether the Dagster run a claim's owner names is over (an owner that is no run: never).
    A run once over stays over, so that answer is remembered; "not over" is asked again after
    ``recheck_seconds`` (many documents may wait on one run's claims)."""
    over: set[str] = set()
    not_yet: dict[str, float] = {}

    def ask(owner: str) -> bool:
        if owner in over:
            return True
        if time.monotonic() - not_yet.get(owner, -recheck_seconds) < recheck_seconds:
            return False
        run = instance.get_run_by_id(owner)
        if run is None or run.status.value not in RUN_OVER:
            not_yet[owner] = time.monotonic()
            return False
        over.add(owner)
        return True

    return ask
