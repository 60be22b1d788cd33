"""MCP tools on a fleet: a real nats-server, an in-process host and tool worker, the scripted model, and real
MCP servers (`mcp-server-time` from PyPI, and a counting server of ours that records every call on its own
side). The call runs on the worker through its one session per server; its result is recorded once; replay
and verify never call the server; `isError` is a failed call; a redelivered call that may not be repeated is
`in_doubt` and the server is not called again (`runtime.worker.mcp_clients`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import SUBMIT, running_fleet, running_worker
from mcp_helpers import PYTHON, calls, counter_server, real_server
from test_worker import collect_outcomes

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import load_bundle
from runtime.commands import publish_task
from runtime.jobs import ToolJob
from runtime.nats.pull import fetch_batch
from runtime.nats.subjects import TOOLS, WORKERS_CONSUMER
from runtime.testing import hermes_call, last_message
from runtime.tools.mcp import McpTool
from runtime.worker.mcp_clients import McpClients

pytestmark = pytest.mark.anyio


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, tool_ack_wait=1.0)
    return js


def bundle(root: Path) -> tuple[Path, Path]:
    """A bundle with the counting server's tools and the real time server's, and the count file."""
    script, count = counter_server(root)
    folder = root / "clock"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    path = folder / "bundle.yaml"
    path.write_text(
        "name: clock\nsystem_prompt: You use tools.\n"
        "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
        "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit, max_turns: 4}\n"
        "mcp:\n"
        f"  counter:\n    command: {PYTHON}\n    args: [{script}]\n    env: {{COUNT_FILE: '{count}'}}\n"
        f"  time:\n    command: {real_server('time')}\n    args: [--local-timezone, UTC]\n"
        "    allow: [get_current_time]\n    prefix: ''\n")
    return path, count


def responder(body: dict[str, Any]) -> str:
    """`tool ARGS-JSON` calls that tool; its answer is submitted as it came back."""
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-200:]})
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    tool, _, arguments = task.partition(" ")
    return hermes_call(tool, json.loads(arguments))


async def run(env: Any, task: str) -> list[ev.Event]:
    run_id = await publish_task(env.js, "clock", task)
    return await env.wait_run(run_id)


async def test_an_mcp_call_runs_on_the_worker_is_recorded_once_and_replay_never_calls(
        nats_server, topo, tmp_path: Path) -> None:
    path, count = bundle(tmp_path)
    async with running_fleet(nats_server.url, topo, path, responder=responder) as env:
        bumped = await run(env, 'counter_bump {"note": "hello"}')
        timed = await run(env, 'get_current_time {"timezone": "Asia/Tokyo"}')
        refused = await run(env, 'counter_refuse {"reason": "not today"}')
    done = next(e for e in bumped if isinstance(e, ev.ToolCompleted))
    assert (done.tool, done.output) == ("counter_bump", {"count": 1, "note": "hello"})  # structuredContent
    assert isinstance(bumped[-1], ev.RunCompleted)
    clock = next(e for e in timed if isinstance(e, ev.ToolCompleted))
    assert clock.tool == "get_current_time" and clock.output["timezone"] == "Asia/Tokyo", clock
    failed = next(e for e in refused if isinstance(e, ev.ToolFailed))
    assert failed.error.kind == "external" and "refused: not today" in failed.error.message, failed.error
    assert isinstance(refused[-1], ev.RunCompleted)  # the run goes on: the model saw the error
    assert calls(count) == ["bump", "refuse"]  # one call each, on the server's side
    replayed = await sa(nats_server.url, "replay", bumped[0].run_id, "--verify", "--bundle", str(path))
    assert replayed.code == 0, replayed.err
    assert "counter_bump" in replayed.out
    assert calls(count) == ["bump", "refuse"]  # replay and verify read the log: no call


async def test_a_redelivered_call_that_may_not_be_repeated_is_in_doubt_and_not_called_again(
        nats_server, topo, tmp_path: Path) -> None:
    """Delivery 1 of each job is taken and never answered (a worker that died mid-call); delivery 2 goes
    to a live worker: the repeatable `peek` is called, the non-repeatable `bump` is `in_doubt`."""
    path, count = bundle(tmp_path)
    tools = load_bundle(path).tools
    jobs = [ToolJob(run_id=f"r{i}", actor="clock", call_id=f"r{i}/1.0", tool=name, arguments={"note": name},
                    tool_digest=tools[name].content_hash)
            for i, name in enumerate(("counter_bump", "counter_peek"))]
    for job in jobs:
        await topo.publish(job.subject, job.encode(), headers=job.headers())
    psub = await topo.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
    taken: list[Any] = []
    with anyio.fail_after(10):
        while len(taken) < 2:
            taken += await fetch_batch(psub, 2 - len(taken), 2.0)
    await psub.unsubscribe()  # never acked: both come back after the AckWait
    async with running_worker(nats_server.url, [path]) as worker:
        outcomes = {o.tool: o for o in await collect_outcomes(topo, 2, bundle="clock")}
    bump, peek = outcomes["counter_bump"], outcomes["counter_peek"]
    assert bump.attempt == 2 and bump.result.error is not None and bump.result.error.kind == "in_doubt"
    assert "may or may not have happened" in bump.result.error.message
    assert peek.attempt == 2 and peek.result.error is None and peek.result.output == {"count": 1,
                                                                                       "note": "counter_peek"}
    assert calls(count) == ["peek"]  # the in-doubt call was not made again
    assert worker.registry.mcp.calls == 1


async def test_a_server_that_dies_or_hangs_is_a_failed_call_and_the_next_call_gets_a_new_one(
        tmp_path: Path) -> None:
    path, count = bundle(tmp_path)
    tools = load_bundle(path).tools
    die, bump, hang = (tools[n] for n in ("counter_die", "counter_bump", "counter_hang"))
    assert isinstance(die, McpTool) and isinstance(bump, McpTool) and isinstance(hang, McpTool)
    async with McpClients().running() as clients:
        first = await clients.call(bump, {"note": "a"}, deadline=None)
        died = await clients.call(die, {"note": "b"}, deadline=time.time() + 30)
        again = await clients.call(bump, {"note": "c"}, deadline=None)
        hung = await clients.call(hang, {"note": "d"}, deadline=time.time() + 2)
        after = await clients.call(bump, {"note": "e"}, deadline=None)
    assert first.output == {"count": 1, "note": "a"}, first
    assert died.error is not None and died.error.kind == "crashed", died
    assert "MCP server 'counter'" in died.error.message
    assert again.error is None and again.output["count"] == 3, again  # a new server process
    assert hung.error is not None and hung.error.kind == "timeout", hung  # held no longer than its deadline
    assert after.error is None, after  # the session serves other calls while one hangs
    assert calls(count) == ["bump", "die", "bump", "hang", "bump"]


async def test_a_server_answering_garbage_is_an_output_failure_and_its_session_goes_on(
        tmp_path: Path) -> None:
    from mcp_helpers import garbage_server

    path = tmp_path / "bundle.yaml"
    path.write_text("name: junk\nsystem_prompt: x\n"
                    "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
                    f"mcp:\n  junk:\n    command: {PYTHON}\n    args: [{garbage_server(tmp_path)}]\n")
    weird = load_bundle(path).tools["junk_weird"]
    assert isinstance(weird, McpTool)
    async with McpClients().running() as clients:
        shape = await clients.call(weird, {"kind": "shape"}, deadline=time.time() + 20)
        schema = await clients.call(weird, {"kind": "schema"}, deadline=time.time() + 20)
    assert shape.error is not None and shape.error.kind == "output", shape
    assert "MCP server 'junk'" in shape.error.message and shape.error.detail == "mcp_garbage"
    assert schema.error is not None and schema.error.kind == "output", schema  # the same session answered
