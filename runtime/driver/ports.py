"""The interfaces the one run driver (`runtime.driver.run`) runs over, and nothing else.

Why apart from the driver: these are what a new place to run a run must provide (a run log, the ports where
effects go, the model side), and what the ports may see of a driver (`Driven`), so the contract is read in
one place and the driver's loop in another.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runtime import events as ev
from runtime import kernel
from runtime.jobs import ToolOutcome
from runtime.types import ToolCall

if TYPE_CHECKING:
    from runtime.model.client import ModelClient
    from runtime.model.limits import DailyBudget
    from runtime.model.step import ModelStep

log = logging.getLogger("runtime.driver")


class Ackable(Protocol):
    """A message that can be acknowledged: a NATS message, or one guarded by partition ownership."""

    async def ack(self) -> None: ...


class OutcomeStore(Protocol):
    """Where big values live beside the log: an argument offloaded before a call is dispatched, an output
    resolved before its outcome is folded (the model's next prompt needs the value)."""

    async def offload(self, value: Any, *, run: str) -> Any: ...

    async def resolve_outcome(self, outcome: ToolOutcome) -> ToolOutcome: ...


class EventLog(Protocol):
    """What the driver needs of a run log: an append with an expected last sequence (`Superseded` when
    another writer got there first, `LogRejected` when it can never take the event), the same for a group of
events in one message, and its payloads."""

    @property
    def payloads(self) -> OutcomeStore: ...

    async def append(self, event: ev.Event, *, expect: int) -> int: ...

    async def append_group(self, events: Sequence[ev.Event], *, expect: int) -> int | None:
        """Several events as one message (one round trip, one sync); None when they do not fit one."""
        ...


class Model(Protocol):
    """The model side of an agent: the step (adapter + constraint), the client, the daily budget."""

    step: ModelStep
    client: ModelClient
    budget: DailyBudget | None


class Ports(Protocol):
    """Where a run's effects go, the part that differs between the fleet and one process."""

    who: str  # recorded as `by` on a timer this driver fires ("host", "loop")

    async def dispatch(self, driver: Driven, calls: Sequence[ToolCall], deadline: float | None,
                       flush: Callable[[], Awaitable[None]]) -> None:
        """Start `calls` (their `tool.called` records are staged); call `flush` once they are on their way,
        before waiting for anything else. Each call's outcome comes back through `driver.deliver`."""

    async def awaiting(self, driver: Driven, asked: ev.ApprovalRequested | ev.QuestionAsked) -> None:
        """The run now waits for a person (a verdict, an answer): ask whoever answers, if anyone here does.
        Their reply comes back through `driver.deliver` as an `Approve` / `Deny` / `Answer` command."""

    async def park(self, driver: Driven) -> bool:
        """The run only waits on time or on a person: True if it is let go (its wake-ups are held elsewhere
        and `run` returns), False to wait here."""

    async def ended(self, driver: Driven) -> None:
        """The run is over: release what the ports hold for it (wake-ups, calls still running)."""

    def may_act(self, driver: Driven) -> bool:
        """Whether this process may still cause an effect for the run now (send its model request, dispatch
        its calls). Asked just before each: the log refuses a stale writer's records, but not the request
        that leaves beside them, so a host that can no longer show it owns the run must not send it."""


Item = ToolOutcome | ev.Cancel | ev.Approve | ev.Deny | ev.Wake | ev.Answer | ev.ToolFailed


@dataclass
class Inbound:
    """Something for a run from outside: a tool outcome or a command, with the message to ack after. A
    `tool.failed` is an answer refused where it was given (an in-process answerer's bad answer)."""

    item: Item
    msg: Ackable | None = None


class Driven(Protocol):
    """What the ports see of the driver of a run: who it is, where it is, and the way in for what arrives."""

    run_id: str
    actor: str
    state: kernel.State
    inbox: deque[Inbound]
    in_flight: set[str]

    @property
    def log(self) -> EventLog: ...

    def deliver(self, item: Inbound) -> None: ...


async def ack_quietly(msg: Ackable) -> None:
    """Ack `msg`; if the connection dropped the message is redelivered and found to be a no-op."""
    try:
        await msg.ack()
    except Exception as e:
        log.debug("ack failed: %s", e)


async def release_quietly(msg: Ackable, delay: float | None = None) -> None:
    """Ask for `msg` to be delivered again now, or after `delay` seconds (a nak), by a driver or host that
    may not act for its run (`Superseded`): the run's owner (or this host's refold of it) gets it soon and
    finds its effect in the log or does the work. Left unacked, it waited out the whole AckWait (30 s by
    default) before anyone saw it again, a stall nothing reported. A nak only brings a delivery sooner, so
    it is sent whoever serves the slot now (`release` on a host's guarded message; a message without
    either method is left to its AckWait)."""
    release = getattr(msg, "release", None) or getattr(msg, "nak", None)
    if release is None:
        return
    try:
        await (release() if delay is None else release(delay=delay))
    except Exception as e:
        log.debug("nak failed: %s", e)


__all__ = ["Ackable", "Driven", "EventLog", "Inbound", "Item", "Model", "OutcomeStore", "Ports",
           "ack_quietly", "release_quietly"]
