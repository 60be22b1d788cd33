"""Tool workers against a real nats-server and real Monty: outcomes, failures as values, dead letters,
workspace writes exactly once, two worker processes sharing the consumer, and `kill -9` mid-job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from runtime import events
from runtime.jobs import ToolJob, ToolOutcome
from runtime.nats.kv import workspace_kv
from runtime.nats.pull import fetch_batch
from runtime.nats.subjects import DLQ, RESULTS, TOOLS, WORKERS_CONSUMER, dlq_subject, tool_subject
from runtime.nats.topology import ensure_partition_consumers, ensure_topology
from runtime.worker import Worker, build_registry
from runtime.worker.attempts import (
    JobHeartbeats,
    consumer_ack_wait,
    explain,
    heartbeat_period,
    record_end,
    sync_ack_wait,
)

pytestmark = pytest.mark.anyio

ECHO = '''\
"""Echo the text back, loudly."""
from grail import Input

text: str = Input("text")

print("echoing", text)
{"echo": text.upper()}
'''

BUSY = '''\
"""Spin n times, then write the total to /data/<name>.txt."""
from grail import Input

n: int = Input("n")
name: str = Input("name", default="out")

total = 0
for i in range(n):
    total += i
{"writes": [{"path": "/data/" + name + ".txt", "content": str(total)}], "total": total}
'''

ADD = '''\
"""Append a line to /data/log.txt."""
from grail import Input

line: str = Input("line")

old = ""
try:
    old = open("/data/log.txt").read()
except FileNotFoundError:
    old = ""
new = old + line + "\\n"
{"writes": [{"path": "/data/log.txt", "content": new}], "lines": len(new.splitlines())}
'''


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tools"
    d.mkdir()
    for name, src in {"echo.pym": ECHO, "busy.pym": BUSY, "add_line.pym": ADD}.items():
        (d / name).write_text(src)
    return d


def job(call: str, tool: str, args: dict, **kw) -> ToolJob:
    run = kw.pop("run", "r1")
    return ToolJob(run_id=run, actor="a", call_id=f"{run}/{call}", tool=tool, arguments=args, **kw)


async def collect_outcomes(js, n: int, partition: int = 0, timeout: float = 30.0,
                           bundle: str = "a") -> list[ToolOutcome]:
    """Read `n` outcomes from RESULTS (through the consumer of the bundle's partition, as its host will)."""
    _, rcons = await ensure_partition_consumers(js, partition, bundle)
    psub = await js.pull_subscribe_bind(durable=rcons, stream=RESULTS)
    out: list[ToolOutcome] = []
    with anyio.fail_after(timeout):
        while len(out) < n:
            for m in await fetch_batch(psub, n - len(out), 0.5):
                out.append(ToolOutcome.decode(m.data))
                await m.ack()
    await psub.unsubscribe()
    return out


async def run_worker_until(js, registry, n: int, bundle: str = "a", **kw) -> tuple[Worker, list[ToolOutcome]]:
    worker = Worker(js, registry, **kw)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, stop)
        outcomes = await collect_outcomes(js, n, bundle=bundle)
        stop.set()
    return worker, outcomes


async def test_outcomes_carry_results_and_script_notes(js, tools_dir: Path) -> None:
    await ensure_topology(js, partitions=4)
    reg = build_registry(tool_globs=[str(tools_dir / "*.pym")])
    assert {"echo", "busy", "add_line"} <= set(reg.tools)
    for i in range(5):
        j = job(f"1.{i}", "echo", {"text": f"hi{i}"})
        await js.publish(j.subject, j.encode(), headers=j.headers())
    worker, outcomes = await run_worker_until(js, reg, 5, concurrency=3)
    by_call = {o.call_id: o for o in outcomes}
    assert sorted(by_call) == [f"r1/1.{i}" for i in range(5)]
    o = by_call["r1/1.3"]
    assert o.result.output == {"echo": "HI3"} and o.worker == worker.name and o.attempt == 1
    (recorded,) = o.events()  # one append: the outcome carries its script run
    assert isinstance(recorded, events.ToolCompleted) and recorded.seq == events.UNSTAMPED  # the log numbers
    evs = events.expand(recorded)
    assert [events.kind_of(e) for e in evs] == ["script.started", "script.printed", "script.completed",
                                                "tool.completed"]
    assert [e.ts for e in evs] == sorted(e.ts for e in evs) and evs[0].ts > 0  # the worker's own times
    assert evs[0].worker == worker.name
    assert evs[1].text.strip() == "echoing hi3" and evs[-1].output == {"echo": "HI3"}
    assert worker.stats.completed == 5 and worker.stats.failed == 0
    assert (await js.stream_info(TOOLS)).state.messages == 0  # all acked


async def test_failures_are_values_and_the_worker_keeps_serving(js, tools_dir: Path) -> None:
    await ensure_topology(js)
    reg = build_registry(tool_globs=[str(tools_dir / "*.pym")])
    jobs = [
        job("1.0", "nope", {}),  # unknown tool
        job("1.1", "echo", {"txt": "x"}),  # bad arguments
        job("1.2", "busy", {"n": 10**9}, limits={"max_duration": 0.2}),  # the job's limits apply
        job("1.3", "echo", {"text": "late"}, deadline=time.time() - 1),  # deadline passed
        job("1.4", "echo", {"text": "fine"}),
    ]
    for j in jobs:
        await js.publish(j.subject, j.encode(), headers=j.headers())
    await js.publish(tool_subject("echo"), b"\x00not msgpack")  # malformed: dead-lettered
    worker, outcomes = await run_worker_until(js, reg, 5)
    err = {o.call_id: o.result.error for o in outcomes}
    # an unknown tool is the caller's mistake: kind `input`, as the kernel says (test_kernel.py)
    assert (err["r1/1.0"].kind, err["r1/1.0"].detail) == ("input", "unknown_tool")
    assert "echo" in err["r1/1.0"].message
    assert err["r1/1.1"].kind == "input"
    assert (err["r1/1.2"].kind, err["r1/1.2"].detail) == ("limit", "duration")
    assert err["r1/1.3"].kind == "timeout"
    assert err["r1/1.4"] is None
    failed = next(o for o in outcomes if o.call_id == "r1/1.2").events()
    assert events.kind_of(failed[-1]) == "tool.failed" and failed[-1].error.detail == "duration"
    assert worker.stats.dead_lettered == 1
    dlq = await js.get_last_msg(DLQ, dlq_subject(tool_subject("echo")))
    assert dlq.data == b"\x00not msgpack" and "not a tool job" in dlq.headers["Sa-Reason"]
    assert (await js.stream_info(TOOLS)).state.messages == 0


async def test_workspace_writes_are_applied_in_order(js, tools_dir: Path) -> None:
    await ensure_topology(js)
    reg = build_registry(tool_globs=[str(tools_dir / "add_line.pym")])
    for i in range(4):
        j = job(f"{i}.0", "add_line", {"line": f"l{i}"}, workspace="w1")
        await js.publish(j.subject, j.encode(), headers=j.headers())
    _, outcomes = await run_worker_until(js, reg, 4, concurrency=4)  # concurrent: conflicts re-run
    assert all(o.result.error is None and o.writes == 1 for o in outcomes), [o.result for o in outcomes]
    kv = await workspace_kv(js, "w1")
    lines = (await kv.get("log.txt")).value.decode().splitlines()
    assert sorted(lines) == ["l0", "l1", "l2", "l3"]  # no lost update despite 4 concurrent writers
    assert sorted(o.result.output["lines"] for o in outcomes) == [1, 2, 3, 4]


def start_worker(url: str, tools: str, log: Path, concurrency: int = 4) -> subprocess.Popen:
    env = {**os.environ, "NATS_URL": url}
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--tools", tools,
           "--concurrency", str(concurrency)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    deadline = time.monotonic() + 20
    while b"serving" not in log.read_bytes():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "worker did not start"
        time.sleep(0.02)
    return proc


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(20)


async def test_two_worker_processes_share_the_consumer(js, nats_server, tools_dir: Path,
                                                       tmp_path: Path) -> None:
    await ensure_topology(js)
    glob = str(tools_dir / "*.pym")
    procs = [start_worker(nats_server.url, glob, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        for i in range(60):
            j = job(f"{i}.0", "busy", {"n": 20_000, "name": f"f{i}"})
            await js.publish(j.subject, j.encode(), headers=j.headers())
        outcomes = await collect_outcomes(js, 60)
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0, 0]  # SIGTERM: a clean stop
    assert sorted(o.call_id for o in outcomes) == sorted(f"r1/{i}.0" for i in range(60))
    workers = {o.worker for o in outcomes}
    assert len(workers) == 2, workers  # both processes took jobs
    assert all(o.result.error is None for o in outcomes)


async def test_kill_9_mid_job_redelivers_and_writes_once(js, nats_server, tools_dir: Path,
                                                         tmp_path: Path) -> None:
    await ensure_topology(js, tool_ack_wait=2.0)
    first = start_worker(nats_server.url, str(tools_dir / "busy.pym"), tmp_path / "a.log")
    j = job("1.0", "busy", {"n": 30_000_000, "name": "slow"}, workspace="wk", limits={"max_duration": 30})
    await js.publish(j.subject, j.encode(), headers=j.headers())
    with anyio.fail_after(20):  # wait until the first worker holds the job
        while (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending != 1:
            await anyio.sleep(0.02)
    await anyio.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    second = start_worker(nats_server.url, str(tools_dir / "busy.pym"), tmp_path / "b.log")
    try:
        (outcome,) = await collect_outcomes(js, 1, timeout=60)
    finally:
        assert stop(second) == 0
    assert outcome.result.error is None and outcome.attempt == 2 and outcome.writes == 1
    (why,) = outcome.earlier  # the dead delivery, explained in the outcome (the host records it)
    assert why.startswith("delivery 1 was not acknowledged: its worker stopped heartbeating"), why
    info = await js.stream_info("KV_ws_wk", subjects_filter=">")
    assert info.state.subjects == {"$KV.ws_wk.slow.txt": 1}  # the write happened exactly once
    assert (await js.stream_info(TOOLS)).state.messages == 0


async def test_bundle_tools_carry_their_limits_and_output_models(js, tools_dir: Path, tmp_path: Path) -> None:
    await ensure_topology(js)
    (tmp_path / "bundle.yaml").write_text(
        "name: a\n"
        "tools:\n"
        "  - path: tools/busy.pym\n"
        "    limits: {max_duration: 200ms}\n"
        "  - path: tools/echo.pym\n"
        "    output_model: {type: object, properties: {echo: {type: integer}}, required: [echo]}\n")
    reg = build_registry(bundles=[tmp_path])
    assert set(reg.tools) == {"busy", "echo"}
    (busy,) = reg.tools["busy"]
    assert busy.limits.max_duration == 0.2  # the registry holds the bundle's tool objects
    for j in (job("1.0", "busy", {"n": 10**9}), job("1.1", "echo", {"text": "x"})):
        await js.publish(j.subject, j.encode(), headers=j.headers())
    _, outcomes = await run_worker_until(js, reg, 2)
    err = {o.call_id: o.result.error for o in outcomes}
    assert (err["r1/1.0"].kind, err["r1/1.0"].detail) == ("limit", "duration")  # the bundle's per-tool limit
    assert err["r1/1.1"].kind == "output" and "echo" in err["r1/1.1"].message  # the bundle's output model


async def _one_job(js, registry, j: ToolJob) -> ToolOutcome:
    await js.publish(j.subject, j.encode(), headers=j.headers())
    _, (outcome,) = await run_worker_until(js, registry, 1, bundle=j.actor.partition(":")[0])
    return outcome


async def test_workspace_scripts_list_what_add_wrote_under_data(js) -> None:
    """The shipped agents/workspace scripts through the real worker path and the WorkspaceKV provider."""
    await ensure_topology(js)
    agents = Path(__file__).parents[2] / "agents" / "workspace"
    reg = build_registry(tool_globs=[str(agents / "*.pym")])
    added = await _one_job(js, reg, job("1.0", "add_entry", {"title": "Buy milk", "content": "two litres"},
                                        workspace="home"))
    assert added.result.error is None and added.writes == 1
    kv = await workspace_kv(js, "home")
    assert (await kv.get("notes/buy-milk.md")).value == b"# Buy milk\n\ntwo litres\n"
    listed = await _one_job(js, reg, job("2.0", "list_entries", {}, workspace="home"))
    assert listed.result.output["total"] == 1
    (entry,) = listed.result.output["entries"]
    assert (entry["name"], entry["title"]) == ("buy-milk.md", "Buy milk") and "two litres" in entry["preview"]
    again = await _one_job(js, reg, job("3.0", "add_entry", {"title": "buy milk!", "content": "x"},
                                        workspace="home"))
    assert again.result.error is not None and "already exists" in again.result.error.message
    assert again.writes == 0



async def test_an_instance_of_a_bundle_gets_the_bundle_static_data(js, tmp_path: Path) -> None:
    await ensure_topology(js)
    (tmp_path / "read.pym").write_text('"""Read a fact."""\n{"fact": open("/data/fact.txt").read()}\n')
    (tmp_path / "bundle.yaml").write_text(
        "name: facts\ntools: [read.pym]\ndata_provider: {type: static, files: {/data/fact.txt: wet}}\n")
    reg = build_registry(bundles=[tmp_path])
    for n, agent in enumerate(["facts", "facts:alice"]):
        j = ToolJob(run_id="r1", actor=agent, call_id=f"r1/{n}.0", tool="read", arguments={})
        outcome = await _one_job(js, reg, j)
        assert outcome.result.output == {"fact": "wet"}, (agent, outcome.result)


async def test_a_given_back_delivery_is_explained_by_its_reason_a_silent_one_by_missed_heartbeats(js) -> None:
    await ensure_topology(js)
    assert await explain(js, "r9/1.0", 1, 3.0) == ()  # a first delivery: nothing to explain, nothing read
    await record_end(js, "r9/1.0", 2, "w-a", "its data files could not be loaded (timeout)")
    first, second, third = await explain(js, "r9/1.0", 4, 3.0)
    assert first.startswith("delivery 1 was not acknowledged: its worker stopped heartbeating")
    assert second == "delivery 2 was given back by worker w-a: its data files could not be loaded (timeout)"
    assert third.startswith("delivery 3 was not acknowledged") and "3 s after its last heartbeat" in third


async def test_a_worker_gives_the_consumer_its_ack_wait_and_one_started_before_follows_a_change(js) -> None:
    await ensure_topology(js, tool_ack_wait=30.0)  # a consumer made with the former default
    assert await sync_ack_wait(js, 3.0) == 3.0
    assert (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).config.ack_wait == 3.0
    beats = JobHeartbeats(30.0)
    beats.set_ack_wait(await consumer_ack_wait(js))
    assert (beats.ack_wait, beats.period) == (3.0, heartbeat_period(3.0)) and beats.period < 3.0 / 2

