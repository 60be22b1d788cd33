"""Connecting to NATS, and closing a connection without waiting on it.

Why a module: every process connects the same way. `connect()` takes the servers from `NATS_URL` (a
comma-separated list for a cluster) unless given, passes an async `error_cb` (nats-py's default prints a
traceback on every reconnect attempt) and reconnects forever with a short wait: a process of this runtime
has nothing useful to do without NATS, and a cluster leader election takes 4-6 s, so waiting beats exiting
and losing in-flight work. `close()` unsubscribes pull subscriptions before draining, because draining with
one still open waits the whole drain timeout (30 s by default).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

log = logging.getLogger("runtime.nats")


def servers_from_env(env: dict[str, str] | None = None) -> list[str] | None:
    """`NATS_URL` as a list of server URLs (comma-separated for a cluster), or None when unset."""
    raw = (env if env is not None else os.environ).get("NATS_URL", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or None


async def _quiet_error_cb(err: Exception) -> None:
    # nats-py's default error_cb prints a traceback on every reconnect attempt; one line is enough.
    log.warning("nats: %s: %s", type(err).__name__, err)


async def connect(servers: str | Sequence[str] | None = None, *, name: str | None = None,
                  **options: Any) -> NATS:
    """Connect to `servers` (default: `NATS_URL`), reconnecting forever with a short wait.

    `options` are nats-py's `connect` options and override the defaults here."""
    if servers is None:
        servers = servers_from_env()
        if servers is None:
            raise RuntimeError("no NATS server: set NATS_URL or start an EmbeddedNats")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    opts: dict[str, Any] = {
        "error_cb": _quiet_error_cb,
        "reconnect_time_wait": 0.25,
        "max_reconnect_attempts": -1,
        "connect_timeout": 5,
        "name": name,
    }
    opts.update(options)
    return await nats.connect(list(servers), **opts)


async def close(nc: NATS, *subs: Subscription | JetStreamContext.PullSubscription) -> None:
    """Unsubscribe `subs` (pull subscriptions above all), then drain the connection."""
    for sub in subs:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if not nc.is_closed:
        with contextlib.suppress(Exception):
            await nc.drain()


__all__ = ["close", "connect", "servers_from_env"]
