"""The run driver on a real nats-server with real Monty workers and the scripted model over HTTP: staged
appends keep the single-writer log exact (no job before the reply holding its call is durable; its
`tool.called` goes out with it, and a job whose `tool.called` never landed still gets one before its
outcome; a stale driver stops without writing), and a 20 MB tool output travels through a real host and
comes back from replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import calc_responder, hermes_call, kinds, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime import kernel
from runtime.commands import publish_task
from runtime.host import load_agents
from runtime.host.driver import Inbound, host_driver
from runtime.jobs import ToolJob, ToolOutcome
from runtime.log import RunLog, Superseded
from runtime.log.payloads import Payloads
from runtime.model.client import ModelClient
from runtime.nats.subjects import PAYLOADS_BUCKET
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer, last_message
from runtime.types import ToolCall, ToolResult

pytestmark = pytest.mark.anyio

BIG = '''\
"""Return n characters of text."""
from grail import Input

n: int = Input("n")

"0123456789" * (n // 10)
'''


@pytest.fixture
async def topo(js):
    await ensure_topology(js, partitions=2, tool_ack_wait=5.0)
    return js


class PublishLog:
    """A JetStream context that records, in order, when each publish was sent and when it was acked."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.log: list[tuple[str, str]] = []  # ("sent" | "acked", what)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    @staticmethod
    def what(subject: str, payload: bytes) -> str:
        if subject.startswith("tools."):
            return f"job {ToolJob.decode(payload).call_id}"
        if subject.startswith("events."):  # one event, or a group of them: named by their seqs
            return "events " + ",".join(str(e.seq) for e in ev.decode_all(payload))
        return subject

    async def publish(self, subject: str, payload: bytes = b"", **kw: Any) -> Any:
        what = self.what(subject, payload)
        self.log.append(("sent", what))
        ack = await self._js.publish(subject, payload, **kw)
        self.log.append(("acked", what))
        return ack

    async def send(self, subject: str, payload: bytes = b"", **kw: Any) -> Any:
        """`JetStream.send` (the driver's jobs): logged when handed over, and when their ack is awaited."""
        what = self.what(subject, payload)
        self.log.append(("sent", what))
        return LoggedAck(await self._js.send(subject, payload, **kw), self.log, what)


class LoggedAck:
    def __init__(self, pending: Any, log: list[tuple[str, str]], what: str) -> None:
        self.pending, self.log, self.what = pending, log, what

    async def acked(self) -> Any:
        ack = await self.pending.acked()
        self.log.append(("acked", self.what))
        return ack

    def drop(self) -> None:
        self.pending.drop()


def fan_responder(body: dict[str, Any]) -> str:
    """Three parallel calculator calls, then a submit of the last tool response."""
    if "<tool_response>" in last_message(body):
        return hermes_call("submit", {"answer": "done"})
    return "\n".join(hermes_call("calculator", {"expression": f"{i} + 1"}) for i in range(3))


async def test_no_job_is_published_before_the_reply_holding_its_call_is_in_the_log(nats_server, topo,
                                                                                    tmp_path: Path):
    js = topo
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=fan_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]):
            spy = PublishLog(host.js)
            host.js, host.log = spy, RunLog(spy)  # what this host creates publishes through the spy
            run_id = await publish_task(js, "calc", "three at once")
            with anyio.fail_after(60):
                events = [e async for e in RunLog(js).follow(run_id)]
    assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "done"}
    assert [e.seq for e in events] == list(range(len(events)))
    every = [e.call.id for e in events if isinstance(e, ev.ToolCalled)]
    called = [e.call.id for e in events if isinstance(e, ev.ToolCalled) and e.call.name == "calculator"]
    assert len(called) == 3 and len(every) == 4  # and the submit
    reply_of = {c.id: e.seq for e in events if isinstance(e, ev.ModelResponded) for c in e.calls}
    log = spy.log
    for call_id in every:  # each job leaves once the message holding its reply is stored
        job_sent = log.index(("sent", f"job {call_id}"))
        holding = next(i for i, (step, what) in enumerate(log) if step == "acked"
                       and what.startswith("events ") and str(reply_of[call_id]) in what[7:].split(","))
        assert holding < job_sent, log
    # the turn's reply and its 3 calls' records are one message (a group), acked before the first job leaves
    history = await RunLog(js).read(run_id)
    reply = reply_of[called[0]]
    records = [i for i, e in enumerate(history.events)
               if isinstance(e, ev.ToolCalled) and e.call.id in called]
    assert {history.stream_seqs[i] for i in records} == {history.stream_seqs[reply]}
    for call_id in every:
        at = {e.seq for e in events if isinstance(e, ev.ToolCalled) and e.call.id == call_id}
        done = {e.seq for e in events if isinstance(e, ev.ToolCompleted) and e.call_id == call_id}
        assert len(at) == 1 and len(done) == 1 and at.pop() < done.pop()


class AckLog:
    """A RESULTS message whose ack is written to a `PublishLog`'s log."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    async def ack(self) -> None:
        self.log.append(("ack", "outcome"))


class Acked:
    async def acked(self) -> None:
        return None

    def drop(self) -> None:
        return None


async def test_an_outcome_whose_tool_called_never_landed_gets_it_before_its_own_events(nats_server, topo,
                                                                                         tmp_path: Path):
    """A call sent once its reply is durable (after an approval, or as others finish) leaves before its
    `tool.called` is appended; a host killed in between leaves a log whose reply holds the call and no
    `tool.called`. (The turn's first calls go out only after their records: one message with the reply.)
    The next driver of the run, handed the job's outcome first, records `tool.called` before the
    outcome's events: the log reads as if the record had landed."""
    js = topo
    bundle = write_bundle(tmp_path, terminal=None)  # the run ends on the model's reply in text

    def responder(body: dict[str, Any]) -> str:
        return "three" if "<tool_response>" in last_message(body) else hermes_call("calculator",
                                                                                   {"expression": "1 + 2"})

    with ScriptedModelServer(responder=responder) as server:
        client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        agent = load_agents([bundle], client=client)["calc"]
        run_id = "r-lost-record"
        call = ToolCall(id=f"{run_id}/1.0", name="calculator", arguments={"expression": "1 + 2"})
        crashed = [ev.stamp(e, seq=i, ts=1.0 + i, actor="calc") for i, e in enumerate([
            ev.RunStarted(run_id=run_id, input="add"),
            ev.ModelRequested(run_id=run_id, request_id=f"{run_id}/1", turn=1),
            ev.ModelResponded(run_id=run_id, request_id=f"{run_id}/1", turn=1, calls=(call,))])]
        before = await RunLog(js).write_run(crashed)  # the call left; its record never landed
        outcome = ToolOutcome(run_id=run_id, actor="calc", call_id=call.id, tool="calculator",
                              result=ToolResult(output=3), worker="w")
        spy = PublishLog(js)
        second = host_driver(spy, agent, "calc", run_id, 0, last_seq=before.last_seq,
                           state=kernel.fold(agent.config, before.events), log=RunLog(spy))
        second.deliver(Inbound(outcome, AckLog(spy.log)))  # found before the driver dispatches the call again
        with anyio.fail_after(30):
            final = await second.run()
        await client.aclose()
    assert final.status == "completed"
    # the record, the outcome's events, the turn's end and the next request are one message (a group, named
    # by its last event), and the outcome's message is acked once that is stored, before anything else
    acked_at = spy.log.index(("ack", "outcome"))
    stored = [i for i, (kind, _) in enumerate(spy.log) if kind == "acked"]
    assert spy.log[stored[0]] == ("acked", "events 3,4,5,6"), spy.log
    assert stored[0] < acked_at < stored[1], spy.log
    log = await RunLog(js).read(run_id)
    assert len(set(log.stream_seqs[3:7])) == 1 < len(set(log.stream_seqs[6:8]))  # seq 3-6: one message
    assert kinds(log.events) == ["run.started", "model.requested", "model.responded", "tool.called",
                                 "tool.completed", "turn.completed", "model.requested", "model.responded",
                                 "turn.completed", "run.completed"]
    assert [e.seq for e in log.events] == list(range(len(log.events)))
    assert kernel.fold(agent.config, log.events) == final  # it re-folds to what the driver holds


async def test_a_stale_driver_stops_at_its_first_write_and_leaves_no_fork(nats_server, topo, tmp_path: Path):
    js = topo
    bundle = write_bundle(tmp_path, terminal=None)  # the run ends on the model's reply in text
    with ScriptedModelServer(responder=lambda body: "plain answer") as server:
        client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        agent = load_agents([bundle], client=client)["calc"]
        run_id = "r-stale"
        started = ev.RunStarted(run_id=run_id, seq=0, ts=1.0, actor="calc", input="say something")
        seq = await RunLog(js).append(started, expect=0)
        assert await RunLog(js).append(started, expect=0) == seq  # a retried landed append: no-op
        assert await RunLog(js).create(started) is None  # the run exists: not created twice
        state = kernel.evolve(kernel.initial(agent.config), started)
        first = host_driver(js, agent, "calc", run_id, 0, state=state, last_seq=seq)
        stale = host_driver(js, agent, "calc", run_id, 0, state=state, last_seq=seq)
        final = await first.run()
        with pytest.raises(Superseded):
            await stale.run()
        await client.aclose()
    assert final.status == "completed"
    log = await RunLog(js).read(run_id)
    assert kinds(log.events) == ["run.started", "model.requested", "model.responded", "turn.completed",
                                 "run.completed"]
    assert [e.seq for e in log.events] == [0, 1, 2, 3, 4] and log.events[-1].output == "plain answer"
    assert log.last_seq == first.last_seq


async def test_a_20_mb_tool_output_runs_through_a_host_and_replays_byte_exact(nats_server, topo, tmp_path):
    js = topo
    n = 20_000_000
    bundle = write_bundle(tmp_path)
    (bundle.parent / "tools" / "big.pym").write_text(BIG)
    text = bundle.read_text().replace(
        "tools:\n", "tools:\n  - path: tools/big.pym\n    limits: {max_memory: 512mb, max_output: 64mb, "
                    "max_duration: 60s}\n")
    bundle.write_text(text)

    def responder(body: dict[str, Any]) -> str:
        last = last_message(body)
        if "<tool_response>" in last:  # the 20 MB came back to the model: answer with its size
            return hermes_call("submit", {"answer": str(len(last))})
        return hermes_call("big", {"n": n})

    with ScriptedModelServer(responder=responder, record=False) as server:
        async with running_host(nats_server.url, [bundle], server), running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "make it big")
            with anyio.fail_after(120):
                live = [e async for e in RunLog(js).follow(run_id)]  # as stored: refs, not values
    assert kinds(live)[-1] == "run.completed", kinds(live)
    assert int(live[-1].output["answer"]) > n
    expected = "0123456789" * (n // 10)

    completed = next(e for e in live if isinstance(e, ev.ToolCompleted) and e.tool == "big")
    assert completed.output is None and completed.ref is not None and completed.ref.size > n
    requested = [e for e in live if isinstance(e, ev.ModelRequested)]
    assert requested[1].ref is not None and requested[1].messages == ()  # the prompt with 20 MB in it

    # what is in EVENTS: every message of the run is small (a group too: stubs, not values)
    stored = await RunLog(js).stored(run_id)
    sizes = [len(m.data) for m in stored]
    threshold = Payloads(js).threshold
    assert sum(len(ev.decode_all(m.data)) for m in stored) == len(live) and max(sizes) < threshold

    # replay resolves the refs: byte-exact output, and the prompt carries it as the tool response
    log = await RunLog(js).read(run_id)
    (resolved,) = [e for e in log.events if isinstance(e, ev.ToolCompleted) and e.tool == "big"]
    assert resolved.ref is None and resolved.output == expected
    prompt = [e for e in log.events if isinstance(e, ev.ModelRequested)][1]
    assert prompt.ref is None and any(expected in m.content for m in prompt.messages)
    assert log.events[-1].output == live[-1].output
    # content addressing: the host re-offloading the output it resolved found the worker's object (same
    # bytes, same name): two objects in all, the output and the prompt that carries it
    info = await js.stream_info(f"OBJ_{PAYLOADS_BUCKET}", subjects_filter=f"$O.{PAYLOADS_BUCKET}.M.>")
    assert len(info.state.subjects or {}) == 2


async def test_a_chain_of_turns_keeps_a_contiguous_log(nats_server, topo, tmp_path: Path):
    """Staged writes across many turns: every seq once, in order, each model call made once."""
    js = topo
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server), running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "chain: 4")
            with anyio.fail_after(60):
                events = [e async for e in RunLog(js).follow(run_id)]
        served = server.served
    assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "chained 4"}
    assert [e.seq for e in events] == list(range(len(events)))
    assert served == sum(isinstance(e, ev.ModelResponded) for e in events) == 5
    assert sum(isinstance(e, ev.TurnCompleted) for e in events) == 5


async def test_a_big_task_input_is_stored_by_reference_and_replays_whole(nats_server, topo, tmp_path: Path):
    """A task input over the payload threshold: `run.started` in EVENTS carries a ref, not the text; the
    model still sees the whole input, and replay resolves it byte-exact."""
    js = topo
    threshold = Payloads(js).threshold
    big_input = "compute: 2 + 3 " + "x" * (threshold + 1024)
    bundle = write_bundle(tmp_path)
    seen: list[int] = []

    def responder(body: dict[str, Any]) -> str:
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        seen.append(len(first))
        return calc_responder(body)

    with ScriptedModelServer(responder=responder, record=False) as server:
        async with running_host(nats_server.url, [bundle], server), running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", big_input)
            with anyio.fail_after(60):
                live = [e async for e in RunLog(js).follow(run_id)]
    assert kinds(live)[-1] == "run.completed", kinds(live)
    started = live[0]
    assert isinstance(started, ev.RunStarted) and started.ref is not None
    assert started.ref.size >= len(big_input)
    assert seen and min(seen) >= len(big_input)  # every model request carried the whole task
    log = await RunLog(js).read(run_id)
    assert log.events[0].ref is None and log.events[0].input == big_input


async def test_an_event_the_log_can_never_take_ends_the_run_instead_of_wedging_it(nats_server, topo,
                                                                                  tmp_path: Path):
    """A `script.started` whose worker name alone is over the server's 1 MiB message limit cannot be
    offloaded (nothing in it is a payload field): the stream can never take it. The driver must not
    retry it forever: it drops it, and the run ends with `run.failed` (log_rejected) saying which event."""
    js = topo
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=lambda body: "unused") as server:
        client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        agent = load_agents([bundle], client=client)["calc"]
        run_id = "r-rejected"
        started = ev.RunStarted(run_id=run_id, seq=0, ts=1.0, actor="calc", input="go")
        seq = await RunLog(js).append(started, expect=0)
        state = kernel.evolve(kernel.initial(agent.config), started)
        driver = host_driver(js, agent, "calc", run_id, 0, state=state, last_seq=seq)
        await driver.append(ev.ScriptStarted(run_id=run_id, call_id=f"{run_id}/1.0", tool="calculator",
                                             worker="w" * (2 << 20)))
        await driver._flush()
        final = await driver.run()  # over already: returns without calling the model
        await client.aclose()
    assert final.status == "failed" and final.reason is not None and final.reason.startswith("log_rejected")
    log = await RunLog(js).read(run_id)
    assert kinds(log.events) == ["run.started", "run.failed"] and [e.seq for e in log.events] == [0, 1]
    failed = log.events[-1]
    assert isinstance(failed, ev.RunFailed) and failed.reason == "log_rejected"
    assert "script.started (seq 1)" in failed.detail and "bytes" in failed.detail
    assert server.requests == []  # the run never went on to call the model


SIZE = '''\
"""Count the characters of a text."""
from grail import Input

text: str = Input("text")

{"chars": len(text), "tail": text[-8:]}
'''


@pytest.mark.parametrize("n", [1_200_000, 20_000_000], ids=["1.2MB", "20MB"])
async def test_tool_call_arguments_over_the_message_limit_run_and_replay_byte_exact(nats_server, topo,
                                                                                    tmp_path: Path, n: int):
    """A model reply whose tool-call arguments are over NATS's 1 MiB message limit: `model.responded`,
    `tool.called`, the next `model.requested` and the tool job all carry them by reference, the run
    completes, and replay gives the arguments back byte for byte."""
    js = topo
    bundle = write_bundle(tmp_path)
    (bundle.parent / "tools" / "size.pym").write_text(SIZE)
    bundle.write_text(bundle.read_text().replace(
        "tools:\n", "tools:\n  - path: tools/size.pym\n    limits: {max_memory: 512mb, max_duration: 60s}\n")
        # about payloads by reference, not watching: 20 MB streamed in the scripted server's 8-byte SSE
        # chunks would be 2.5 million chunks (no real model writes that much in one reply)
        + "conversation: {stream: false}\n")
    text = "0123456789abcdef" * (n // 16) + "THE-END!"

    def responder(body: dict[str, Any]) -> str:
        last = last_message(body)
        if "<tool_response>" in last:
            return hermes_call("submit", {"answer": last.split("<tool_response>")[1].strip()[:60]})
        return hermes_call("size", {"text": text})

    with ScriptedModelServer(responder=responder, record=False) as server:
        async with running_host(nats_server.url, [bundle], server), running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "how long is it")
            with anyio.fail_after(120):
                live = [e async for e in RunLog(js).follow(run_id)]
    assert kinds(live)[-1] == "run.completed", [(ev.kind_of(e), getattr(e, "detail", "")) for e in live]
    assert str(len(text)) in live[-1].output["answer"] and "THE-END!" in live[-1].output["answer"]
    responded = next(e for e in live if isinstance(e, ev.ModelResponded))
    called = next(e for e in live if isinstance(e, ev.ToolCalled))
    assert responded.ref is not None and called.ref is not None  # stored by reference...
    assert called.call.name == "size" and called.call.arguments == {}  # ...the stub still names the call
    log = await RunLog(js).read(run_id)
    whole = next(e for e in log.events if isinstance(e, ev.ToolCalled))
    assert whole.call.arguments["text"] == text  # byte-exact
    assert next(e for e in log.events if isinstance(e, ev.ModelResponded)).calls[0].arguments["text"] == text
