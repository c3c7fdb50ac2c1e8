"""The optional accelerator: Dagster's own storages and daemon made faster through Dagster's private
internals, turned on by naming its storage classes in ``dagster.yaml`` (docs/accelerator.md).

It owns every subclass of a Dagster storage, every write to Dagster's own tables and every import
of ``dagster._*``. What it adds reaches the product through the storages' ``ai_pipeline_acceleration``
objects (``ai_pipeline.defs.acceleration``); nothing else imports this package, and the product is
correct without it. On a Dagster release it was not checked against, each storage class builds
Dagster's own storage instead and says so once in the log.
"""

from __future__ import annotations

import logging

import dagster

# The Dagster releases whose private internals this package was checked against.
CHECKED_RELEASES = frozenset({"1.13.27"})

log = logging.getLogger(__name__)
_announced: list[bool] = []


def checked(version: str | None = None) -> bool:
    """Whether the running Dagster (or ``version``) is one this package was checked against; the
    first time it is not, one line in the log says so."""
    version = version or dagster.__version__
    if version in CHECKED_RELEASES:
        return True
    if not _announced:
        _announced.append(True)
        log.warning(
            "ai_pipeline.accelerator is off: it was checked against dagster %s, this is %s; "
            "Dagster's own storage is used instead (correct, not as fast)",
            ", ".join(sorted(CHECKED_RELEASES)),
            version,
        )
    return False
