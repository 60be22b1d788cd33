"""Reading every run's events through a durable consumer (`RunLog.tail`, `RunLog.ends`): what a reader that
derives something from the log uses (the trace exporter, the workers' watch on sub-runs' ends). It acks what
it has handled, resumes after a crash where it stopped, and several processes sharing one durable split the
events between them. It never writes.

Events come one item each, as stored (stubs unresolved). A group (several events a writer stored as one
message: `runtime.events.encode_group`) is handed out as one item per event, and its message is acked only
once every one of them is, so a reader stopped halfway through a group gets all of it again: at least once,
as for any message not acked.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime import events as ev
from runtime.nats.pull import fetch_batch


class _Message:
    """One stored message handed out as several `Tailed` (a group of events): acked once every one of them
    is, and never if one is nak'd or termed (the message then comes back whole, or not at all)."""

    def __init__(self, msg: Msg, events: int) -> None:
        self.msg, self.pending, self.settled = msg, events, False

    async def ack(self) -> None:
        self.pending -= 1
        if self.pending == 0 and not self.settled:
            self.settled = True
            await self.msg.ack()

    async def nak(self, delay: float | None) -> None:
        if not self.settled:
            self.settled = True
            await self.msg.nak(delay=delay)

    async def term(self) -> None:
        if not self.settled:
            self.settled = True
            await self.msg.term()


@dataclass
class Tailed:
    """One event from a `Tail`, or why its message could not be decoded (`event` None); ack it once
    handled. The events of a group (`RunLog.append_group`) come one `Tailed` each; their message is acked
    when all of them are."""

    event: ev.Event | None
    error: str
    message: _Message

    @property
    def msg(self) -> Msg:
        return self.message.msg

    async def ack(self) -> None:
        await self.message.ack()

    async def nak(self, delay: float | None = None) -> None:
        await self.message.nak(delay)

    async def term(self) -> None:
        await self.message.term()


class Tail:
    """A durable reader of every run's events (`RunLog.tail`); events come as stored (stubs unresolved)."""

    def __init__(self, psub: JetStreamContext.PullSubscription) -> None:
        self.psub = psub

    async def fetch(self, batch: int, timeout: float = 1.0) -> list[Tailed]:
        """Up to `batch` messages' events not yet acked, in stream order (redeliveries may come later than
        newer events); `[]` after `timeout` with none, or during NATS trouble."""
        out: list[Tailed] = []
        for msg in await fetch_batch(self.psub, batch, timeout):
            try:
                events = ev.decode_all(msg.data)
            except ev.EventDecodeError as e:
                out.append(Tailed(None, str(e), _Message(msg, 1)))
                continue
            message = _Message(msg, len(events))
            out += [Tailed(event, "", message) for event in events]
        return out

    async def close(self) -> None:
        await self.psub.unsubscribe()


__all__ = ["Tail", "Tailed"]
