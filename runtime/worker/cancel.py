"""Cancel reaches the sandbox: a worker stops the jobs of a run as soon as the run is cancelled.

A worker follows every `run.cancelled` appended, of any run (`RunLog.watch_cancels`, a plain subscription:
it costs the log nothing), and hands each to `Cancels.on_cancelled`. A job of that run it is running is
stopped at once: the sandbox run happens inside a `Cancels.stoppable` scope, and cancelling the scope
cancels the run, which kills its Monty process (the pool starts a fresh one). A job of that run that arrives
later is not run: the run stays in a bounded memory of recent cancels (`CANCELLED_KEPT`). Either way the
outcome is a `cancelled` failure (`Cancels.outcome`), published and acked as usual, and the worker takes its
next job. The host records that outcome after `run.cancelled` (it waits briefly for it), so the log shows
the tool really stopped.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from runtime import events as ev
from runtime.jobs import ToolJob, ToolOutcome
from runtime.types import ScriptNote, ToolResult

log = logging.getLogger("runtime.worker")

CANCELLED_KEPT = 4096  # recently cancelled runs remembered, so their queued jobs are not run


class Cancels:
    """One worker's view of cancelled runs: which were cancelled lately (and why), and the scopes of the
    jobs of each run running here now. `run_id in cancels` says a job of that run must not start."""

    def __init__(self, worker: str) -> None:
        self.worker = worker  # the worker's name, for the log
        self._running: dict[str, set[anyio.CancelScope]] = {}  # run id -> the scopes of its jobs here
        self._cancelled: OrderedDict[str, str] = OrderedDict()  # run id -> why, the most recent ones

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._cancelled

    @property
    def running_runs(self) -> frozenset[str]:
        """The runs whose jobs this worker is running in the sandbox now."""
        return frozenset(self._running)

    def on_cancelled(self, event: ev.RunCancelled) -> None:
        """A run was cancelled: stop its jobs running here, and do not start the ones still to come."""
        why = f"the run was cancelled{' by ' + event.by if event.by else ''}"
        why += f": {event.reason}" if event.reason else ""
        self._cancelled[event.run_id] = why
        self._cancelled.move_to_end(event.run_id)
        while len(self._cancelled) > CANCELLED_KEPT:
            self._cancelled.popitem(last=False)
        for scope in self._running.get(event.run_id, ()):
            log.info("worker %s: stopping a job of run %s (%s)", self.worker, event.run_id, why)
            scope.cancel()

    @contextmanager
    def stoppable(self, run_id: str) -> Iterator[anyio.CancelScope]:
        """A scope a cancel of `run_id` cancels (which stops the sandbox run inside it)."""
        with anyio.CancelScope() as scope:
            self._running.setdefault(run_id, set()).add(scope)
            try:
                yield scope
            finally:
                scopes = self._running.get(run_id)
                if scopes is not None:
                    scopes.discard(scope)
                    if not scopes:
                        del self._running[run_id]

    def outcome(self, job: ToolJob, notes: list[ScriptNote], fields: dict[str, Any]) -> ToolOutcome:
        """A job of a cancelled run: `cancelled`, and a `failed` note closing the sandbox run it stopped."""
        why = self._cancelled.get(job.run_id, "the run was cancelled")
        stopped = "stopped while it ran" if notes else "not started"
        failure = ToolResult.failure("cancelled", f"{job.tool} {stopped}: {why}")
        if notes:
            ran = round((time.time() - notes[0].ts) * 1000, 3)
            notes.append(ScriptNote(kind="failed", ts=time.time(), error=failure.error, duration_ms=ran,
                                    script=notes[0].script, call_id=notes[0].call_id))
        return ToolOutcome.for_job(job, failure, notes=tuple(notes), **fields)
