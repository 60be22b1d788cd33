"""Retrying until NATS answers: one helper, so the pause between attempts and its log line live in one place.

Why: a process of this runtime has nothing useful to do without NATS, and NATS is briefly unavailable in
normal operation: a cluster electing a stream or consumer leader answers nothing (timeouts, 503 "no
responders") for 4-6 s, and a client reconnecting holds its requests. So most calls that must not be lost
(creating the topology, publishing an outcome, writing an index entry) are retried rather than failed.

    topology = await retrying(lambda: read_topology(js), what="reading the topology",
                              fatal=BadRequestError)          # a rejected request is not an outage
    await retrying(publish, what=f"publishing {msg_id}", give_up=30.0)   # then the last error propagates

`retrying` calls `op()` until it returns; each failure that is a `retry_on` and not a `fatal` is logged as
"<what> failed (<error>); retrying" and retried after `delay` seconds (`backoff`). A loop whose retry is its
own next iteration (a pull loop that must also watch a stop event) calls `backoff` itself. `wait_until` is
the blocking counterpart for start-up code that polls a server until it is healthy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
ErrorTypes = type[BaseException] | tuple[type[BaseException], ...]

RETRY_S = 0.5  # a tenth of a leader election: the new leader is noticed within half a second
_log = logging.getLogger("runtime.nats")


async def retrying(op: Callable[[], Awaitable[T]], *, what: str, retry_on: ErrorTypes = Exception,
                   fatal: ErrorTypes = (), retry_if: Callable[[BaseException], bool] | None = None,
                   delay: float = RETRY_S, give_up: float | None = None,
                   level: int = logging.WARNING, logger: logging.Logger | None = None) -> T:
    """`await op()` until it returns, pausing `delay` s after each failure of a `retry_on` type.

    A `fatal` error (checked first), any error not in `retry_on`, and one `retry_if` says no to (a refusal
    told apart by its code, not its type) propagate at once. With `give_up`, a failure more than `give_up`
    seconds after the first attempt propagates instead of being retried. Failures are logged at `level` on
    `logger` (default: ``runtime.nats``)."""
    started = time.monotonic()
    while True:
        try:
            return await op()
        except fatal:
            raise
        except retry_on as e:
            if retry_if is not None and not retry_if(e):
                raise
            if give_up is not None and time.monotonic() - started >= give_up:
                raise
            await backoff(what, e, delay=delay, level=level, logger=logger)


async def backoff(what: str, error: BaseException, *, delay: float = RETRY_S, level: int = logging.WARNING,
                  logger: logging.Logger | None = None) -> None:
    """Say that `what` failed with `error` and will be retried, then pause `delay` seconds."""
    (logger or _log).log(level, "%s failed (%s: %s); retrying", what, type(error).__name__, error)
    await anyio.sleep(delay)


ERR_NO_PLACEMENT = 10005  # "no suitable peers for placement"
PLACEMENT_PATIENCE_S = 15.0
PLACEMENT_RETRY_S = 0.25


async def placing(op: Callable[[], Awaitable[T]], *, what: str, patience: float = PLACEMENT_PATIENCE_S) -> T:
    """`await op()` (creating a replicated stream), again while the cluster answers "no suitable peers for
    placement" (JetStream err_code 10005) for at most `patience` seconds, then that error. Why: a cluster that
    has just formed can count a healthy node offline for a moment (it has not had its stats yet), so an R3
    stream created then is refused although it fits (seen on CI right after a 3-node cluster was ready); a
    host attaching to a fresh cluster would stop on it, a refusal being fatal there. Any other refusal
    propagates at once."""
    from nats.js.errors import BadRequestError  # here, so this module needs no nats import to load

    return await retrying(op, what=what, retry_on=BadRequestError,
                          retry_if=lambda e: getattr(e, "err_code", None) == ERR_NO_PLACEMENT,
                          delay=PLACEMENT_RETRY_S, give_up=patience, level=logging.INFO)


def wait_until(check: Callable[[], T | None], *, timeout: float, every: float, what: str) -> T:
    """Call `check()` every `every` seconds until it returns something other than None, and return that;
    raise TimeoutError naming `what` after `timeout` seconds. Blocking: from async code run it in a thread
    (a blocked event loop stalls every NATS connection of the process). `check` may raise to stop early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result is not None:
            return result
        time.sleep(every)
    raise TimeoutError(f"waited {timeout} s for {what}")


__all__ = ["ERR_NO_PLACEMENT", "RETRY_S", "backoff", "placing", "retrying", "wait_until"]
