"""Headless Chromium for the UI tests and the scale benchmark: Debian's browser, never one that
``playwright install`` downloads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Keeps the "Join the Dagster community" pop-up from covering the Dagster UI.
NO_COMMUNITY_POPUP = "localStorage.setItem('communityNux', JSON.stringify('1'))"


def chromium_missing() -> str:
    """Why the browser cannot run here, or "" when it can."""
    return "" if CHROMIUM.exists() else f"{CHROMIUM} is missing (apt-get install chromium)"


@contextmanager
def chromium_page(
    profile: Path, timeout_ms: int, *, http_credentials: dict[str, str] | None = None
) -> Iterator[Any]:
    """A page of a fresh headless Chromium profile in ``profile`` (created), every wait bounded
    by ``timeout_ms`` (signing in with HTTP Basic ``http_credentials`` when a server asks); the
    browser is closed after."""
    from playwright.sync_api import expect, sync_playwright

    # Playwright's assertions wait 5 s by default, apart from the context's timeout: on a slow
    # machine the UI is still loading its code location then.
    expect.set_options(timeout=timeout_ms)
    profile.mkdir(parents=True)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
            http_credentials=http_credentials,  # type: ignore[arg-type]
        )
        try:
            ctx.set_default_timeout(timeout_ms)
            ctx.add_init_script(NO_COMMUNITY_POPUP)
            yield ctx.new_page()
        finally:
            ctx.close()
