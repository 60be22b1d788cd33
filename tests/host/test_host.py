"""The agent host on a real nats-server with real Monty workers and the scripted model over HTTP.

Most tests use the `fleet` fixture: the calculator bundle, the scripted model, one host and one worker
(`host_helpers.running_fleet`); the others build the same fleet with what they change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from host_helpers import Env, kinds, running_fleet, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_command, publish_task, run_id_for
from runtime.host import HostConfig
from runtime.log import RunLog
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import TASKS, partition_of, task_consumer_name
from runtime.testing import Reply

pytestmark = pytest.mark.anyio


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


@pytest.fixture
async def fleet(nats_server, topo, tmp_path: Path) -> AsyncIterator[Env]:
    """The calculator bundle served by one host and one worker, the model scripted by `calc_responder`."""
    async with running_fleet(nats_server.url, topo, write_bundle(tmp_path)) as env:
        yield env


async def test_a_task_runs_end_to_end_with_a_sandboxed_tool(fleet: Env):
    js, host = fleet.js, fleet.host
    run_id = await publish_task(js, "calc", "compute: 6 * 7", task_id="t-1")
    assert run_id == run_id_for("calc", "t-1")
    events = []
    with anyio.fail_after(60):
        async for e in RunLog(js).follow(run_id):
            events.append(e)
    requests = fleet.server.requests
    k = kinds(events)
    assert k[0] == "run.started" and k[-1] == "run.completed", k
    assert {"tool.called", "tool.completed", "turn.completed"} <= set(k)
    # a tool turn is five appends: model.requested, model.responded, tool.called, tool.completed (carrying the
    # script run: no script.* entries of its own), turn.completed; then the answer's turn and the ending
    assert k == ["run.started", "model.requested", "model.responded", "tool.called", "tool.completed",
                 "turn.completed", "model.requested", "model.responded", "tool.called", "tool.completed",
                 "turn.completed", "run.completed"], k
    assert [kinds(ev.expand(e)) for e in events if isinstance(e, ev.ToolCompleted)] == [
        ["script.started", "script.completed", "tool.completed"]] * 2
    assert events[-1].output == {"answer": "42"}
    assert [e.seq for e in events] == list(range(len(events)))
    calc = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "calculator")
    assert calc.output["value"] == 42
    assert len(requests) == 2 and "<tool_response>" in str(requests[1]["messages"])
    assert "structured_outputs" in requests[0]
    started = events[0]
    assert started.bundle_digest and started.task_id == "t-1" and started.actor == "calc"
    # the index and the log agree (the host writes the index once the run's last event is in the log)
    kv = await runs_kv(js)
    with anyio.fail_after(30):
        while (ix := RunIndex.decode((await kv.get(run_id)).value)).status == "running":
            await anyio.sleep(0.05)
    assert ix.status == "completed" and ix.actor == "calc" and ix.task_id == "t-1"
    log = await RunLog(js).read(run_id)
    assert kinds(log.events) == k and ix.last_seq == log.last_seq
    assert ix.seq == log.events[-1].seq == len(k) - 1  # the run's seq (what `sa fork --at` takes) as well
    assert host.stats.runs_started == 1


async def test_a_task_published_while_no_host_runs_is_executed_when_one_starts(nats_server, topo, tmp_path):
    js = topo
    bundle = write_bundle(tmp_path)
    run_id = await publish_task(js, "calc", "compute: 1 + 1")  # nobody is listening yet
    async with running_fleet(nats_server.url, js, bundle) as env:
        events = await env.wait_run(run_id)
    assert events[-1].kind == "run.completed" if hasattr(events[-1], "kind") else True
    assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "2"}


async def test_two_tasks_to_one_agent_run_one_at_a_time_in_order(fleet: Env):
    js, host = fleet.js, fleet.host
    first = await publish_task(js, "calc", "compute: 10 + 1")
    second = await publish_task(js, "calc", "compute: 20 + 2")
    a = await fleet.wait_run(first)
    b = await fleet.wait_run(second)
    assert a[-1].output == {"answer": "11"} and b[-1].output == {"answer": "22"}
    # one at a time: the second run started after the first one ended
    assert b[0].ts >= a[-1].ts
    with anyio.fail_after(10):  # `seen` gets an event just after its append is acknowledged
        while sum(ev.kind_of(e) == "run.completed" for e in host.seen) < 2:
            await anyio.sleep(0.02)
    ends = ("run.started", "run.completed")
    order = [(e.run_id, ev.kind_of(e)) for e in host.seen if ev.kind_of(e) in ends]
    assert order == [(first, "run.started"), (first, "run.completed"), (second, "run.started"),
                     (second, "run.completed")]


async def test_instances_of_one_bundle_are_separate_actors(fleet: Env):
    js = fleet.js
    r1 = await publish_task(js, "calc", "compute: 3 * 3", instance="alice")
    r2 = await publish_task(js, "calc:bob", "compute: 4 * 4")
    a, b = await fleet.wait_run(r1), await fleet.wait_run(r2)
    assert a[0].actor == "calc:alice" and a[0].instance == "alice" and a[-1].output == {"answer": "9"}
    assert b[0].actor == "calc:bob" and b[-1].output == {"answer": "16"}


async def test_bad_input_gets_a_clear_error_and_the_host_keeps_serving(nats_server, topo, tmp_path, caplog):
    js = topo
    # unserved_after=0: a task for an agent no host serves fails at once (by default it waits a minute
    # for a host serving it; tests/host/test_host_bundles.py shows the wait)
    config = HostConfig(task_ack_wait=2.0, unserved_after=0.0)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), config=config) as fleet:
        host = fleet.host
        await js.publish("agents.calc.tasks", b'{"input": ')  # broken JSON
        await js.publish("agents.calc.tasks", b"\xff\xfe\x00garbage")  # not a command at all
        await js.publish("agents.calc.tasks", b'{"kind": "task", "input": 5}')  # wrong type
        unknown = await publish_task(js, "nosuch", "compute: 1")
        ok = await publish_task(js, "calc", "compute: 5 - 2")
        failed = await fleet.wait_run(unknown)
        good = await fleet.wait_run(ok)
        with anyio.fail_after(10):
            while host.stats.rejected < 3:
                await anyio.sleep(0.05)
    assert kinds(failed) == ["run.started", "run.failed"]
    assert failed[-1].reason == "unknown_agent" and "calc" in failed[-1].detail
    assert good[-1].output == {"answer": "3"}
    text = caplog.text
    assert "not valid JSON" in text and "neither msgpack, JSON nor UTF-8" in text and "$.input" in text
    info = await js.consumer_info(TASKS, task_consumer_name(partition_of("calc", 4), "calc"))
    assert info.num_pending == 0 and info.num_ack_pending == 0  # nothing left to be redelivered forever
    assert (await js.stream_info(TASKS)).state.messages == 0  # the unknown agent's task too


async def test_plain_text_and_json_tasks_from_any_client(fleet: Env):
    js = fleet.js
    await js.publish("agents.calc.tasks", b'{"input": "compute: 7 + 1", "task_id": "json-1"}',
                     headers={"Nats-Msg-Id": "json-1"})
    a = await fleet.wait_run(run_id_for("calc", "json-1"))
    ack = await js.publish("agents.calc.tasks", b"compute: 2 ** 5")
    b = await fleet.wait_run(run_id_for("calc", stream_seq=ack.seq))
    assert a[-1].output == {"answer": "8"} and b[-1].output == {"answer": "32"}


async def test_the_same_task_published_twice_runs_once(fleet: Env):
    js, host = fleet.js, fleet.host
    r1 = await publish_task(js, "calc", "compute: 9 + 9", task_id="dup-1")
    r2 = await publish_task(js, "calc", "compute: 9 + 9", task_id="dup-1")
    assert r1 == r2
    events = await fleet.wait_run(r1)
    # re-sent after it ran (as if past the dedup window): recognised by its run id, not re-run
    task = ev.Task(agent="calc", input="compute: 9 + 9", task_id="dup-1")
    await js.publish("agents.calc.tasks", ev.encode_command(task), headers={"Nats-Msg-Id": "other"})
    with anyio.fail_after(10):
        while host.stats.tasks < 2:
            await anyio.sleep(0.05)
        while host.actors:
            await anyio.sleep(0.05)
    served = fleet.server.served
    assert kinds(events)[-1] == "run.completed"
    assert host.stats.runs_started == 1 and served == 2  # one run: two model calls in all
    log = await RunLog(js).read(r1)
    assert kinds(log.events) == kinds(events)


async def test_cancel_a_run_waiting_for_a_slow_model(nats_server, topo, tmp_path):
    js = topo
    slow = [Reply.of_text("slow", delay=3.0)]
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), responder=None, replies=slow,
                             worker=False) as env:
        run_id = await publish_task(js, "calc", "compute: 1")
        with anyio.fail_after(10):
            while env.server.served < 1:
                await anyio.sleep(0.02)
        await publish_command(js, "calc", ev.Cancel(run_id=run_id, reason="changed my mind", by="test"),
                              operator="test")
        events = await env.wait_run(run_id, timeout=10)
    assert kinds(events) == ["run.started", "model.requested", "run.cancelled"]
    assert events[-1].reason == "changed my mind" and events[-1].by == "test"


async def test_a_deadline_from_the_task_fails_the_run(nats_server, topo, tmp_path):
    js = topo
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), worker=False) as env:  # no worker:
        run_id = await publish_task(js, "calc", "compute: 1 + 2", timeout_s=1.0)  # the job never runs
        events = await env.wait_run(run_id, timeout=15)
    k = kinds(events)
    assert k[-1] == "run.failed" and events[-1].reason == "deadline"
    timed_out = next(e for e in events if isinstance(e, ev.ToolFailed))
    assert timed_out.error.kind == "timeout" and timed_out.tool == "calculator"
    assert events[0].timeout_s == 1.0


async def test_a_model_that_answers_in_text_fails_a_run_with_a_terminal_tool(nats_server, topo, tmp_path):
    """Issue 36 through a host: a server that ignores the decoding constraint and answers in text. The run
    must end through its terminal tool `submit`, so `handle.result()` raises `no_terminal_call`: it never
    returns the text as the run's output."""
    from runtime.client import Client, RunFailedError

    text = "I am not a tool call at all }}}{{"
    async with running_fleet(nats_server.url, topo, write_bundle(tmp_path), responder=lambda body: text,
                             worker=False) as env, await Client.connect(nats_server.url) as client:
        handle = await client.start("calc", "compute: 1 + 1")
        with pytest.raises(RunFailedError) as caught:
            await handle.result(timeout=60)
        events = await handle.replay()
        requests = env.server.requests
    assert caught.value.reason == "no_terminal_call" and "'submit'" in str(caught.value)
    assert kinds(events)[-1] == "run.failed" and "run.completed" not in kinds(events)
    assert len(requests) == 3  # the bundle's max_consecutive_errors (default 3): told, asked again, twice
    assert "Call the tool submit" in requests[-1]["messages"][-1]["content"]
