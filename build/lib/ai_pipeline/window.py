"""How many documents of a batch are being worked on at once.

A batch's documents all start together, but a document's bookkeeping before its call (its claim,
its state, its text) runs on the same event loop that sends and receives the LLM calls. Started
all at once, a 2,500-document run did every document's bookkeeping before the loop could send its
second call: about 7 ms a document, 17 s in which one call was in flight instead of the run's
limit (``benchmarks/slots.py``). The window admits a few more documents than can be in flight,
so a document is prepared just before a slot is free for it, and each is claimed only when its
turn comes — a launch overlapping this one takes the documents this run has not reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType

# Documents admitted per LLM call that can be in flight: enough that a freed slot always finds a
# document ready, few enough that the start does not wait for the whole batch's bookkeeping.
DOCUMENTS_PER_SLOT = 2


class DocumentWindow:
    """At most ``size`` documents being worked on at once; one waiting for another run's claim
    steps out of the window while it waits."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a document window needs at least one place, got {size}")
        self.size = size
        self._places = asyncio.Semaphore(size)

    @classmethod
    def for_concurrency(cls, llm_concurrency: int) -> DocumentWindow:
        return cls(max(1, llm_concurrency) * DOCUMENTS_PER_SLOT)

    async def __aenter__(self) -> DocumentWindow:
        await self._places.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._places.release()

    @asynccontextmanager
    async def stepped_out(self) -> AsyncIterator[None]:
        """Give the place up for the time of the block, and take one again after it."""
        self._places.release()
        try:
            yield
        finally:
            await self._places.acquire()
