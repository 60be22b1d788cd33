"""The partitions a host serves: taking one (at start, or when a lease is won) and giving one up.

Serving a partition (`Partitions.gain`): recreate its two durable consumers, one on TASKS and one on
RESULTS (so whatever a previous owner held un-acked is delivered again now, not after AckWait), then,
before consuming anything, recover the partition's unfinished runs (`runtime.host.recovery`), then consume
both until the partition is lost. One consumer per partition and stream, whatever the number of agents:
10,000 agents cost 2N consumers, never 10,000 (nats-server caps a stream at 1,000). NATS trouble anywhere
in there is retried for as long as the partition is held.

Losing a partition (`Partitions.lose`: released to a new host, lease expired, or fenced because renewals
failed): its consumers stop, its queued tasks are dropped un-acked, the drivers and actors working on it are
cancelled, and every message of it is wrapped (`Guarded`) so no ack for it leaves this host any more; the
next owner gets all of it again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime.host.config import HostConfig, HostStats
from runtime.nats.pull import Budget, consume
from runtime.nats.retry import backoff
from runtime.nats.subjects import RESULTS, TASKS
from runtime.nats.topology import ensure_partition_consumers

log = logging.getLogger("runtime.host")

HANDOVER_WAIT_S = 5.0  # how long `lose` waits for a partition's work to stop before handing it over
SERVE_RETRY_S = 0.5

Handler = Callable[[int, Msg], Awaitable[None]]


@dataclass
class Part:
    """One partition this host serves: its consumers run in `scope` until `Partitions.lose` cancels it."""

    p: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop: anyio.Event = field(default_factory=anyio.Event)
    ready: anyio.Event = field(default_factory=anyio.Event)  # recovered and consuming
    done: anyio.Event = field(default_factory=anyio.Event)  # its serving task has exited


class Guarded:
    """A message whose acknowledgements go through only while this host serves its partition.

    Drivers and actors ack when their work is done; once the partition has gone to another host, an ack
    from here could acknowledge a message whose effect the new owner never saw, so it is dropped and the
    message is redelivered to the owner (who finds its effect already in the log, or does the work)."""

    __slots__ = ("msg", "partition", "serves")

    def __init__(self, msg: Msg, serves: Callable[[int], bool], partition: int) -> None:
        self.msg, self.serves, self.partition = msg, serves, partition

    async def ack(self) -> None:
        if self.serves(self.partition):
            await self.msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        if self.serves(self.partition):
            await self.msg.nak(delay=delay)

    async def term(self) -> None:
        if self.serves(self.partition):
            await self.msg.term()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.msg, name)


class Partitions:
    """The partitions a host serves now (`parts`), each consumed in a task of the host's task group.

    Given: `recover(p)` (fold the partition's unfinished runs and queue them), the message handlers
    `on_task(p, msg)` and `on_result(p, msg)`, and, for a lost partition, `drop(p)` (forget its queued
    items, cancel its work in hand; returns how many were dropped) and `busy(p)` (work still in hand)."""

    def __init__(self, nc: NATS, js: JetStreamContext, config: HostConfig, budget: Budget, stats: HostStats,
                 host_id: str, *, spawn: Callable[..., None], recover: Callable[[int], Awaitable[None]],
                 on_task: Handler, on_result: Handler, drop: Callable[[int], int],
                 busy: Callable[[int], bool]) -> None:
        self.nc, self.js, self.config, self.budget, self.stats = nc, js, config, budget, stats
        self.host_id = host_id
        self.spawn, self.recover, self.on_task, self.on_result = spawn, recover, on_task, on_result
        self.drop, self.busy = drop, busy
        self.parts: dict[int, Part] = {}
        self.replicas = 1  # a WorkQueue stream's consumers must match its replicas

    def serves(self, partition: int) -> bool:
        return partition in self.parts

    async def gain(self, p: int, *, fresh: bool = True) -> None:
        """Start serving `p`: (re)create its consumers, recover its unfinished runs, consume.

        `fresh` recreates the consumers so whatever the previous owner held un-acked comes again now."""
        if p in self.parts:
            return
        part = self.parts[p] = Part(p)
        self.stats.gained += 1
        self.spawn(self._serve, part, fresh)

    async def _serve(self, part: Part, fresh: bool) -> None:
        p = part.p
        try:
            with part.scope:
                while not part.stop.is_set():
                    try:  # NATS trouble anywhere here: keep trying while we hold the partition
                        tasks, results = await ensure_partition_consumers(
                            self.js, p, ack_wait=self.config.task_ack_wait, fresh=fresh,
                            max_ack_pending=self.config.max_runs, replicas=self.replicas)
                        fresh = False
                        if not part.ready.is_set():
                            await self.recover(p)
                            part.ready.set()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._consume, TASKS, tasks,
                                          functools.partial(self.on_task, p), part.stop, self.budget)
                            tg.start_soon(self._consume, RESULTS, results,
                                          functools.partial(self.on_result, p), part.stop, None)
                    except Exception as e:
                        await backoff(f"partition {p}", e, delay=SERVE_RETRY_S, logger=log)
        finally:
            part.done.set()

    async def lose(self, p: int, why: str) -> None:
        """Stop serving `p` now: no more pulls, acks or appends for it from this host. Its queued tasks are
        dropped un-acked and its drivers cancelled; the next owner recovers them from the log."""
        part = self.parts.pop(p, None)
        if part is None:
            return
        self.stats.lost += 1
        part.stop.set()
        part.scope.cancel()
        dropped = self.drop(p)
        with anyio.move_on_after(HANDOVER_WAIT_S):
            await part.done.wait()
            while self.busy(p):
                await anyio.sleep(0.01)
        self.stats.handed_over += dropped
        log.info("host %s: stopped serving partition %d (%s); %d queued item(s) left to its next owner",
                 self.host_id, p, why, dropped)

    async def _consume(self, stream: str, consumer: str, handler: Any, stop: anyio.Event,
                       budget: Budget | None) -> None:
        await consume(self.nc, stream, consumer, handler, stop=stop, batch=self.config.pull_batch,
                      expires=self.config.pull_expires, budget=budget)


__all__ = ["Guarded", "Part", "Partitions"]
