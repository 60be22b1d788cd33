"""Pulling from durable consumers: a continuous pull for hosts, and a fetch that survives NATS trouble.

`consume` is a continuous pull: each message is handed over the moment it arrives.

Why not `psub.fetch(batch=N)`: nats-py's lingering fetch returns only when the batch is full or the
timeout expires (its "wait for the rest" phase), so one task arriving on an idle host would wait the whole
fetch timeout — hundreds of milliseconds of pure latency per step. `fetch(batch=1)` is prompt but costs a
request round trip per message. This loop does what nats.go's `Consume` does: keep one pull request for
`batch` messages outstanding (with `expires`), deliver every message to the handler as it lands on the
inbox, and issue the next request when the current one is used up or ends (408 expired / 409 / timeout).

Handlers must be quick (decode, route to an in-memory queue): they run in the subscription's callback, one
at a time, in arrival order, which is what keeps a partition's tasks in order.

A consumer deleted behind the loop's back (a late delete of a previous owner of the slot, carried out
after this owner made it again: seen on a cluster during a leader election) makes `consume` raise
`ConsumerGone` instead of pulling from nothing for ever: the server says so (409 "Consumer Deleted"), or no
server answers its pull requests (503) for a second. The caller makes the consumer again.

Back-pressure: with a `Budget`, each pull request asks for no more messages than the budget has room for
(`reserve`), and waits while it has none; each delivered message carries one unit of the budget to its
handler, which releases it when the message's work is over. So the messages a host holds in memory stay
within the budget however many wait in the stream, and whatever the number of consumers sharing it.

Fairness: a request also asks for no more than the budget's fair share: `limit // sharers`, where
sharers is the most consumers that may share it (a host sets it to the stream's partition count, since
its leases may hand it any of them) or those that joined, if more. A pull request is open for up to
`expires` seconds; without the cap, the first consumer to ask reserved the whole budget, and if its
partition was idle it held every unit for the whole request and re-reserved them first when it ended,
so the tasks of the other partitions waited for whole request periods, or forever (a host with a budget
of 256 and 16 partitions stalled with tasks in the stream). A cap from the consumers that joined so far
is not enough: they join one at a time, and the first one alone would have taken everything.

`fetch_batch` is `psub.fetch` for loops that pull a batch at a time (reads of a whole backlog): nats-py's
`fetch` signals "nothing" three ways (its TimeoutError, ``[]``, a bare asyncio.TimeoutError) and raises 503
while a cluster elects a consumer leader; `fetch_batch` folds all of them into ``[]``. It also never returns
more than `batch` messages, which nats-py's `fetch` does: it first drains every message already on the
subscription's inbox, however many, and a fetch that timed out leaves its late deliveries there. A caller
sizing a local buffer by the batch it asked for would overflow it (a worker did, and died: seen on a loaded
box); the surplus is kept and handed out first by the next call, without a round trip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime.nats.retry import backoff

log = logging.getLogger("runtime.nats")

Handler = Callable[[Msg], Awaitable[None]]


class Budget:
    """Units of work a host may hold in memory (`limit`), shared by every consumer that pulls with it.

    `reserve(n)` waits until there is room and takes up to `n` units (a pull request's size), at most the
    fair share of one of the `sharers` that `join`ed; units not turned into messages go back with
    `release`; `take` adds units without waiting (work that must not be refused, e.g. runs recovered at a
    takeover: the next pulls wait instead)."""

    def __init__(self, limit: int, *, expected_sharers: int = 1) -> None:
        if limit < 1:
            raise ValueError("a budget needs room for at least one unit")
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.sharers = 0
        self.expected_sharers = expected_sharers  # the most consumers that may come to share it
        self._room = anyio.Event()

    @property
    def share(self) -> int:
        """The most one request may reserve: an equal part of the budget for each consumer that shares
        it or may come to."""
        return max(1, self.limit // max(1, self.sharers, self.expected_sharers))

    def join(self) -> None:
        self.sharers += 1

    def leave(self) -> None:
        self.sharers -= 1

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    async def reserve(self, n: int) -> int:
        while self.used >= self.limit:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        granted = min(n, self.share, self.limit - self.used)
        self.take(granted)
        return granted

    def take(self, n: int = 1) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int = 1) -> None:
        self.used -= n
        if self.used < self.limit:
            self._room.set()


async def consume(nc: NATS, stream: str, consumer: str, handler: Handler, *, stop: anyio.Event,
                  batch: int = 256, expires: float = 5.0, budget: Budget | None = None,
                  finish: bool = False) -> None:
    """Pull from `stream`/`consumer` until `stop` is set, calling `handler(msg)` for each message.

    With a `budget`, every message handed over carries one unit the handler must `release` (see the
    module docstring). With `finish`, a stop issues no new request but takes what the open one still
    delivers until it ends or expires (at most `expires` later): the server counts a message delivered
    once it sent it, so one dropped here waits for its AckWait before anyone gets it again (a worker
    stopping must not strand the jobs already on their way to it).

    The handler runs in the subscription's own callback, in arrival order, the moment a message is read:
    handing each message to this loop first cost every message a task switch and two timers (~0.1 ms on
    a busy 2-core box, on the path of every job and every outcome). This loop only keeps a pull request
    open: it learns from the callback when a request is used up, and from the server's status messages
    when one ended otherwise."""
    pulls = _Pulls(handler, budget, None if finish else stop)
    sub = await nc.subscribe(nc.new_inbox(), cb=pulls.on_msg)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    if budget is not None:
        budget.join()
    unanswered = 0  # pull requests in a row nobody answered (503): the consumer may be gone
    cancelled = False
    try:
        while not stop.is_set():
            size = batch if budget is None else await budget.reserve(batch)
            pulls.open(size)
            try:
                request = json.dumps({"batch": size, "expires": int(expires * 1e9)}).encode()
                try:
                    await nc.publish(subject, request, reply=sub.subject)
                except Exception as e:  # reconnecting: try again shortly
                    await backoff(f"pull request on {stream}/{consumer}", e, delay=0.2, level=logging.DEBUG,
                                  logger=log)
                    continue
                ended = await pulls.ended(expires + 1.0, None if finish else stop)
                if ended is not None:  # used up; or 408: expired, 409: consumer changed, 503: no responders
                    status, description = ended
                    if status != "used":
                        unanswered = _unanswered(status, description, unanswered, f"{stream}/{consumer}")
                        await anyio.sleep({"409": 0.1, "503": UNANSWERED_WAIT_S}.get(status, 0.0))
                    else:
                        unanswered = 0
            finally:
                left = pulls.close()
                if budget is not None and left:
                    budget.release(left)
    except anyio.get_cancelled_exc_class():
        cancelled = True
        raise
    finally:
        if budget is not None:
            budget.leave()
        pulls.closed = True  # what still arrives is not taken: the server delivers it again after AckWait
        # a handler under way finishes when the loop stops, as if it ran inline; a cancel (a slot lost) cuts
        # it off with the subscription, as it did inline
        with anyio.CancelScope(shield=True):  # a cancelled owner must not leak the subscription
            if not cancelled:
                with anyio.move_on_after(expires):
                    await pulls.idle()
            await sub.unsubscribe()


class _Pulls:
    """The open pull request of a `consume` loop, as its subscription's callback sees it: how many of its
    messages are still to come, and whether it ended (used up, or a status from the server)."""

    def __init__(self, handler: Handler, budget: Budget | None, stop: anyio.Event | None) -> None:
        self.handler, self.budget, self.stop = handler, budget, stop  # stop: take nothing once it is set
        self.left = 0  # messages the open request may still deliver (units of the budget reserved for them)
        self.closed = False  # the loop ended: take nothing more
        self._ended: tuple[str, str] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # cleared while a handler runs (the subscription runs one at a time)
        self._idle.set()

    def open(self, size: int) -> None:
        self.left, self._ended = size, None
        self._wake.clear()

    def close(self) -> int:
        """End the open request; returns its units no message took (a late one takes a fresh unit)."""
        left, self.left = self.left, 0
        return left

    async def on_msg(self, msg: Msg) -> None:
        status = delivery_status(msg)
        if self.closed or (self.stop is not None and self.stop.is_set()):
            return
        if status is None:
            if self.left > 0:
                self.left -= 1
                if self.left == 0:
                    self._end("used", "")
            elif self.budget is not None:  # a late delivery of a request this loop gave up on
                self.budget.take(1)
            self._idle.clear()
            try:
                await self.handler(msg)
            except Exception:  # a handler bug must not stop the partition; it is redelivered
                log.exception("handler failed on %s", msg.subject)
            finally:
                self._idle.set()
        elif status != "100":  # not an idle heartbeat: the request ended
            self._end(status, str((msg.headers or {}).get("Description", "")).lower())

    def _end(self, status: str, description: str) -> None:
        if self._ended is None:
            self._ended = (status, description)
            self._wake.set()

    async def ended(self, timeout: float, stop: anyio.Event | None) -> tuple[str, str] | None:
        """How the open request ended; None if it timed out (lost in a reconnect) or `stop` was set."""
        with anyio.move_on_after(timeout):
            while self._ended is None:
                if stop is not None and stop.is_set():
                    return None
                if stop is None:
                    await self._wake.wait()
                    continue
                # wait for whichever comes first, with no timer: an idle host keeps dozens of these
                # requests open, and waking each of them a few times a second to look at `stop` was a
                # good part of what an idle host spent
                async with anyio.create_task_group() as tg:
                    async def first(wait: Callable[[], Awaitable[Any]]) -> None:
                        await wait()
                        tg.cancel_scope.cancel()
                    tg.start_soon(first, self._wake.wait)
                    tg.start_soon(first, stop.wait)
        return self._ended

    async def idle(self) -> None:
        await self._idle.wait()


class ConsumerGone(Exception):
    """The consumer a `consume` loop pulls from does not exist any more: its owner must make it again."""


GONE_AFTER = 40  # pull requests in a row answered "no responders" before the consumer counts as gone
UNANSWERED_WAIT_S = 0.025  # between them: 40 x 25 ms = 1 s, far beyond the route-interest race of a new one


def _unanswered(status: str, description: str, count: int, name: str) -> int:
    """The count of pull requests in a row nobody answered, after this status answer; raises
    `ConsumerGone` once the consumer is known to be gone: the server said it was deleted, or no server has
    answered for it `GONE_AFTER` times in a row (a new consumer's first requests may find no responder for
    a few milliseconds on a cluster, while its node's interest reaches the client's node)."""
    if (status == "409" and "deleted" in description) or (status == "404" and "consumer" in description):
        raise ConsumerGone(f"consumer {name}: {description}")
    if status != "503":
        return 0
    if count + 1 >= GONE_AFTER:
        raise ConsumerGone(f"consumer {name}: no server answered {GONE_AFTER} pull requests in a row")
    return count + 1


# messages a fetch delivered beyond the batch asked for, per subscription: the next fetch's first
_SURPLUS: weakref.WeakKeyDictionary[JetStreamContext.PullSubscription, list[Msg]] = \
    weakref.WeakKeyDictionary()


async def fetch_batch(psub: JetStreamContext.PullSubscription, batch: int, timeout: float) -> list[Msg]:
    """`psub.fetch` with its three "no messages" outcomes folded into `[]`, and NATS trouble too; at most
    `batch` messages (see the module docstring: a surplus is returned by the next call).

    nats-py raises its TimeoutError (usual), returns `[]` (batch > 1, sometimes) or leaks a bare
    asyncio.TimeoutError from `_fetch_n` (rare); the nats one subclasses asyncio's, so one except
    covers both.
    """
    kept = _SURPLUS.pop(psub, None)
    if kept:
        if len(kept) > batch:
            _SURPLUS[psub] = kept[batch:]
        return kept[:batch]
    try:
        msgs = await psub.fetch(batch=batch, timeout=timeout)
    except TimeoutError:  # asyncio.TimeoutError is TimeoutError on 3.11
        return []
    except (nats.errors.Error, nats.js.errors.APIError) as e:
        # 503 / no responders while a cluster elects a consumer leader (4-6 s), or a reconnect: the
        # caller's loop must survive it, so this is "nothing yet", after a pause
        await backoff("fetch", e, delay=0.25, level=logging.DEBUG, logger=log)
        return []
    if len(msgs) > batch:
        _SURPLUS[psub] = msgs[batch:]
        del msgs[batch:]
    return msgs


def delivery_status(msg: Msg) -> str | None:
    """The status code of a pull request's status message (404, 408, 409, 503, ...), or None for a message
    of the stream."""
    headers: Any = msg.headers
    if not msg.data and headers and headers.get("Status"):
        return str(headers["Status"])
    return None


__all__ = ["Budget", "ConsumerGone", "Handler", "consume", "delivery_status", "fetch_batch"]
