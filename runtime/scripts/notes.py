"""How a run tells observers what happens inside it: `ScriptNote`s delivered on the event loop, in order.

A run reports `started` (once, with the sandbox worker's pid), every `printed` chunk, then `completed` or
`failed`. Monty calls print callbacks from its own thread, so notes made there are handed to the event loop
with `call_soon_threadsafe`: the observer always runs on the loop, and sees the notes in the order they
happened. An observer may be sync or a coroutine function; one that raises is logged and the run goes on,
because watching a run must never change its result. Print output beyond 1 MB per run is dropped (one
note says so) so that a script printing in a loop cannot flood its observers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from runtime.types import NoteKind, ScriptNote

__all__ = ["NoteCallback", "NoteEmitter"]

log = logging.getLogger(__name__)

MAX_PRINT_BYTES = 1 << 20  # print output forwarded as notes per run; the rest is counted, not sent

NoteCallback = Callable[[ScriptNote], Any]
"""An observer of a run: called with each `ScriptNote` (its return value is awaited if awaitable)."""


class NoteEmitter:
    """Delivers one run's notes on the event loop, in order; tolerates observers that fail or are async."""

    def __init__(self, on_note: NoteCallback | None, script: str, t0: float, **start: Any) -> None:
        self.on_note = on_note
        self.start_fields = start
        self.started = False
        self.script = script
        self.t0 = t0
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.pending: set[asyncio.Future[Any]] = set()
        self.printed = 0
        # notes handed to the loop from Monty's thread, and those of them delivered: one writer each (that
        # thread, the loop), so neither count can lose an update
        self.sent = 0
        self.arrived = 0

    def ms(self) -> float:
        """Milliseconds since the run began."""
        return round((time.perf_counter() - self.t0) * 1000, 3)

    def emit(self, kind: NoteKind, at: tuple[float, float] | None = None, **fields: Any) -> None:
        """`at`: when it happened, if not now (wall clock, `perf_counter`)."""
        if self.on_note is None:
            return
        ts, ms = (time.time(), self.ms()) if at is None else (at[0], round((at[1] - self.t0) * 1000, 3))
        note = ScriptNote(kind=kind, ts=ts, script=self.script, duration_ms=ms, **fields)
        if threading.get_ident() == self.loop_thread:
            self._deliver(note)
        else:  # Monty calls print callbacks from its own thread: marshal to the loop
            self.sent += 1
            self.loop.call_soon_threadsafe(self._marshalled, note)

    def start(self, at: tuple[float, float] | None = None, **fields: Any) -> None:
        """The `started` note, once (a run that fails before reaching the sandbox still reports it); `at`
        as in `emit` (a run fed from the loop's thread reports its start once it is over)."""
        if not self.started:
            self.started = True
            self.emit("started", at, **self.start_fields, **fields)

    def _marshalled(self, note: ScriptNote) -> None:
        self.arrived += 1
        self._deliver(note)

    def _deliver(self, note: ScriptNote) -> None:
        if self.on_note is None:
            return
        try:
            result = self.on_note(note)
            if result is not None and inspect.isawaitable(result):  # most observers append and return None
                task = asyncio.ensure_future(result)
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
        except Exception:
            log.exception("on_event callback failed for the %s note of %s", note.kind, self.script)

    def print_callback(self, stream: str, text: str) -> None:
        """Monty's `print_callback`: each chunk becomes a `printed` note, up to `MAX_PRINT_BYTES`."""
        if self.on_note is None:
            return
        self.printed += len(text)
        if self.printed <= MAX_PRINT_BYTES:
            self.emit("printed", stream=stream, text=text)
        elif self.printed - len(text) <= MAX_PRINT_BYTES:
            self.emit("printed", stream="stderr", text="\n[further print output dropped: over 1 MB]\n")

    async def flush(self) -> None:
        """Wait until every note emitted so far has been delivered (and async observers have finished).

        A run that printed nothing from Monty's thread has nothing marshalled to wait for: it does not yield
        to the loop here (two loop cycles per run were a visible share of a trivial job's CPU)."""
        while self.arrived < self.sent:
            await asyncio.sleep(0)  # let call_soon_threadsafe'd prints run before completed/failed
        if self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)
