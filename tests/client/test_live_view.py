"""`sa send --follow`'s live view (`runtime.client.replay.watch` over `RunHandle.live`): the run's events
and the model's output as it is generated, in the order a person reads them.

The host publishes a request's fragments on core NATS as the model writes them and appends the events to
the log, so they reach a follower by two paths and a fragment can overtake the `model.requested` it
answers. Here a run is written by hand, with the fragments of a request published before its request is
in the log, a streamed tool call in pieces, and a fragment of a request already answered."""

from __future__ import annotations

import io

import anyio
import pytest
from rich.console import Console

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.client.replay import watch
from runtime.log import RunLog
from runtime.streaming import Delta, StreamPublisher

pytestmark = pytest.mark.anyio

RUN, ACTOR, REQUEST = "rlive0000000001", "calc", "rlive0000000001/1"


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=2)
    return js


async def test_fragments_come_after_their_request_and_a_streamed_call_is_closed(nats_server, topo):
    log = RunLog(topo)
    seq = await log.create(ev.RunStarted(run_id=RUN, seq=0, ts=1.0, actor=ACTOR, input="add things"))
    assert seq is not None
    publisher = await bus.connect(nats_server.url, name="test-host-stream")
    follower = await bus.connect(nats_server.url, name="test-follower")
    shown = io.StringIO()
    watched: list[ev.Event | None] = []
    try:
        stream = StreamPublisher(publisher, ACTOR, RUN).request(REQUEST, 1)

        async def delivered() -> None:  # what was published has reached the follower's connection
            await publisher.flush()
            await follower.flush()

        async with anyio.create_task_group() as tg:
            async def follow() -> None:
                handle = Client(follower).get(RUN, ACTOR)
                watched.append(await watch(handle, Console(file=shown, width=200), tokens=True))

            tg.start_soon(follow)
            with anyio.fail_after(20):
                while "run.started" not in shown.getvalue():  # the watch is subscribed and reading
                    await anyio.sleep(0.01)
            await stream.on_text("Let me ")  # the fragments overtake their request ...
            await stream.on_text("add.")
            await delivered()
            seq = await log.append(ev.ModelRequested(run_id=RUN, seq=1, ts=2.0, actor=ACTOR,
                                                     request_id=REQUEST, turn=1), expect=seq)
            await stream.on_tool_call(0, "call_0", "add", '{"a": 1, ')  # ... a call in pieces
            await stream.on_tool_call(0, "", "", '"b": 2}')
            await stream.on_tool_call(1, "call_1", "mul", '{"c": 3}')
            await stream.done()
            await delivered()
            seq = await log.append(ev.ModelResponded(run_id=RUN, seq=2, ts=3.0, actor=ACTOR,
                                                     request_id=REQUEST, turn=1, text="Let me add."),
                                   expect=seq)
            with anyio.fail_after(20):  # the reply has reached the view (the server delivers it to the
                while "model.responded" not in shown.getvalue():  # consumer when it will, and a core
                    await anyio.sleep(0.01)  # message published now could overtake it)
            await publisher.publish(f"stream.{ACTOR}.{RUN}", Delta(  # a late copy of an answered request
                run_id=RUN, request_id=REQUEST, turn=1, n=99, text="STALE").encode())
            await delivered()
            await log.append(ev.RunCompleted(run_id=RUN, seq=3, ts=4.0, actor=ACTOR, output="done"),
                             expect=seq)
    finally:
        await bus.close(publisher)
        await bus.close(follower)
    text = shown.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    kinds = [line.split()[1] if line.split()[0].isdigit() else "output" for line in lines[:-1]]
    assert kinds == ["run.started", "model.requested", "output", "model.responded", "run.completed"], text
    assert lines[2] == 'Let me add. add({"a": 1, "b": 2}) mul({"c": 3})', text
    assert "STALE" not in text and watched and isinstance(watched[0], ev.RunCompleted)
