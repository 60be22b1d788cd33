"""Reading, rendering, verifying and forking a run's event stream (`sa replay`, host recovery).

    log = await read_run(js, run_id)                 # every event of the run, in order, + stream seqs
    print_timeline(log.events)                       # model requests, tool calls, scripts, durations, tokens
    report = verify(config, log.events)              # re-fold with the kernel: decide reproduces the log?
    forked = fork(log.events, at_seq=5, new_run="rX") # a new run from a past point, no model re-call

Reading uses an ordered push consumer in callback mode on `events.<agent>.<run>.>` (research/nats.md
§3: ~50k events/s, 2.5x faster than fetch), bounded by the run's last stream sequence taken first with a
direct get, so a read is a consistent snapshot even while the run is being appended to. A run id is
found without knowing its agent: `events.*.<run>.>`.

`verify` is the executable form of DESIGN rule 2: the kernel is pure, so folding the recorded events and
asking `decide` at every point must predict every event the runner wrote on its own initiative (model
requests, dispatched calls, denials, turn ends, the run's ending). Events that came from the outside
world (model replies, tool results, script notes, approvals, cancels) are inputs, not predictions: they
must only fold without error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from runtime import bus
from runtime import events as ev

# ---------------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunLog:
    """A run's events in order, the stream sequence of each, and where its subjects live."""

    run_id: str
    agent: str = ""
    events: list[ev.Event] = field(default_factory=list)
    stream_seqs: list[int] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The stream sequence of the run's last event (0: empty) — the OCC expectation of the next append."""
        return self.stream_seqs[-1] if self.stream_seqs else 0


def run_filter(run_id: str, agent: str | None = None) -> str:
    if agent:
        return bus.run_events_filter(agent, run_id)
    return f"events.*.{bus.check_token(run_id, 'run id')}.>"


async def read_run(js: JetStreamContext, run_id: str, agent: str | None = None, *,
                   timeout: float = 30.0) -> RunLog:
    """Every event of `run_id` (empty `RunLog` if there is none). Raises EventDecodeError on a bad event."""
    flt = run_filter(run_id, agent)
    try:
        last = await js.get_last_msg(bus.EVENTS, flt, direct=True)
    except NotFoundError:
        return RunLog(run_id, agent or "")
    end = last.seq
    out = RunLog(run_id, agent or (last.subject or "").split(".")[1])
    done = asyncio.get_running_loop().create_future()
    raw: list[tuple[int, bytes]] = []

    async def on_msg(msg: Any) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= end:
            raw.append((seq, msg.data))
        if seq >= end and not done.done():
            done.set_result(None)

    sub = await js.subscribe(flt, stream=bus.EVENTS, ordered_consumer=True, cb=on_msg,
                             deliver_policy=DeliverPolicy.ALL)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    for seq, data in raw:
        out.events.append(ev.decode(data))
        out.stream_seqs.append(seq)
    return out


TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled"})


async def follow(js: JetStreamContext, run_id: str, agent: str | None = None) -> AsyncIterator[ev.Event]:
    """Every event of the run from the first, live, ending after its terminal event (`sa send --follow`).

    Works before the run exists: an ordered consumer on the run's subjects waits for its first event.
    """
    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=100_000)

    async def on_msg(msg: Any) -> None:
        send.send_nowait(msg.data)

    sub = await js.subscribe(run_filter(run_id, agent), stream=bus.EVENTS, ordered_consumer=True, cb=on_msg,
                             deliver_policy=DeliverPolicy.ALL)
    try:
        async with receive:
            async for data in receive:
                event = ev.decode(data)
                yield event
                if ev.kind_of(event) in TERMINAL_KINDS:
                    return
    finally:
        await sub.unsubscribe()
        send.close()
