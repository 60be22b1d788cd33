"""Actors and their mailboxes: one task at a time per agent instance, every instance concurrently.

An actor is ``<bundle>`` or ``<bundle>:<instance>``. It exists only while it has work (an idle agent is a
dict entry nobody created), works through its mailbox in arrival order, and runs concurrently with every
other actor. A mailbox holds two kinds of item: a `Task` not started yet (its message still un-acked, so a
crash loses none of them) and a `Resume`, a run recovered from its log that goes on first.

What an item is worked on with (starting a task's run, driving a run) is the coordinator's
(`runtime.host.host`); here is what the actors hold and how it is given back: every item carries one unit
of the host's `runtime.nats.pull.Budget`, released when its work is over or when it is dropped because its
slot (its partition of its bundle, `runtime.host.leases.Slot`) went to another host (`forget`, `drop`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from runtime import events as ev
from runtime.host.config import HostStats
from runtime.host.driver import Inbound, RunDriver
from runtime.host.leases import Slot
from runtime.log import Superseded
from runtime.nats.pull import Budget
from runtime.nats.subjects import bundle_token

log = logging.getLogger("runtime.host")


@dataclass
class Task:
    task: ev.Task
    msg: Any  # a `Guarded` task message (None for tests that enqueue by hand)
    run_id: str
    partition: int
    stream_seq: int
    cancel: Inbound | None = None  # a cancel that arrived while the task waited: applied once it started
    continues: str | None = None  # a run this task interrupted: a task without a thread goes on from it


@dataclass
class Resume:
    driver: RunDriver


Item = Task | Resume


def partition_of_item(item: Item) -> int:
    return item.partition if isinstance(item, Task) else item.driver.partition


def slot_of(actor: str, partition: int) -> Slot:
    """The slot a run or task of `actor` in `partition` belongs to: its bundle's share of the partition
    (the bundle as the streams store it, so the slot whose consumer delivered the message)."""
    return bundle_token(actor), partition


def run_of_item(item: Item) -> str:
    return item.run_id if isinstance(item, Task) else item.driver.run_id


@dataclass
class Actor:
    key: str
    mailbox: deque[Item] = field(default_factory=deque)
    running: bool = False
    current: tuple[Slot, anyio.CancelScope] | None = None  # the slot of the item in hand, its scope


class Actors:
    """Every actor of a host, and the runs they hold: `waiting` (tasks still in a mailbox) and `drivers`
    (runs being driven, or queued to resume). `start`, `drive` and `refold` are the coordinator's."""

    def __init__(self, *, budget: Budget, stats: HostStats, serves: Callable[[Slot], bool],
                 spawn: Callable[..., None], start: Callable[[str, Task], Awaitable[None]],
                 drive: Callable[[RunDriver], Awaitable[None]],
                 refold: Callable[[str, str, int], Awaitable[None]]) -> None:
        self.budget, self.stats, self.serves, self.spawn = budget, stats, serves, spawn
        self.start, self.drive, self.refold = start, drive, refold
        self.by_key: dict[str, Actor] = {}
        self.drivers: dict[str, RunDriver] = {}  # run id -> the driver of a run this host owns
        self.waiting: dict[str, Task] = {}  # run id -> a task still in a mailbox

    def enqueue(self, key: str, item: Item, *, front: bool = False) -> bool:
        """Queue `item` for actor `key`; False if it was a redelivery of a task already waiting (which
        keeps its place, now with the newer message)."""
        actor = self.by_key.get(key)
        if actor is None:
            actor = self.by_key[key] = Actor(key)
        if isinstance(item, Task):
            for queued in actor.mailbox:  # a redelivery of a task already waiting: keep its place
                if isinstance(queued, Task) and queued.stream_seq == item.stream_seq:
                    queued.msg = item.msg
                    return False
            self.waiting[item.run_id] = item
        if front:
            actor.mailbox.appendleft(item)
        else:
            actor.mailbox.append(item)
        if not actor.running:
            actor.running = True
            self.spawn(self._loop, actor)
        return True

    def behind(self, key: str, run_id: str) -> bool:
        """Whether the task of `run_id` waits behind other work of actor `key` (a run in hand, or items
        before it in the mailbox), rather than being the next thing the actor does."""
        actor = self.by_key.get(key)
        if actor is None or run_id not in self.waiting:
            return False
        return actor.current is not None or (bool(actor.mailbox) and run_of_item(actor.mailbox[0]) != run_id)

    def resume(self, driver: RunDriver) -> None:
        """Hold a run folded from its log and queue it first in its actor's mailbox (it takes one unit of
        the budget without waiting: it is already started)."""
        self.drivers[driver.run_id] = driver
        self.budget.take()
        self.enqueue(driver.actor, Resume(driver), front=True)

    def forget(self, item: Item) -> None:
        """An item leaves this host without being worked on."""
        if isinstance(item, Task):
            self.waiting.pop(item.run_id, None)
        else:
            self.drivers.pop(item.driver.run_id, None)
        self.budget.release()

    def drop(self, slot: Slot) -> int:
        """Slot `slot` is gone: forget its queued items and cancel the work in hand on it; how many items
        were dropped."""
        dropped = 0
        for actor in list(self.by_key.values()):
            if bundle_token(actor.key) != slot[0]:
                continue
            kept: deque[Item] = deque()
            for item in actor.mailbox:
                if partition_of_item(item) == slot[1]:
                    self.forget(item)
                    dropped += 1
                else:
                    kept.append(item)
            actor.mailbox = kept
            if actor.current is not None and actor.current[0] == slot:
                actor.current[1].cancel()
        return dropped

    def busy(self, slot: Slot) -> bool:
        """Whether an actor still works on an item of slot `slot`."""
        return any(a.current is not None and a.current[0] == slot for a in self.by_key.values())

    async def _loop(self, actor: Actor) -> None:
        try:
            while actor.mailbox:
                item = actor.mailbox.popleft()
                p = partition_of_item(item)
                slot = slot_of(actor.key, p)
                if not self.serves(slot):  # its slot went while it waited
                    self.forget(item)
                    continue
                with anyio.CancelScope() as scope:
                    actor.current = (slot, scope)
                    try:
                        if isinstance(item, Task):
                            await self.start(actor.key, item)
                        else:
                            await self.drive(item.driver)
                    except Superseded as e:
                        self.stats.superseded += 1
                        log.warning("%s: %s; this host stops driving it", actor.key, e)
                        if self.serves(slot):
                            self.spawn(self.refold, run_of_item(item), actor.key, p)
                    except Exception:
                        log.exception("%s: unexpected error; the run is resumed at the next takeover of "
                                      "partition %d of %s", actor.key, p, slot[0])
                actor.current = None
                if scope.cancelled_caught:
                    self.stats.handed_over += 1
                    if self.serves(slot):  # served again while this work stopped: a takeover's recovery
                        # may have skipped the run because this driver still held it; fold it back
                        self.spawn(self.refold, run_of_item(item), actor.key, p)
                if isinstance(item, Task):
                    self.waiting.pop(item.run_id, None)
                self.budget.release()
        finally:
            actor.current = None
            actor.running = False
            if not actor.mailbox:
                self.by_key.pop(actor.key, None)


__all__ = ["Actor", "Actors", "Item", "Resume", "Task", "partition_of_item", "run_of_item", "slot_of"]
