"""Lease I/O off the host's event loop: a thread with its own event loop and NATS connection.

A host's event loop can be busy for a long stretch: thousands of ready drivers each take their turn before
a renewal task gets its own, and the host's connection may hold megabytes of outgoing appends ahead of a
renewal's publish. With a 2 s lease TTL, a renewal that waits behind that work would let a live host's
leases expire (a false takeover). So every lease read and write goes through a `LeaseRenewer`: a daemon
thread running its own asyncio loop and its own NATS connection (same servers and credentials as the
host's), which also renews the held leases and the host's heartbeat every renewal period by itself. The
GIL hands the thread the interpreter every few milliseconds whatever the host's loop is doing.

Two guards keep a renewer from holding leases for a host that cannot serve them: it renews only while the
host's own connection is connected (a host cut off from NATS must let its leases lapse), and only while
the host's loop has shown life within `WEDGED_S` (`Leases._fence_watch` ticks every 0.1 s): a loop stuck
longer than that is a dead host, whose partitions others must take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from runtime.nats.connection import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S

log = logging.getLogger("runtime.host")

WEDGED_S = 10.0  # a host loop silent this long is treated as dead: its leases are left to expire


def connect_options(nc: NATS) -> dict[str, Any]:
    """nats-py `connect` keyword arguments for a second connection like `nc` (servers, credentials, TLS)."""
    opts: dict[str, Any] = {"servers": [s.geturl() for s in nc.servers] or ["nats://127.0.0.1:4222"],
                            "reconnect_time_wait": 0.25, "max_reconnect_attempts": -1, "connect_timeout": 5,
                            "ping_interval": nc.options.get("ping_interval", PING_INTERVAL_S),
                            "max_outstanding_pings": nc.options.get("max_outstanding_pings",
                                                                    MAX_OUTSTANDING_PINGS),
                            "name": f"{nc.options.get('name') or 'sa'}-leases"}
    for key in ("user", "password", "token", "tls", "tls_hostname"):
        if nc.options.get(key) is not None:
            opts[key] = nc.options[key]
    for key, attr in (("user_credentials", "_user_credentials"), ("nkeys_seed", "_nkeys_seed")):
        if getattr(nc, attr, None):
            opts[key] = getattr(nc, attr)
    inbox = bytes(getattr(nc, "_inbox_prefix", b"")).decode()
    if inbox:  # a secured server lets each user subscribe only under its own inbox prefix
        opts["inbox_prefix"] = inbox
    return opts


async def _quiet(err: Exception) -> None:
    log.debug("lease connection: %s: %s", type(err).__name__, err)


class LeaseRenewer:
    """Runs coroutines on the lease thread (`call`) and a periodic `round` there (see the module doc)."""

    def __init__(self, options: dict[str, Any], round_: Callable[[JetStreamContext], Awaitable[None]],
                 every: float) -> None:
        self.options, self.round, self.every = options, round_, every
        self.js: JetStreamContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="sa-leases", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and connect (blocking: call it from a worker thread); raises if it cannot."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the lease connection did not come up")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by `start` if it happened while connecting
            self._error = self._error or e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            nc = await nats.connect(error_cb=_quiet, **self.options)
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self.js = nc.jetstream()
        self._ready.set()
        try:
            while not self._stopping.is_set():
                t0 = time.monotonic()
                try:
                    await self.round(self.js)
                except Exception as e:  # NATS trouble: the host's fence protects it; try again next round
                    log.debug("lease renewal round failed: %s: %s", type(e).__name__, e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(),
                                           max(0.0, self.every - (time.monotonic() - t0)))
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def call(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Await `fn(js, *args)` run on the lease thread, from the host's loop."""
        assert self._loop is not None and self.js is not None
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(fn(self.js, *args), self._loop)
        return await asyncio.wrap_future(fut)

    def stop(self) -> None:
        """Stop renewing and close the lease connection (blocking until the thread ends, at most 5 s)."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.is_alive():
            self._thread.join(5.0)


__all__ = ["WEDGED_S", "LeaseRenewer", "connect_options"]
