"""One generation thread fed by a queue, bridged to asyncio.

Why a single worker: the model, its KV cache and torch's thread pool are one shared resource on a 2-core box;
two interleaved generations would each run at half speed and could corrupt each other's state. Requests wait
in FIFO order instead. Each job has a `cancelled` event that the decode loop checks between tokens, so a
client that disconnects (or a job still waiting in the queue) stops costing CPU at the next token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.modelserver.engine import Delta

log = logging.getLogger("runtime.modelserver")

_SHUTDOWN = object()


class QueueFull(Exception):
    """More jobs are waiting than the server accepts; the HTTP layer answers 503."""


@dataclass
class Job:
    """A generation to run: `run` produces deltas; results travel back on the caller's event loop."""

    run: Callable[[threading.Event], Iterator[Delta]]
    loop: asyncio.AbstractEventLoop
    results: asyncio.Queue[Delta | BaseException | None] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()

    async def deltas(self) -> AsyncIterator[Delta]:
        """The job's output in order. Leaving the iteration early (or being cancelled) cancels the job."""
        try:
            while True:
                item = await self.results.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancelled.set()

    def _send(self, item: Delta | BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.results.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self.cancelled.set()


class GenerationWorker:
    """Runs jobs one at a time on a daemon thread."""

    def __init__(self, max_waiting: int = 64) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_waiting)
        self._thread = threading.Thread(target=self._loop, name="sa-model-generation", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is _SHUTDOWN:
                return
            if job.cancelled.is_set():
                job._send(None)
                continue
            deltas = None
            try:
                deltas = job.run(job.cancelled)
                for delta in deltas:
                    if job.cancelled.is_set():
                        break
                    job._send(delta)
            except BaseException as e:  # surfaced to the request; the worker keeps serving
                log.exception("generation failed")
                job._send(e)
            finally:
                if deltas is not None and hasattr(deltas, "close"):
                    deltas.close()  # release the KV cache now, not whenever the generator is collected
            job._send(None)

    def start(self, run: Callable[[threading.Event], Iterator[Delta]]) -> Job:
        """Queue `run` (called on the worker thread with the job's cancel event); raises QueueFull."""
        job = Job(run=run, loop=asyncio.get_running_loop())
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull("too many requests are waiting for the model; retry later") from None
        return job

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the current job (which should already have been cancelled by its caller)."""
        self._queue.put(_SHUTDOWN)
        self._thread.join(timeout)
