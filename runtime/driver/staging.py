"""A run's staged appends: the events its driver has folded and not yet written, and the inbound messages
waiting for them to be written before they are acked. Why the driver stages rather than appends at once:
so that a turn costs few round trips and few disk syncs.

`RunDriver.append` folds an event at once and stages it here; `Staged.flush` writes what is staged, in order,
with the run's expectation of its last stream sequence (one writer, no gap, no fork). Several staged events
go as one message (`RunLog.append_group`: stored or refused whole); one goes alone. Nothing leaves the
process on the strength of a staged event: the driver flushes before a tool call is dispatched (the reply
holding the call is durable first), before an inbound message is acked, before it waits, and when the run
ends. Two overlaps: the model call, whose preceding events (an outcome's `tool.*`, `turn.completed`,
`model.requested`) are written *while* the request is in flight, `model.responded` staged only after both
finished (a host killed in between has not recorded the reply, so the restarted host makes the call again,
as the recovery contract allows); and a dispatch of calls whose reply is durable already, whose `tool.called`
records are written while the calls travel (the ports call `flush` between the two).

Why one message and not an atomic batch (`Nats-Batch-*`, server 2.12+) or one message per event: with the
store syncing every write (what the runtime ships), each message is one disk sync, and appends in a row wait
for each other (each expects the previous one's position): a tool turn's 3 events beside the model call were
3 syncs and 3 round trips in a row, now 1. An atomic batch keeps one message per event, but its commit is
serialised server-wide and costs more than the appends it replaces (`bench/syncs.py`, groups of 3 on a synced
store: 2.4 ms per batch against 1.5 ms for 3 appends at 1 writer, 0.5k against 2.2k groups/s at 100).

An event the log can never take (`LogRejected`: too large even with its payload in the object store) must
not wedge the run: a group refused is written again one event at a time, which finds the event, and the
driver's `rejected` drops it and what was staged after it (the run then ends saying why).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import takewhile
from typing import Any

from runtime import events as ev
from runtime import kernel
from runtime.driver.ports import Ackable, EventLog, ack_quietly
from runtime.log import LogRejected

Rejected = Callable[[ev.Event, kernel.State, LogRejected], Awaitable[None]]


class Staged:
    """What one driver has staged, the messages waiting for it, and the run's last stream sequence."""

    def __init__(self, log: EventLog, last_seq: int,
                 on_event: Callable[[ev.Event], Any] | None = None) -> None:
        self.log, self.last_seq, self.on_event = log, last_seq, on_event
        self.events: deque[tuple[ev.Event, kernel.State]] = deque()  # each with the state before it
        # messages to ack once everything staged before them is written: each with the count of events
        # written by then (written and staged), acked as soon as that many are (`written`)
        self.acks: deque[tuple[int, Ackable]] = deque()
        self.written = 0

    def __bool__(self) -> bool:
        return bool(self.events)

    def add(self, event: ev.Event, before: kernel.State) -> None:
        self.events.append((event, before))

    def ack_after(self, msg: Ackable) -> None:
        """Ack `msg` once what is staged now is written (its events are then durable)."""
        self.acks.append((self.written + len(self.events), msg))

    def release(self) -> list[Ackable]:
        """Give up the messages waiting for what is staged (a driver refused by the log hands them back)."""
        held = [msg for _, msg in self.acks]
        self.acks.clear()
        return held

    def drop(self) -> None:
        """Forget what is staged (a rejected event and what came after it); what waited for it is acked
        with what is staged next."""
        self.events.clear()

    async def flush(self, may_act: Callable[[str], None], rejected: Rejected) -> None:
        """Write every staged event in order as the run's single writer, then ack each message whose events
        are written; whatever still waits is acked at the end."""
        alone = False  # set once a group was refused: one by one then finds the event the log cannot take
        while self.events:
            may_act("append")  # a host woken from a pause past its lease writes nothing more
            group = [] if alone else list(takewhile(lambda e: not isinstance(e, ev.ALONE),
                                                     (event for event, _ in self.events)))
            if len(group) > 1:
                try:
                    landed = await self.log.append_group(group, expect=self.last_seq)
                except LogRejected:
                    landed, alone = None, True  # nothing of it was stored: a group lands or fails whole
                if landed is not None:
                    self.last_seq = landed
                    for _ in group:
                        await self._written_one()
                    continue
            event, before = self.events[0]
            try:
                self.last_seq = await self.log.append(event, expect=self.last_seq)
            except LogRejected as e:
                await rejected(event, before, e)
                continue
            await self._written_one()
        while self.acks:
            await ack_quietly(self.acks.popleft()[1])

    async def _written_one(self) -> None:
        """The first staged event is in the log: unstage it, tell the watcher, ack what waited for it."""
        event, _ = self.events.popleft()
        self.written += 1
        if self.on_event is not None:
            seen = self.on_event(event)
            if inspect.isawaitable(seen):
                await seen
        while self.acks and self.acks[0][0] <= self.written:
            await ack_quietly(self.acks.popleft()[1])


__all__ = ["Staged"]
