"""Short runs fed from the caller's own thread: the sandbox without the cross-thread hops.

Every run still happens in a Monty subprocess under its limits; what changes is who waits for it. The async
pool (`AsyncMonty`, `runtime.scripts.pool`) waits on its own runtime thread and wakes the event loop when the
run ends: measured here, a trivial feed in an open async session takes 175-235 µs and checking a session out
and back ~400 µs of CPU, while the same feed through the synchronous pool (`Monty`) from the calling thread
takes ~45 µs, checkout and return included ~70 µs. The difference is thread wake-ups, not sandbox work, and
on a busy two-core machine each wake-up costs more.

A synchronous feed blocks the event loop while the script runs, so it is only tried where that is bounded:

- the script declares no externals (an external may be a coroutine the loop must run; those runs keep the
  async pool);
- the attempt runs under the script's own limits with its time (running and sleeping) cut to a *slice*
  (`INLINE_SLICE_S`, 10 ms): the sandbox stops it there, and the pool kills a worker that overruns the
  slice by more than `GRACE_S`;
- an attempt that the slice cut short is discarded unseen (its printed text included) and the run goes to
  the async pool under its full limits; the script is then *slow* for this process and never tried inline
  again. A script is a pure function of its inputs and files (it has no externals and cannot write), so
  running it again is safe. A limit's `TimeoutError` cannot be caught inside the sandbox (not by `except`,
  not even by `finally`: measured on pydantic-monty 1.4), so an attempt that was not cut short ran to its
  end within its limits, however long the wall clock says it took, and it stands;
- a script whose own time limit is within the slice is run inline with that limit, and its result stands.

So the loop is held at most one slice per slow script per process, and ~50 µs per fast run (less than the
async pool's own wake-ups cost the loop). `configure_pool(inline_slice=0)` turns it off.

A checkout from the synchronous pool blocks its thread until a sandbox process is free, and this thread is
the event loop's: it waits at most `CHECKOUT_WAIT_S`. A run that finds no process free in time goes to the
async pool (which waits without holding the loop); a spare that cannot be checked out is not, and none is
tried for `STARVED_S` after (each try would hold the loop again). The pool has room for every thread's
spare and run, so this is for what should not happen: processes held elsewhere in the process.

Checking a session out and giving it back are round trips to the sandbox process too, and an idle process
answers slowly (measured: a feed after 10 ms of idleness takes ~0.35 ms, back to back ~0.1 ms; checkout and
return as much again). So a run's session is given back, and the next one checked out for the same script and
limits, by `settle()`: the worker calls it once the job's outcome is out (`SandboxPool.settle`), off the job's
path. The next run of that script finds its session waiting. A spare is never fed before its run (every run
gets a session no script has touched), one whose process died is not used, and a run of another script checks
out its own and leaves the spare to be given back with it. Only the thread that settles keeps a spare; a
thread that never settles gives each run's session back at its next run.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic_monty import Monty, MontyCrashedError, MontyError, MontySession, ResourceLimits

from runtime.scripts.notes import MAX_PRINT_BYTES

__all__ = ["CHECKOUT_WAIT_S", "GRACE_S", "INLINE_SLICE_S", "Attempt", "Inline", "alive"]

log = logging.getLogger(__name__)

INLINE_SLICE_S = 0.010  # the most an inline attempt may run (or sleep) before it is handed to the async pool
GRACE_S = 0.05  # past its limit, how long the pool waits for the sandbox to stop itself before killing it
CHECKOUT_WAIT_S = 0.25  # the most a checkout holds the loop waiting for a free process (a spawn takes ~2 ms)
STARVED_S = 5.0  # after a spare's checkout found no process free, how long no spare is tried


@dataclass
class Attempt:
    """What an inline run gave that stands: its value or the error Monty raised, and what it printed."""

    pid: int | None
    began: tuple[float, float]  # when the feed began: wall clock, `perf_counter`
    output: Any = None
    error: MontyError | None = None
    printed: list[tuple[str, str]] = field(default_factory=list)


class Inline:
    """The synchronous pool for inline runs (started on first use, per process) and the slow scripts."""

    def __init__(self, *, slice_s: float, max_processes: int, max_checkouts_per_worker: int | None) -> None:
        self.slice_s = slice_s
        self.max_processes = max_processes
        self.max_checkouts_per_worker = max_checkouts_per_worker
        self.slow: set[str] = set()  # scripts (name and content hash) an attempt found too slow for a slice
        self.runs = 0
        self.discarded = 0
        self._monty: Monty | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._exit_hooked = False
        self._mine = threading.local()  # per thread: `used` sessions, the `spare`, the `last` checkout
        self.ready_runs = 0  # runs that found their session checked out by `settle`
        self.starved = 0  # checkouts that found no process free within `CHECKOUT_WAIT_S`
        self._no_spare_until = 0.0  # `time.monotonic()` before which `settle` checks out no spare

    def eligible(self, key: str, has_externals: bool) -> bool:
        return self.slice_s > 0 and not has_externals and key not in self.slow

    def _pool(self) -> Monty:
        with self._lock:
            if self._monty is None or self._pid != os.getpid():  # a forked child starts its own
                monty = Monty(min_processes=1, max_processes=self.max_processes + 1,  # room for a spare
                              max_checkouts_per_worker=self.max_checkouts_per_worker,
                              checkout_timeout=CHECKOUT_WAIT_S,
                              feed_duration_limit_grace=GRACE_S, turn_duration_limit_grace=GRACE_S)
                monty.__enter__()
                self._monty, self._pid = monty, os.getpid()
                if not self._exit_hooked:
                    self._exit_hooked = True
                    atexit.register(self.close)
            return self._monty

    def attempt(self, key: str, *, script_name: str, limits: ResourceLimits, code: str,
                inputs: dict[str, Any], os_handler: Any) -> Attempt | None:
        """Run once from this thread; None when the attempt does not stand (the run goes to the async
        pool, and `key` is slow from now on; or no process was free within `CHECKOUT_WAIT_S`). What Monty
        raises is in the attempt (a crashed sandbox process included); a checkout that fails otherwise
        raises, as in the async pool."""
        full = limits.get("max_feed_duration_secs") or 0.0
        binding = full <= self.slice_s  # the script's own limit fits the slice: whatever happens stands
        cut: ResourceLimits = limits if binding else {
            **limits, "max_feed_duration_secs": self.slice_s,
            "max_total_sleep_secs": min(limits.get("max_total_sleep_secs") or self.slice_s, self.slice_s)}
        printed: list[tuple[str, str]] = []

        kept = 0

        def keep(stream: str, text: str) -> None:  # shown only if the attempt stands
            nonlocal kept
            if kept <= MAX_PRINT_BYTES:  # past it the notes say "dropped"; the chunk crossing it suffices
                kept += len(text)
                printed.append((stream, text))

        try:
            session, ready = self._session(script_name, cut)
        except TimeoutError:
            self.starved += 1
            log.warning("no inline sandbox process free within %.2f s; this run goes to the async pool",
                        CHECKOUT_WAIT_S)
            return None
        ran = Attempt(session.worker_pid, (time.time(), time.perf_counter()), printed=printed)
        try:
            ran.output = session.feed_run(code, inputs=inputs, os=os_handler, print_callback=keep)
        except MontyError as e:
            ran.error = e
        finally:
            self._state().used.append(session)  # given back by `settle`, or before this thread's next run
        self.ready_runs += ready
        self.runs += 1
        if not binding and _cut_short(ran.error):
            self.slow.add(key)
            self.discarded += 1
            return None
        return ran

    def settle(self) -> None:
        """Give back the sessions of this thread's finished runs, then check out the next one for the
        script and limits that ran last (see the module docstring). Blocks for those round trips."""
        mine = self._state()
        _give_back(mine.used)
        if (mine.last is None or mine.spare is not None or self._monty is None or self._pid != os.getpid()
                or time.monotonic() < self._no_spare_until):
            return
        try:
            session = self._monty.checkout(script_name=mine.last[0], limits=mine.last[1])
            session.__enter__()
        except TimeoutError:  # the pool's processes are held elsewhere: the next run checks out for itself
            self.starved += 1
            self._no_spare_until = time.monotonic() + STARVED_S
            log.warning("no inline sandbox process free within %.2f s for a spare; none tried for %.0f s",
                        CHECKOUT_WAIT_S, STARVED_S)
            return
        except Exception as e:  # the next run checks out for itself
            log.debug("could not check out a ready inline session: %s", e)
            return
        mine.spare = (mine.last, session)

    def _session(self, script_name: str, limits: ResourceLimits) -> tuple[MontySession, bool]:
        """The spare if it was checked out for this script and limits and its process lives, else a fresh
        checkout; a spare of another script is given back with this run's session (the pool has room for
        both and this one: it never waits for a process a spare holds)."""
        mine = self._state()
        _give_back(mine.used)
        wanted = (script_name, limits)
        mine.last = wanted
        spare, mine.spare = mine.spare, None
        if spare is not None:
            if spare[0] == wanted and alive(spare[1].worker_pid):
                return spare[1], True
            mine.used.append(spare[1])
        session = self._pool().checkout(script_name=script_name, limits=limits)
        session.__enter__()
        return session, False

    def _state(self) -> Any:
        mine = self._mine
        if not hasattr(mine, "used"):
            mine.used, mine.spare, mine.last = [], None, None
        return mine

    def close_spare(self) -> None:
        """Give back what this thread holds: its finished runs' sessions and its spare."""
        mine = self._state()
        _give_back(mine.used)
        if mine.spare is not None:
            _give_back([mine.spare[1]])
            mine.spare = None

    def close(self) -> None:
        self.close_spare()
        with self._lock:
            monty, self._monty = self._monty, None
            if monty is not None and self._pid == os.getpid():
                monty.__exit__(None, None, None)


def _give_back(sessions: list[MontySession]) -> None:
    """Leave each session (its process goes back to the pool); a dead one has nothing to give back."""
    while sessions:
        session = sessions.pop()
        try:
            session.__exit__(None, None, None)
        except Exception as e:
            log.debug("giving back an inline session: %s", e)


def alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (a spare's sandbox process may be killed while it waits)."""
    if not pid:
        return False
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # raw: this is on the critical path of a job
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: existence is all we can check
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        stat = os.read(fd, 512)
    finally:
        os.close(fd)
    return stat.rpartition(b")")[2][1:2] not in (b"Z", b"X", b"")


def _cut_short(error: MontyError | None) -> bool:
    """The attempt was stopped at its time (or sleep) limit, the slice: by the sandbox, or by the pool
    killing a worker that overran it."""
    if isinstance(error, MontyCrashedError):
        return bool(error.timed_out)
    text = str(error) if error is not None else ""
    return text.startswith(("TimeoutError: feed time limit exceeded", "TimeoutError: sleep limit exceeded"))
