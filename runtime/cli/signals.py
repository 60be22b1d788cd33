"""Stopping a long-running command (`sa up`, `sa host`, `sa worker`, `sa otel`) on SIGINT or SIGTERM.

One place for it, so every such command stops the same way: the first signal sets the command's `stop`
event (each then winds down in its own order) and, before that, runs what the command wants said.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any


async def until_signal(stop: Any, on_signal: Callable[[], None] | None = None) -> None:
    """Wait for SIGINT / SIGTERM, then call `on_signal` (if any) and set `stop`."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if on_signal is not None:
                on_signal()
            stop.set()
            return


__all__ = ["until_signal"]
