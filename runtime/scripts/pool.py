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
from collections.abc import AsyncIterator
from typing import Any

from pydantic_monty import AsyncMonty, AsyncMontySession, ResourceLimits

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
        async with monty.checkout(script_name=script_name, limits=limits, **checkout) as s:
            yield s

    def record_crash(self, detail: str) -> None:
        self.crashes += 1
        log.warning(
            "monty sandbox worker crashed and was replaced (%s); crashes so far: %d", detail, self.crashes
        )

    async def close(self) -> None:
        """Close the pool (workers exit) and let Monty's threads settle. Safe to call twice."""
        monty, self._monty, self._starting = self._monty, None, None
        if monty is None or self._pid != os.getpid():
            return
        try:
            await monty.__aexit__(None, None, None)
        finally:
            await asyncio.sleep(_EXIT_GRACE)
            gc.collect()


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
    *, min_processes: int = 1, max_processes: int | None = None, max_checkouts_per_worker: int | None = 500
) -> SandboxPool:
    """Replace the process-wide pool's settings. Call before the first run (or after `shutdown()`)."""
    global _pool
    with _pool_lock:
        if _pool is not None and _pool.started:
            raise RuntimeError("the sandbox pool is running; call `await shutdown()` before reconfiguring it")
        _pool = SandboxPool(
            min_processes=min_processes,
            max_processes=max_processes,
            max_checkouts_per_worker=max_checkouts_per_worker,
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
