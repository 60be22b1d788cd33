"""The slots a host serves: taking one (at start, or when a lease is won) and giving one up.

A slot is one partition of one bundle (`runtime.host.leases.Slot`): a host serves only bundles it loaded,
and a slot's consumers take only that bundle's messages (`subjects.bundle_task_filters`), so a task never
reaches a host that does not serve its agent, however many hosts with other bundles share the partition.

Serving a slot (`Partitions.gain`): recreate its two durable consumers, one on TASKS and one on RESULTS (so
whatever a previous owner held un-acked is delivered again now, not after AckWait), then, before consuming
anything, recover the slot's unfinished runs (`runtime.host.recovery`), then consume both until the slot is
lost. One consumer per slot and stream, whatever the number of agents (instances): 10,000 instances of a
bundle cost 2N consumers, never 10,000. NATS trouble anywhere in there is retried for as long as the slot
is held, and a consumer found gone while the slot is served (`runtime.nats.pull.ConsumerGone`: a previous
owner's late delete) is made again: a host must never hold a slot's lease while pulling from nothing.

Losing a slot (`Partitions.lose`: released to a new host, lease expired, or fenced because renewals
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
from runtime.host.leases import Slot
from runtime.nats.pull import Budget, consume
from runtime.nats.retry import backoff
from runtime.nats.subjects import RESULTS, TASKS
from runtime.nats.topology import ensure_partition_consumers

log = logging.getLogger("runtime.host")

HANDOVER_WAIT_S = 5.0  # how long `lose` waits for a slot's work to stop before handing it over
SERVE_RETRY_S = 0.5

Handler = Callable[[Slot, Msg], Awaitable[None]]


@dataclass
class Part:
    """One slot this host serves: its consumers run in `scope` until `Partitions.lose` cancels it."""

    slot: Slot
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop: anyio.Event = field(default_factory=anyio.Event)
    ready: anyio.Event = field(default_factory=anyio.Event)  # recovered and consuming
    done: anyio.Event = field(default_factory=anyio.Event)  # its serving task has exited


class Guarded:
    """A message whose acknowledgements go through only while this host serves its slot.

    Drivers and actors ack when their work is done; once the slot has gone to another host, an ack from
    here could acknowledge a message whose effect the new owner never saw, so it is dropped and the
    message is redelivered to the owner (who finds its effect already in the log, or does the work)."""

    __slots__ = ("msg", "serves", "slot")

    def __init__(self, msg: Msg, serves: Callable[[Slot], bool], slot: Slot) -> None:
        self.msg, self.serves, self.slot = msg, serves, slot

    async def ack(self) -> None:
        if self.serves(self.slot):
            await self.msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        if self.serves(self.slot):
            await self.msg.nak(delay=delay)

    async def term(self) -> None:
        if self.serves(self.slot):
            await self.msg.term()

    async def release(self, delay: float | None = None) -> None:
        """Nak whoever serves the slot now: a nak only brings the delivery sooner, to the slot's owner
        (`runtime.driver.ports.release_quietly`), so unlike an ack it needs no ownership."""
        await self.msg.nak(delay=delay)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.msg, name)


class Partitions:
    """The slots a host serves now (`parts`), each consumed in a task of the host's task group.

    Given: `recover(slot)` (fold the slot's unfinished runs and queue them), the message handlers
    `on_task(slot, msg)` and `on_result(slot, msg)`, and, for a lost slot, `drop(slot)` (forget its queued
    items, cancel its work in hand; returns how many were dropped) and `busy(slot)` (work still in hand)."""

    def __init__(self, nc: NATS, js: JetStreamContext, config: HostConfig, budget: Budget, stats: HostStats,
                 host_id: str, *, spawn: Callable[..., None], recover: Callable[[Slot], Awaitable[None]],
                 on_task: Handler, on_result: Handler, drop: Callable[[Slot], int],
                 busy: Callable[[Slot], bool]) -> None:
        self.nc, self.js, self.config, self.budget, self.stats = nc, js, config, budget, stats
        self.host_id = host_id
        self.spawn, self.recover, self.on_task, self.on_result = spawn, recover, on_task, on_result
        self.drop, self.busy = drop, busy
        self.parts: dict[Slot, Part] = {}
        self.replicas = 1  # a WorkQueue stream's consumers must match its replicas

    def serves(self, slot: Slot) -> bool:
        return slot in self.parts

    async def gain(self, slot: Slot, *, fresh: bool = True) -> None:
        """Start serving `slot`: (re)create its consumers, recover its unfinished runs, consume.

        `fresh` recreates the consumers so whatever the previous owner held un-acked comes again now."""
        if slot in self.parts:
            return
        part = self.parts[slot] = Part(slot)
        self.stats.gained += 1
        self.spawn(self._serve, part, fresh)

    async def _serve(self, part: Part, fresh: bool) -> None:
        bundle, p = slot = part.slot
        try:
            with part.scope:
                while not part.stop.is_set():
                    try:  # NATS trouble anywhere here: keep trying while we hold the slot
                        tasks, results = await ensure_partition_consumers(
                            self.js, p, bundle, ack_wait=self.config.task_ack_wait, fresh=fresh,
                            max_ack_pending=self.config.max_runs, replicas=self.replicas)
                        fresh = False
                        if not part.ready.is_set():
                            await self.recover(slot)
                            part.ready.set()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._consume, TASKS, tasks,
                                          functools.partial(self.on_task, slot), part.stop, self.budget)
                            tg.start_soon(self._consume, RESULTS, results,
                                          functools.partial(self.on_result, slot), part.stop, None)
                    except Exception as e:
                        await backoff(f"partition {p} of {bundle}", e, delay=SERVE_RETRY_S, logger=log)
        finally:
            part.done.set()

    async def lose(self, slot: Slot, why: str) -> None:
        """Stop serving `slot` now: no more pulls, acks or appends for it from this host. Its queued tasks
        are dropped un-acked and its drivers cancelled; the next owner recovers them from the log."""
        part = self.parts.pop(slot, None)
        if part is None:
            return
        self.stats.lost += 1
        part.stop.set()
        part.scope.cancel()
        dropped = self.drop(slot)
        with anyio.move_on_after(HANDOVER_WAIT_S):
            await part.done.wait()
            while self.busy(slot):
                await anyio.sleep(0.01)
        self.stats.handed_over += dropped
        log.info("host %s: stopped serving partition %d of %s (%s); %d queued item(s) left to its next owner",
                 self.host_id, slot[1], slot[0], why, dropped)

    async def _consume(self, stream: str, consumer: str, handler: Any, stop: anyio.Event,
                       budget: Budget | None) -> None:
        await consume(self.nc, stream, consumer, handler, stop=stop, batch=self.config.pull_batch,
                      expires=self.config.pull_expires, budget=budget)


__all__ = ["Guarded", "Part", "Partitions"]
