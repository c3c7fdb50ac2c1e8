"""A PDF's first page as a small PNG for the review page, within a fixed budget.

Any tenant can upload a PDF, and its first page's box says how large a rendering is: a page 1
point wide and 14,400 high, scaled to a fixed width, is billions of pixels. So the page box is read
first and the page is scaled to fit ``MAX_WIDTH`` × ``MAX_HEIGHT`` (both bounded); a box that is
not finite, not positive, or so thin that it would be under ``MIN_SIDE`` pixels across, is not
rendered at all. Rendering happens in a thread of its own, one at a time (pdfium is not
thread-safe), within ``RENDER_SECONDS``, with at most ``RENDER_BACKLOG`` waiting; whatever cannot be rendered within the budget — that box, a broken file,
a page that takes too long — gets the placeholder. Renderings are cached by document id (a
document's bytes never change under its id), so a page that shows every thumbnail at once
renders each of them once.
"""

from __future__ import annotations

import asyncio
import io
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache

MAX_WIDTH = 240
MAX_HEIGHT = 320
MIN_SIDE = 8
RENDER_SECONDS = 5.0
CACHE_ENTRIES = 256
RENDER_BACKLOG = 4

# pdfium keeps global state: one rendering at a time in this process.
_PDFIUM = threading.Lock()


def fit(width: float, height: float) -> float | None:
    """The scale that fits a page box of ``width`` × ``height`` points in the budget, or None
    when the box cannot be shown within it."""
    if not (math.isfinite(width) and math.isfinite(height)) or width <= 0 or height <= 0:
        return None
    scale = min(MAX_WIDTH / width, MAX_HEIGHT / height)
    if width * scale < MIN_SIDE or height * scale < MIN_SIDE:
        return None
    return scale


def render_first_page(data: bytes) -> bytes | None:
    """The first page of a PDF as a PNG within ``MAX_WIDTH`` × ``MAX_HEIGHT``, or None when it
    cannot be rendered within that budget (or is not a readable PDF)."""
    import pypdfium2 as pdfium

    with _PDFIUM:
        try:
            pdf = pdfium.PdfDocument(data)
        except pdfium.PdfiumError:
            return None
        try:
            if len(pdf) < 1:
                return None
            page = pdf[0]
            try:
                width, height = page.get_size()
                if page.get_rotation() in (90, 270):
                    width, height = height, width
                scale = fit(width, height)
                if scale is None:
                    return None
                image = page.render(scale=scale, may_draw_forms=False).to_pil()
            finally:
                page.close()
        except pdfium.PdfiumError:
            return None
        finally:
            pdf.close()
    # A box pdfium measures otherwise than it reports is still shrunk into the budget.
    image.thumbnail((MAX_WIDTH, MAX_HEIGHT))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@cache
def placeholder() -> bytes:
    """What the review page shows for a PDF whose first page is not rendered."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (MAX_WIDTH, MAX_HEIGHT), (238, 238, 238))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, MAX_WIDTH - 1, MAX_HEIGHT - 1), outline=(170, 170, 170))
    draw.text((16, MAX_HEIGHT // 2 - 12), "no preview of this page", fill=(90, 90, 90))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


class Thumbnails:
    """Cached first-page renderings, made off the event loop within the time limit.

    Renderings run in a thread of their own, one at a time, so that a slow one never holds the
    worker threads the service's database calls use; at most ``backlog`` wait for it (each holds a
    PDF's bytes), and a request past that answers the placeholder at once.
    """

    def __init__(
        self,
        render: Callable[[bytes], bytes | None] = render_first_page,
        *,
        seconds: float = RENDER_SECONDS,
        entries: int = CACHE_ENTRIES,
        backlog: int = RENDER_BACKLOG,
    ):
        self._render = render
        self._seconds = seconds
        self._entries = entries
        self._backlog = backlog
        self._pending = 0
        self._cache: OrderedDict[str, bytes | None] = OrderedDict()
        self._lock = threading.Lock()
        self._renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thumbnails")

    async def png(self, key: str, original: Callable[[], bytes | None]) -> bytes | None:
        """The thumbnail of the PDF that ``original`` reads (in a worker thread), cached under
        ``key``: its first page, or the placeholder; None when there is no PDF to show."""
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                rendered = self._cache[key]
                return placeholder() if rendered is None else rendered
            if self._pending >= self._backlog:
                return placeholder()  # not cached: a busy moment is not the page's fault
            self._pending += 1
        try:
            data = await asyncio.to_thread(original)
        except BaseException:
            self._done()
            raise
        if data is None:
            self._done()
            return None
        job = asyncio.get_running_loop().run_in_executor(self._renderer, self._render, data)
        # Counted until the rendering really ends, whether or not anyone still waits for it.
        job.add_done_callback(lambda _: self._done())
        try:
            rendered = await asyncio.wait_for(asyncio.shield(job), timeout=self._seconds)
        except asyncio.TimeoutError:
            return placeholder()
        with self._lock:
            self._cache[key] = rendered
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return placeholder() if rendered is None else rendered

    @property
    def pending(self) -> int:
        """Renderings asked for and not ended yet (running or waiting)."""
        with self._lock:
            return self._pending

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
