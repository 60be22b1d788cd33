"""One long-lived Monty sandbox pool per process (`AsyncMonty`), created on first use.

- Every checkout carries memory and duration limits (`Limits.to_monty()` fills them from the default
  preset): a worker busy in a loop outlives a dead host until its feed ends, so it must always end.
- A crashed worker (`MontyCrashedError`) is replaced by the pool; the run reports kind `crashed` and
  `SandboxPool.crashes` counts it. The host process is never at risk: workers are subprocesses.
- `AsyncMonty` can abort the host at interpreter exit (SIGABRT, rc 134) when its tokio thread wakes an
  asyncio loop during finalization (seen with pydantic-monty 1.4.0). `shutdown()` closes the pool and
  then sleeps briefly, which avoids it; an `atexit` hook does the same for processes (pytest, the CLI)
  that never call it.
- The pool is not tied to one event loop: a run may come from any loop (each `asyncio.run` of the CLI,
  each anyio test). After a fork the child starts its own pool.
- Inside `warm()` (a worker's job loop) an idle pool keeps the next session ready: when a run ends and no
  other runs or waits, its session is kept until the worker calls `settle()` (once the job's outcome is
  out: closing and checking out at once competed with that outcome for the worker's loop), then closed in
  the background and a fresh one checked out with the same script name and limits. So the next job of
  that tool finds its sandbox waiting instead of paying the checkout (a round trip to a Monty subprocess:
  ~0.15 ms alone, 0.4-0.7 ms on a busy 2-core box) on its critical path. Why only when idle: under load
  every process is busy anyway, a spare would hold one back from a queued run, and a finished run's
  process goes back at once. A run of another script (the name is the sandbox's `__file__`) or limits
  closes the spare, first if the pool has no other process for it; a run arriving while the spare is
  being checked out waits for that rather than queue behind it; a spare whose process died is not used.
  The spare is never fed before its run: every run still gets a session no script has touched.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from pydantic_monty import AsyncMonty, AsyncMontySession, ResourceLimits

from runtime.scripts.inline import INLINE_SLICE_S, Inline, alive

__all__ = ["SandboxPool", "configure_pool", "get_pool", "shutdown", "shutdown_sync"]

log = logging.getLogger(__name__)

_EXIT_GRACE = 0.05  # seconds to let Monty's runtime threads settle after closing (the SIGABRT workaround)


def _default_max_processes() -> int:
    env = os.environ.get("SA_SANDBOX_WORKERS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(2, os.cpu_count() or 2)


class SandboxPool:
    """A lazily started `AsyncMonty` pool with crash accounting and a safe shutdown."""

    def __init__(
        self,
        *,
        min_processes: int = 1,
        max_processes: int | None = None,
        max_checkouts_per_worker: int | None = 500,
        inline_slice: float = INLINE_SLICE_S,
    ) -> None:
        self.min_processes = min_processes
        self.max_processes = max_processes or _default_max_processes()
        self.max_checkouts_per_worker = max_checkouts_per_worker
        self.crashes = 0
        self.runs = 0
        self._monty: AsyncMonty | None = None
        self._pid: int | None = None
        self._starting: asyncio.Task[AsyncMonty] | None = None
        self._lock = threading.Lock()
        self._warm: _Warm | None = None  # set while a long-lived loop keeps a session ready (`warm`)
        self.ready_runs = 0  # runs that found their session checked out in advance
        # short runs of scripts without externals, fed from the caller's thread (`runtime.scripts.inline`)
        self.inline = Inline(slice_s=inline_slice, max_processes=self.max_processes,
                             max_checkouts_per_worker=max_checkouts_per_worker)

    @property
    def started(self) -> bool:
        return self._monty is not None and self._pid == os.getpid()

    async def _start(self) -> AsyncMonty:
        monty = AsyncMonty(
            min_processes=self.min_processes,
            max_processes=self.max_processes,
            max_checkouts_per_worker=self.max_checkouts_per_worker,
        )
        await monty.__aenter__()
        self._monty, self._pid = monty, os.getpid()
        _register_atexit()
        return monty

    async def monty(self) -> AsyncMonty:
        """The running `AsyncMonty`, started on first call."""
        if self._monty is not None and self._pid == os.getpid():
            return self._monty
        if self._pid is not None and self._pid != os.getpid():  # forked child: the parent's pool is not ours
            self._monty, self._pid, self._starting = None, None, None
        loop = asyncio.get_running_loop()
        with self._lock:
            task = self._starting
            if task is None or task.get_loop() is not loop or (task.done() and task.exception() is not None):
                task = self._starting = loop.create_task(self._start())
        return await asyncio.shield(task)

    @contextlib.asynccontextmanager
    async def session(
        self, *, script_name: str, limits: ResourceLimits, **checkout: Any
    ) -> AsyncIterator[AsyncMontySession]:
        """A fresh worker session (one per run) with `limits` (pydantic-monty `ResourceLimits`)."""
        if not limits.get("max_memory") or not limits.get("max_feed_duration_secs"):
            raise ValueError(
                "every checkout needs max_memory and max_feed_duration_secs (see Limits.to_monty)"
            )
        monty = await self.monty()
        self.runs += 1
        warm = self._warm
        if checkout or warm is None or warm.closed or warm.loop is not asyncio.get_running_loop():
            async with monty.checkout(script_name=script_name, limits=limits, **checkout) as s:
                yield s
            return
        key = (script_name, tuple(sorted(limits.items())))
        warm.wanting += 1
        try:
            taken = await warm.take(key)
            if taken is not None:
                self.ready_runs += 1
                opened, s = taken
            else:
                opened = monty.checkout(script_name=script_name, limits=limits)
                s = await opened.__aenter__()
        finally:
            warm.wanting -= 1
        warm.active += 1
        try:
            yield s
        except BaseException as exc:
            warm.active -= 1
            if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            warm.active -= 1
            if warm.closed:  # the worker stopped meanwhile: nobody will settle it
                await _finish(opened)
            elif warm.active or warm.wanting:  # busy: its process goes back now, another run may wait for it
                warm.spawn(warm.finish(opened))
            else:
                warm.used.append((monty, opened, key))  # recycled at the next `settle`

    def settle(self) -> None:
        """Close the sessions of the runs that ended and check out the next one, in the background. The
        worker calls it once a job's outcome is out: done at once, the checkout competed with that job's
        outcome for the worker's loop (measured: what the ready session saved, the outcome's publish lost).
        The inline pool's part blocks for its round trips, so it runs once the loop has done what is ready
        (the job's ack, queued just before, is written first)."""
        asyncio.get_running_loop().call_soon(self.inline.settle)
        warm = self._warm
        if warm is not None and warm.loop is asyncio.get_running_loop():
            warm.settle()

    async def settled(self) -> None:
        """`settle`, then wait until the background work is done (the next session is ready, if any)."""
        self.inline.settle()
        warm = self._warm
        if warm is not None and warm.loop is asyncio.get_running_loop():
            warm.settle()
            while warm.tasks:
                await asyncio.gather(*list(warm.tasks), return_exceptions=True)

    @contextlib.asynccontextmanager
    async def warm(self) -> AsyncIterator[None]:
        """Keep a session ready while inside, on this loop (see the module docstring). Re-entrant on one
        loop (several workers in one process share it); on another loop it does nothing."""
        loop = asyncio.get_running_loop()
        warm = self._warm
        if warm is not None and not warm.closed and warm.loop is not loop:
            yield
            return
        if warm is None or warm.closed:
            warm = self._warm = _Warm(loop, self.max_processes)
        warm.users += 1
        try:
            yield
        finally:
            warm.users -= 1
            if not warm.users:
                warm.closed = True
                if self._warm is warm:
                    self._warm = None
                await asyncio.shield(warm.close())

    def record_crash(self, detail: str) -> None:
        self.crashes += 1
        log.warning(
            "monty sandbox worker crashed and was replaced (%s); crashes so far: %d", detail, self.crashes
        )

    async def close(self) -> None:
        """Close the pool (workers exit) and let Monty's threads settle. Safe to call twice."""
        self.inline.close()
        monty, self._monty, self._starting = self._monty, None, None
        if monty is None or self._pid != os.getpid():
            return
        try:
            await monty.__aexit__(None, None, None)
        finally:
            await asyncio.sleep(_EXIT_GRACE)
            gc.collect()


Key = tuple[str, tuple[tuple[str, Any], ...]]  # a checkout's script name and limits


class _Warm:
    """The session kept ready on one loop: at most one, checked out for the tool that ran last."""

    def __init__(self, loop: asyncio.AbstractEventLoop, processes: int) -> None:
        self.loop = loop
        self.processes = processes  # the pool's most
        self.closing = 0  # sessions being closed in the background
        self.users = 0
        self.closed = False
        self.active = 0  # runs holding a session now
        self.wanting = 0  # runs waiting for one
        self.spare: tuple[Key, Any, AsyncMontySession] | None = None
        self.filling: asyncio.Future[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.used: list[tuple[AsyncMonty, Any, Key]] = []  # sessions of runs that ended, to recycle

    def settle(self) -> None:
        used, self.used = self.used, []
        for monty, opened, key in used:
            self.spawn(self.recycle(monty, opened, key))

    async def take(self, key: Key) -> tuple[Any, AsyncMontySession] | None:
        """The ready session if it was checked out for `key` and its process lives; else None, the spare
        closed: in the background if the pool has a process to spare meanwhile, else first (it may hold
        the pool's only free process)."""
        self.settle()  # sessions of runs that ended, not settled yet
        if self.filling is not None:  # being checked out: wait, rather than queue behind it
            await asyncio.shield(self.filling)
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if spare[0] == key and alive(spare[2].worker_pid):
            return spare[1], spare[2]
        if self.active + self.closing + 2 <= self.processes:  # the spare's process, and one for this run
            self.spawn(self.finish(spare[1]))
        else:
            await self.finish(spare[1])
        return None

    async def finish(self, opened: Any) -> None:
        self.closing += 1
        try:
            await _finish(opened)
        finally:
            self.closing -= 1

    async def recycle(self, monty: AsyncMonty, used: Any, key: Key) -> None:
        """Close a finished run's session; then, if nothing runs and nothing is ready, check out the next."""
        await self.finish(used)
        # a run waiting for a process (in a checkout of its own) must get it, not a spare nobody asked for
        if self.closed or self.active or self.wanting or self.spare is not None or self.filling is not None:
            return
        filling = self.filling = self.loop.create_future()
        try:
            opened = monty.checkout(script_name=key[0], limits=dict(key[1]))  # type: ignore[arg-type]
            session = await opened.__aenter__()
            if self.closed:
                await _finish(opened)
            else:
                self.spare = (key, opened, session)
        except Exception as e:  # the next run checks out for itself
            log.debug("could not check out a ready sandbox session: %s", e)
        finally:
            self.filling = None
            filling.set_result(None)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        self.settle()
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        spare, self.spare = self.spare, None
        if spare is not None:
            await _finish(spare[1])


async def _finish(opened: Any) -> None:
    """Leave a checkout (its process goes back to the pool); a dead one has nothing left to give back."""
    try:
        await opened.__aexit__(None, None, None)
    except Exception as e:
        log.debug("closing a sandbox session: %s", e)


_pool: SandboxPool | None = None
_pool_lock = threading.Lock()
_atexit_registered = False


def get_pool() -> SandboxPool:
    """The process-wide pool (not started until the first run)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool()
        return _pool


def configure_pool(
    *, min_processes: int = 1, max_processes: int | None = None, max_checkouts_per_worker: int | None = 500,
    inline_slice: float = INLINE_SLICE_S,
) -> SandboxPool:
    """Replace the process-wide pool's settings. Call before the first run (or after `shutdown()`).
    `inline_slice=0` feeds every run through the async pool (`runtime.scripts.inline`)."""
    global _pool
    with _pool_lock:
        if _pool is not None and _pool.started:
            raise RuntimeError("the sandbox pool is running; call `await shutdown()` before reconfiguring it")
        if _pool is not None:
            _pool.inline.close()
        _pool = SandboxPool(
            min_processes=min_processes,
            max_processes=max_processes,
            max_checkouts_per_worker=max_checkouts_per_worker,
            inline_slice=inline_slice,
        )
        return _pool


async def shutdown() -> None:
    """Close the process-wide pool with the exit-abort workaround. Call it before your event loop ends."""
    pool = _pool
    if pool is not None:
        await pool.close()


def shutdown_sync() -> None:
    """Close the pool from synchronous code (no running loop in this thread), then settle."""
    pool = _pool
    if pool is not None:
        pool.inline.close()
    if pool is not None and pool.started:
        try:
            asyncio.run(pool.close())
        except RuntimeError:  # a loop is running in this thread: the best we can do is drop it
            log.debug("shutdown_sync called with a running loop; pool left to the interpreter")
    time.sleep(_EXIT_GRACE)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    try:
        shutdown_sync()
    except Exception:  # pragma: no cover - never fail interpreter exit
        log.debug("sandbox pool shutdown at exit failed", exc_info=True)
    gc.collect()
    time.sleep(_EXIT_GRACE)
