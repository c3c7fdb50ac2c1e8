"""Review-page thumbnails within a fixed pixel budget: the page box is checked before anything is
rendered, both sides are bounded, renderings are cached and time-limited; and a tall, thin PDF of a
few hundred bytes opened on a served review page costs the serving process almost nothing."""

from __future__ import annotations

import asyncio
import io
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline.service.thumbnails import (
    MAX_HEIGHT,
    MAX_WIDTH,
    Thumbnails,
    fit,
    placeholder,
    render_first_page,
)
from ai_pipeline_tests.dagster_procs import DagsterProcess
from ai_pipeline_tests.service.conftest import (
    OPERATOR_KEY,
    auth,
    failed_into_review,
    pdf_with_page,
)


def size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size  # type: ignore[no-any-return]


def test_every_page_box_fits_the_budget_or_is_not_rendered() -> None:
    """Letter, tall, wide and tiny boxes scale to within 240 × 320; degenerate, infinite and
    too-thin boxes get no scale at all (nothing is rendered for them)."""
    for width, height in [(612, 792), (100, 1000), (2000, 100), (3, 4), (14400, 14400)]:
        scale = fit(width, height)
        assert scale is not None, (width, height)
        assert width * scale <= MAX_WIDTH + 1e-6 and height * scale <= MAX_HEIGHT + 1e-6
    for width, height in [
        (1, 14400),
        (16, 14400),
        (14400, 1),
        (0, 100),
        (-5, 100),
        (float("inf"), 100),
        (float("nan"), 100),
    ]:
        assert fit(width, height) is None, (width, height)


def test_a_tall_thin_first_page_is_not_rendered_and_an_ordinary_one_is_bounded() -> None:
    """The 1 × 14,400-point page (once a 240 × 3,456,000-pixel rendering) and the 16 × 14,400
    one are refused before rendering; a letter page and a tall 100 × 1,000 one render within the
    budget; a broken file is refused too."""
    assert render_first_page(pdf_with_page(1, 14400)) is None
    assert render_first_page(pdf_with_page(16, 14400)) is None
    assert size(render_first_page(pdf_with_page(612, 792)) or b"") == (240, 311)
    assert size(render_first_page(pdf_with_page(100, 1000)) or b"") == (32, 320)
    assert render_first_page(b"%PDF-1.4 not really") is None
    assert size(placeholder()) == (MAX_WIDTH, MAX_HEIGHT)


def test_renderings_are_cached_and_a_slow_one_gets_the_placeholder() -> None:
    """Each document is rendered once however often it is asked for; a rendering that outlasts
    the time limit answers the placeholder (and is not cached as one); while renderings are
    backed up, a request past the backlog answers the placeholder without reading its PDF; no
    PDF, no thumbnail."""
    calls: list[bytes] = []
    read: list[str] = []
    release = threading.Event()

    def render(data: bytes) -> bytes | None:
        calls.append(data)
        if data.startswith(b"slow"):
            release.wait(10)
        return b"png:" + data

    def original(data: bytes | None) -> Callable[[], bytes | None]:
        def read_it() -> bytes | None:
            read.append(repr(data))
            return data

        return read_it

    thumbnails = Thumbnails(render, seconds=1.0, backlog=2)

    async def scenario() -> None:
        assert await thumbnails.png("a", original(b"fast")) == b"png:fast"
        assert await thumbnails.png("a", original(b"fast")) == b"png:fast"
        assert await thumbnails.png("b", original(b"slow 1")) == placeholder()
        assert await thumbnails.png("c", original(b"slow 2")) == placeholder()
        # Two renderings still running or waiting: the backlog is full.
        assert await thumbnails.png("d", original(b"never read")) == placeholder()
        assert thumbnails.pending == 2
        release.set()
        for _ in range(1000):  # the backed-up renderings end (within 10 s on any machine)
            if not thumbnails.pending:
                break
            await asyncio.sleep(0.01)
        assert await thumbnails.png("e", original(None)) is None
        assert await thumbnails.png("b", original(b"slow 1")) == b"png:slow 1"

    asyncio.run(scenario())
    assert calls == [b"fast", b"slow 1", b"slow 2", b"slow 1"]
    assert "b'never read'" not in read


def vm_hwm_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert found, status
    return int(found.group(1))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_tall_thin_pdf_on_the_review_page_costs_the_server_almost_nothing(
    service: DagsterProcess, simulator: SimulatorServer
) -> None:
    """A tenant uploads a 1 × 14,400-point PDF of a few hundred bytes; when it is in front of a
    person and an operator opens the review page (and with it the thumbnail), the serving
    process's peak memory grows by less than 50 MB, the page and its image each answer within
    2 s, and the image is the placeholder."""
    thin = pdf_with_page(1, 14400)
    assert len(thin) < 1000
    submitted = httpx.post(
        f"{service.url}/api/v1/tasks",
        files={"file": ("thin.pdf", thin, "application/pdf")},
        headers=auth("acme"),
        timeout=30,
    )
    assert submitted.status_code == 202, submitted.text
    document_id = failed_into_review("acme", submitted.json()["task_id"])
    assert service.proc is not None
    pid = service.proc.pid
    before = vm_hwm_kib(pid)

    operator = ("alice", OPERATOR_KEY)
    started = time.perf_counter()
    page = httpx.get(f"{service.url}/review", auth=operator, timeout=30)
    page_seconds = time.perf_counter() - started
    assert page.status_code == 200, page.text
    images = re.findall(r'<img class="thumbnail"[^>]* src="([^"]+)"', page.text)
    assert images == [f"{service.url}/review/{document_id}/thumbnail.png"], images
    started = time.perf_counter()
    image = httpx.get(images[0], auth=operator, timeout=30)
    image_seconds = time.perf_counter() - started
    assert image.status_code == 200 and image.content == placeholder()

    grown_mb = (vm_hwm_kib(pid) - before) / 1024
    assert grown_mb < 50, f"the serving process's peak grew by {grown_mb:.0f} MB"
    assert page_seconds < 2 and image_seconds < 2, (page_seconds, image_seconds)
