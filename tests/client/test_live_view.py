"""`sa send --follow`'s live view (`runtime.client.replay.watch` over `RunHandle.live`): the run's events,
the model's output as it is generated and the tool jobs still running, in the order a person reads them.

The host publishes a request's fragments on core NATS as the model writes them and appends the events to
the log, so they reach a follower by two paths and a fragment can overtake the `model.requested` it
answers. Here a run is written by hand, with the fragments of a request published before its request is
in the log, a streamed tool call in pieces, and a fragment of a request already answered.

A tool job's script run is recorded only inside its call's outcome, so the log says nothing while a tool
runs; the worker tells the run's followers on core NATS once a job has run half a second
(`runtime.streaming.ScriptRunning`). Here a real worker runs a busy loop and a fast tool: `sa send
--follow` and the inspector's live view show the slow one's start, with its worker, between its
`tool.called` and its outcome, and the fast one costs not a single message."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from control_helpers import control_model, sa
from host_helpers import SUBMIT, running_host, running_worker
from nats.aio.msg import Msg
from rich.console import Console

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.client.replay import watch
from runtime.commands import run_id_for
from runtime.log import RunLog
from runtime.nats.subjects import script_subject
from runtime.streaming import Delta, ScriptRunning, StreamPublisher
from runtime.testing import ScriptedModelServer
from runtime.types import ToolCall, ToolError
from runtime.ui.follow import Following
from testbed.scripts import SPIN

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


async def test_a_job_notice_is_shown_after_its_call_once_and_never_after_its_outcome(nats_server, topo):
    """Notices travel beside the log: one can overtake its call's `tool.called` (held until it is shown),
    come again (a worker repeats it for late followers: shown once per delivery) or come after the outcome
    (dropped: the log said how the call ended)."""
    run = "rlive0000000002"
    call = f"{run}/1.0"
    log = RunLog(topo)
    seq = await log.create(ev.RunStarted(run_id=run, seq=0, ts=1.0, actor=ACTOR, input="spin"))
    worker = await bus.connect(nats_server.url, name="test-worker-notices")
    follower = await bus.connect(nats_server.url, name="test-follower")
    shown = io.StringIO()
    notice = ScriptRunning(run_id=run, call_id=call, tool="spin", worker="box:7", started=2.0)

    async def tell(n: ScriptRunning) -> None:  # and wait until the follower's connection has it
        await worker.publish(script_subject(ACTOR, run), n.encode())
        await worker.flush()
        await follower.flush()

    async def until_shown(text: str) -> None:
        with anyio.fail_after(20):
            while text not in shown.getvalue():
                await anyio.sleep(0.01)

    try:
        async with anyio.create_task_group() as tg:
            async def follow() -> None:
                await watch(Client(follower).get(run, ACTOR), Console(file=shown, width=200), tokens=True)

            tg.start_soon(follow)
            await until_shown("run.started")
            await tell(notice)  # before its call is in the log
            seq = await log.append(ev.ToolCalled(run_id=run, seq=1, ts=2.0, actor=ACTOR,
                                                 call=ToolCall(call, "spin", {})), expect=seq)
            await until_shown("script.started")
            await tell(notice)  # the worker says it again
            await tell(msgspec.structs.replace(notice, worker="box:8", attempt=2))  # a second delivery
            await until_shown("box:8")
            seq = await log.append(ev.ToolFailed(run_id=run, seq=2, ts=9.0, actor=ACTOR, call_id=call,
                                                 tool="spin", error=ToolError("cancelled", "stopped")),
                                   expect=seq)
            await until_shown("tool.failed")
            await tell(msgspec.structs.replace(notice, attempt=3))  # late: the outcome is read already
            await log.append(ev.RunCompleted(run_id=run, seq=3, ts=10.0, actor=ACTOR, output="done"),
                             expect=seq)
    finally:
        await bus.close(worker)
        await bus.close(follower)
    lines = [line.split(maxsplit=2) for line in shown.getvalue().splitlines() if line.strip()][:-1]
    assert [(first, kind) for first, kind, _ in lines] == [
        ("0", "run.started"), ("1", "tool.called"), ("·", "script.started"), ("·", "script.started"),
        ("2", "tool.failed"), ("3", "run.completed")], shown.getvalue()
    assert lines[2][2].startswith("spin on box:7 (running")
    assert lines[3][2].startswith("spin on box:8, delivery 2")


TRANSFER = '''"""Send money (a tool that ends at once)."""
from grail import Input

amount: int = Input("amount")
to: str = Input("to")

{"sent": amount, "to": to}
'''


def slow_bundle(root: Path, base_url: str) -> Path:
    """Agent `slow`: `spin` (a busy loop the sandbox stops after 6 s: its limit, so the call fails and the
    run goes on), `transfer` (ends at once), `submit`; the model is `control_model`."""
    folder = root / "slow"
    (folder / "tools").mkdir(parents=True)
    for name, text in (("submit", SUBMIT), ("spin", SPIN), ("transfer", TRANSFER)):
        (folder / "tools" / f"{name}.pym").write_text(text)
    path = folder / "bundle.yaml"
    path.write_text(f"""\
name: slow
system_prompt: You run tools.
model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}
constraint: {{strategy: ebnf}}
tools:
  - tools/submit.pym
  - path: tools/spin.pym
    limits: {{max_duration: 6s}}
  - tools/transfer.pym
termination: {{terminal_tool: submit, max_turns: 4}}
""")
    return path


async def test_a_running_script_is_shown_with_its_worker_and_a_fast_one_sends_nothing(nats_server, topo,
                                                                                      tmp_path: Path):
    url = nats_server.url
    spin_run = run_id_for("slow", "spin-1")
    notices: list[ScriptRunning] = []  # every notice of any run, as any NATS client sees them
    pages: list[str] = []  # what the inspector's live view sends a run's page

    async def on_notice(msg: Msg) -> None:
        notices.append(ScriptRunning.decode(msg.data))

    with ScriptedModelServer(responder=control_model) as model:
        bundle = slow_bundle(tmp_path, model.base_url)
        async with running_host(url, [bundle], model), \
                running_worker(url, [bundle], concurrency=2) as worker, await Client.connect(url) as client:
            sub = await client.nc.subscribe("stream.*.*.script", cb=on_notice)
            fast = await client.start("slow", "pay: 5 to acme")
            fast_events = [e async for e in fast.events()]  # `transfer`, then `submit`: two fast jobs
            await worker.js._nc.flush()  # whatever the worker published is at the server ...
            await client.nc.flush()  # ... and has reached this subscriber
            told_of_fast = [n for n in notices if n.run_id == fast.run_id]

            async def emit(text: str) -> None:
                pages.append(text)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:  # the page opened before the run exists
                    tg.start_soon(Following(client).pump, spin_run, 0, emit)
                    followed = await sa(url, "send", "slow", "spin until stopped", "--task-id", "spin-1",
                                        "--follow", "--no-tokens")
            spin_events = await client.get(spin_run).replay()
            await sub.unsubscribe()

    assert kinds_of(fast_events).count("tool.completed") == 2 and isinstance(fast_events[-1], ev.RunCompleted)
    assert told_of_fast == []  # a job that ends within the delay publishes nothing

    called = next(e for e in spin_events if isinstance(e, ev.ToolCalled))
    failed = next(e for e in spin_events if isinstance(e, ev.ToolFailed))
    assert called.call.name == "spin" and failed.error.kind in ("limit", "timeout"), failed
    told = [n for n in notices if n.run_id == spin_run]
    assert told and {(n.call_id, n.tool, n.worker, n.attempt) for n in told} == {
        (called.call.id, "spin", worker.name, 1)}, told
    assert failed.script is not None and told[0].worker == failed.script.worker  # the worker the log names

    # `sa send --follow`: the start between the call and its outcome, with its worker, once
    assert followed.code == 0, followed.err
    lines = followed.out.splitlines()
    notice = f"script.started    spin on {worker.name} (running"
    shown = [i for i, line in enumerate(lines) if line.startswith("  · ") and notice in line]
    call_at = next(i for i, line in enumerate(lines) if " tool.called " in line)
    outcome_at = next(i for i, line in enumerate(lines) if " tool.failed " in line)
    assert len(shown) == 1 and call_at < shown[0] < outcome_at, followed.out

    # the inspector's live view: a `script` message between the call's row and its outcome's
    sent = [sse_message(chunk) for chunk in pages if "data: " in chunk]
    kinds = [data["event"]["kind"] if name == "event" else name for name, data in sent]
    script_at = kinds.index("script")
    assert sent[script_at][1]["worker"] == worker.name and sent[script_at][1]["tool"] == "spin"
    assert kinds.index("tool.called") < script_at < kinds.index("tool.failed"), kinds
    assert kinds.count("script") == 1, kinds


def sse_message(chunk: str) -> tuple[str, Any]:
    """(event name, data) of one server-sent event as `runtime.ui.follow.sse` writes it."""
    fields = dict(line.split(": ", 1) for line in chunk.strip().splitlines() if ": " in line)
    return fields["event"], json.loads(fields["data"])


def kinds_of(events: list[ev.Event]) -> list[str]:
    return [ev.kind_of(e) for e in events]
