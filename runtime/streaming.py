"""A run as it happens, beside its log: the model's output as it is generated, and the tool jobs still
running. Published on core NATS, never stored.

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

Script notices. A tool job's script run is recorded inside its call's outcome (`events.ScriptRun`, in
`tool.completed` / `tool.failed`): one append when the call ends, none when it starts, so a tool turn costs
the log nothing more. But then a follower sees nothing between `tool.called` and the outcome, and a tool
that runs for a minute looks stuck. So a worker whose job is still running `NOTICE_AFTER_S` after it began
says so on ``stream.<actor>.<run>.script`` (`script_subject`), and again every `NOTICE_EVERY_S` for
followers that join later, until the job ends (`ScriptNotices.running`); a job that ends sooner (most do)
publishes nothing at all, and none ever appends. One JSON object per message:

    {"run_id": "r1a2", "call_id": "r1a2/1.0", "tool": "crawl", "worker": "box:4242", "started": 1767.25,
     "attempt": 1}

`started` is when the worker began the job (unix time), `attempt` which delivery of the job it is. The
durable record is unchanged: the outcome's `ScriptRun` says when the script started, on which worker, and
how it ended; `sa replay` reads only that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runtime.nats.subjects import script_subject, stream_filter, stream_subject

log = logging.getLogger("runtime.streaming")

NOTICE_AFTER_S = 0.5  # a job still running this long after it began is announced ...
NOTICE_EVERY_S = 5.0  # ... and again this often, for followers that join later


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


class ScriptRunning(msgspec.Struct, frozen=True, kw_only=True):
    """A tool job of a run still running on `worker` (see the module docstring): not an event, never
    stored; the call's outcome in the log is the truth."""

    run_id: str
    call_id: str
    tool: str
    worker: str
    started: float  # unix time the worker began the job
    attempt: int = 1

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ScriptRunning:
        return msgspec.json.decode(data, type=cls)


class ScriptNotices:
    """Where one worker tells followers which of its jobs are still running (`running`)."""

    def __init__(self, nc: NATS, worker: str, *, after: float = NOTICE_AFTER_S,
                 every: float = NOTICE_EVERY_S) -> None:
        self.nc, self.worker, self.after, self.every = nc, worker, after, every

    @asynccontextmanager
    async def running(self, actor: str, run_id: str, call_id: str, tool: str, *, attempt: int,
                      started: float) -> AsyncIterator[None]:
        """While the body runs a job: once it has run `after` seconds, publish a `ScriptRunning`, then
        again every `every` seconds. A body that ends sooner costs one event-loop timer, cancelled: no
        message, no task. (A timer, not a task group with a sleeping task: that cost ~100 times more per
        job, ~0.1 ms, on the path every tool call takes.)"""
        loop = asyncio.get_running_loop()
        telling: list[asyncio.Task[None]] = []

        def start() -> None:
            notice = ScriptRunning(run_id=run_id, call_id=call_id, tool=tool, worker=self.worker,
                                   started=started, attempt=attempt)
            telling.append(loop.create_task(self._tell(script_subject(actor, run_id), notice.encode())))

        timer = loop.call_later(self.after, start)
        try:
            yield
        finally:
            timer.cancel()
            for task in telling:
                task.cancel()

    async def _tell(self, subject: str, data: bytes) -> None:
        while True:
            try:
                await self.nc.publish(subject, data)
            except Exception as e:  # best effort, like the token stream: the outcome is the truth
                log.debug("script notice %s: publish failed: %s", subject, e)
            await asyncio.sleep(self.every)


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


__all__ = ["NOTICE_AFTER_S", "NOTICE_EVERY_S", "Delta", "RequestStream", "ScriptNotices", "ScriptRunning",
           "StreamPublisher", "ToolCallDelta", "deltas", "subscribe"]
