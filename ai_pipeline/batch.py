"""Running a batch of documents concurrently, while the caller reports the ones already done.

The documents of a batch run on an asyncio event loop in a worker thread, bounded by the LLM
client's concurrency; each one's events come back to the caller's thread as it finishes, together
with the log lines written on its behalf (Dagster's run log belongs to the step's thread). The
run's claims on its documents are renewed on the same loop while they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ai_pipeline.engine import Analyser
from ai_pipeline.failures import Category
from ai_pipeline.llm import RunStopped
from ai_pipeline.redaction import redact
from ai_pipeline.stages import Event, Stage, StageFailed
from ai_pipeline.window import DocumentWindow

# How long past the LLM client's timeout a stopped batch waits for its calls in flight.
STOP_GRACE_SECONDS = 5.0


class _ForwardedLog:
    """Log lines written on the worker thread, handed to the caller's thread to be logged there
    (Dagster's run log belongs to the step's thread)."""

    def __init__(self, out: queue.Queue[Any]):
        self._out = out

    def info(self, msg: str) -> None:
        self._out.put(("log", "info", msg))

    def warning(self, msg: str) -> None:
        self._out.put(("log", "warning", msg))

    def error(self, msg: str) -> None:
        self._out.put(("log", "error", msg))


def run_batch(
    analyser: Analyser, document_ids: Sequence[str], *, window: int | None = None
) -> Iterator[tuple[str, list[Event]]]:
    """Process documents concurrently; yields ``(document_id, events)`` as each one finishes
    (``run_batch_groups``, one document at a time)."""
    groups = run_batch_groups(analyser, document_ids, window=window, most=1)
    try:
        for group in groups:
            yield from group
    finally:
        groups.close()  # closed early: stops what still runs, as ``run_batch_groups`` says


def run_batch_groups(
    analyser: Analyser,
    document_ids: Sequence[str],
    *,
    window: int | None = None,
    most: int = 1,
) -> Generator[list[tuple[str, list[Event]]], None, None]:
    """Process documents concurrently; yields the ``(document_id, events)`` of the documents
    finished since the caller last took some: at least one, at most ``most``, in the order they
    finished. A caller that reports documents slower than they finish gets them in groups, which
    it may write together (``ai_pipeline.defs.assets`` writes a group's events in one
    transaction); a caller that keeps up gets them one by one.

    The documents run on an event loop in a worker thread, so that LLM calls, notices and database
    writes go on while the caller reports the documents already done (a Dagster step writes each
    event to its event log before it goes on, which takes long enough to matter). Log lines come
    back to the caller's thread. Closing the generator early stops what is still running, letting
    the calls in flight bring their answers in (``stop``).
    At most ``window`` documents are worked on at once (``ai_pipeline.window``; by default two
    per call the LLM client can have in flight).
    """
    out: queue.Queue[Any] = queue.Queue()
    caller_log = analyser.log_to(_ForwardedLog(out))
    loop = asyncio.new_event_loop()
    main: list[asyncio.Task[None]] = []
    children: list[tuple[str, asyncio.Future[None]]] = []

    async def one(document_id: str, places: DocumentWindow) -> None:
        try:
            events = await analyser.process(document_id, places)
        except RunStopped:
            return  # its paid answer checkpointed after the batch was closed: nobody listens
        except Exception as e:  # a bug must fail this document, not the batch
            message = redact(f"{type(e).__name__}: {e}")[:500]
            events = [
                StageFailed(document_id, Stage.DOCUMENT_TEXT, Category.INTERNAL_ERROR, message)
            ]
        out.put(("done", document_id, events))

    async def run_all() -> None:
        # The run's claims are renewed while its documents run, and given up if it is stopped.
        renewer = asyncio.ensure_future(analyser.keep_claims())
        places = analyser.window(window)
        children.extend((d, asyncio.ensure_future(one(d, places))) for d in document_ids)
        try:
            # Each document's end, whatever it was: a stop cancels some of them (``stop``).
            await asyncio.gather(*(child for _, child in children), return_exceptions=True)
        finally:
            renewer.cancel()
            await analyser.aclose()

    def stop() -> None:
        """Closed early: no new call goes out, and what waits or works is cancelled now — except
        the documents whose call is in flight. Their answers are paid for, so each comes in and is
        checkpointed before its document stops; a rerun never buys them again. Those calls end
        within the client's timeout; whatever still runs after that is cancelled too."""
        calling = analyser.stop()
        for document_id, child in children:
            if document_id not in calling:
                child.cancel()
        loop.call_later(analyser.call_timeout_seconds + STOP_GRACE_SECONDS, main[0].cancel)

    def work() -> None:
        try:
            main.append(loop.create_task(run_all()))
            loop.run_until_complete(main[0])
        except BaseException as e:  # handed to the caller, who raises it
            out.put(("error", e))
        finally:
            loop.close()
            out.put(("end",))

    worker = threading.Thread(target=work, name="ai-pipeline-batch", daemon=True)
    worker.start()
    try:
        ended = False
        while not ended:
            group: list[tuple[str, list[Event]]] = []
            error: BaseException | None = None
            item = out.get()  # waits for the next item, then takes what is there already
            while True:
                if item[0] == "log":
                    getattr(caller_log, item[1])(item[2])
                elif item[0] == "done":
                    group.append((item[1], item[2]))
                elif item[0] == "error":
                    if not isinstance(item[1], asyncio.CancelledError):
                        error = item[1]
                    ended = True
                    break
                else:
                    ended = True
                    break
                if len(group) >= most or out.empty():
                    break
                item = out.get_nowait()
            if group:
                yield group
            if error is not None:
                raise error
    finally:
        analyser.log_to(caller_log)
        if worker.is_alive():
            # Closed early: stop what still runs (unless the loop has just finished by itself).
            if main and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(stop)
            worker.join()
