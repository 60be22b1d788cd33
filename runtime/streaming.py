"""A run's model output as it is generated: published on core NATS, never stored.

The host asks the model for a stream (SSE) and publishes each fragment on ``stream.<actor>.<run>`` the
moment it arrives, so a person watching a long turn sees it being written. The durable truth stays
`model.responded` in the run log: these messages are core NATS (at most once, no replay), and a follower
that joins late reads the log first and the stream after (`runtime.client.replay.watch`). For any reply, the
concatenation of a request's `text` deltas equals the recorded `model.responded.text`.

One JSON object per message (any NATS client can subscribe: ``nats sub 'stream.demo.>'``):

    {"run_id": "r1a2", "request_id": "r1a2/1", "turn": 1, "n": 0, "text": "The answer"}
    {"run_id": "r1a2", "request_id": "r1a2/2", "turn": 2, "n": 3,
     "tool_call": {"index": 0, "id": "call_0", "name": "add", "arguments": "{\\"a\\": 1"}}
    {"run_id": "r1a2", "request_id": "r1a2/2", "turn": 2, "n": 9, "done": true}

`n` counts the messages of one request from 0, so a subscriber can tell it missed one; `tool_call`
fragments carry the call's `name` (and `id`) once, then `arguments` piece by piece; `done` closes the
request (its `model.responded` or `model.failed` follows in the log). If the client retries a failed
attempt, a message with `attempt` (2, 3, ...) says the reply starts again, and the fragments of the new
attempt follow it: a viewer starts a new line there rather than run two attempts together; the log says what
was kept.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runtime.nats.subjects import stream_filter, stream_subject

log = logging.getLogger("runtime.streaming")


class ToolCallDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    """A fragment of one tool call of the reply (`index` says which)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class Delta(msgspec.Struct, frozen=True, omit_defaults=True):
    """One message of a run's stream (see the module docstring)."""

    run_id: str
    request_id: str
    turn: int
    n: int
    text: str = ""
    tool_call: ToolCallDelta | None = None
    done: bool = False
    attempt: int = 0  # set on the message that says a retried attempt starts the reply again

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Delta:
        return msgspec.json.decode(data, type=cls)


class RequestStream:
    """Publishes the fragments of one model request; its methods are the model client's callbacks."""

    def __init__(self, nc: NATS, subject: str, run_id: str, request_id: str, turn: int) -> None:
        self.nc, self.subject = nc, subject
        self.run_id, self.request_id, self.turn = run_id, request_id, turn
        self.n = 0

    async def _publish(self, **fields: Any) -> None:
        delta = Delta(run_id=self.run_id, request_id=self.request_id, turn=self.turn, n=self.n, **fields)
        self.n += 1
        try:
            await self.nc.publish(self.subject, delta.encode())
        except Exception as e:  # watching is best effort: a lost connection must not fail the model call
            log.debug("stream %s: publish failed: %s", self.subject, e)

    async def on_text(self, text: str) -> None:
        await self._publish(text=text)

    async def on_tool_call(self, index: int, call_id: str, name: str, arguments: str) -> None:
        await self._publish(tool_call=ToolCallDelta(index, call_id, name, arguments))

    async def retrying(self, attempt: int) -> None:
        await self._publish(attempt=attempt)

    async def done(self) -> None:
        await self._publish(done=True)


class StreamPublisher:
    """Where one run's stream goes: a `RequestStream` per model request."""

    def __init__(self, nc: NATS, actor: str, run_id: str) -> None:
        self.nc, self.run_id = nc, run_id
        self.subject = stream_subject(actor, run_id)

    def request(self, request_id: str, turn: int) -> RequestStream:
        return RequestStream(self.nc, self.subject, self.run_id, request_id, turn)


async def subscribe(nc: NATS, run_id: str, actor: str | None = None
                    ) -> tuple[Any, anyio.abc.ObjectReceiveStream[Delta]]:
    """Subscribe to a run's stream now (before reading its log, so nothing published meanwhile is
    missed); return the subscription (unsubscribe it when done) and the deltas as they arrive. Without
    `actor`, the run's stream whatever its actor."""
    send, receive = anyio.create_memory_object_stream[Delta](max_buffer_size=100_000)

    async def on_msg(msg: Msg) -> None:
        try:
            send.send_nowait(Delta.decode(msg.data))
        except (msgspec.DecodeError, anyio.WouldBlock):
            pass  # not a delta (someone else's message), or a follower too slow: the log has the truth

    subject = stream_subject(actor, run_id) if actor else stream_filter(run_id)
    sub = await nc.subscribe(subject, cb=on_msg)
    return sub, receive


async def deltas(nc: NATS, run_id: str, actor: str | None = None) -> AsyncIterator[Delta]:
    """Every delta of a run's stream from now on, until the caller stops iterating."""
    sub, receive = await subscribe(nc, run_id, actor)
    try:
        async with receive:
            async for delta in receive:
                yield delta
    finally:
        await sub.unsubscribe()


__all__ = ["Delta", "RequestStream", "StreamPublisher", "ToolCallDelta", "deltas", "subscribe"]
