"""Fault tests with real OS processes: `sa host` and `sa worker` subprocesses killed with SIGKILL, a
restarted host resuming a run without repeating recorded model calls, a killed worker's job redelivered
to another worker with its workspace write applied once and the dead delivery recorded in the run
(`tool.redelivered`), a thread's run resumed with its conversation after the same, and 100 agents
running concurrently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import Env, calc_responder, hermes_call, kinds, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime.client.replay import describe
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries, workspace_kv
from runtime.nats.subjects import (
    DEFAULT_TOOL_ACK_WAIT_S,
    LEASES_BUCKET,
    TOOLS,
    WORKERS_CONSUMER,
    parse_lease_key,
    partition_of,
)
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


@pytest.fixture
async def topo(js):
    await ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


@contextmanager
def process(args: list[str], url: str, log: Path, ready: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `sa` subprocess; returns once its log shows `ready`; SIGKILLed at exit if still alive."""
    out = open(log, "ab")
    proc = subprocess.Popen([*CLI, *args], env={**os.environ, "NATS_URL": url}, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        import time

        deadline = time.monotonic() + 60
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{args[0]} did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.02)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        out.close()


def kill9(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


async def test_kill_9_of_the_host_mid_run_resumes_without_repeating_recorded_model_calls(
        nats_server, topo, tmp_path: Path):
    js = topo
    with ScriptedModelServer(responder=calc_responder) as server:
        bundle = write_bundle(tmp_path, base_url=server.base_url)
        host_args = ["host", str(bundle), "--task-ack-wait", "2"]
        async with running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "chain: 3")
            seen: list[ev.Event] = []
            with process(host_args, nats_server.url, tmp_path / "host1.log", "sa host: serving") as host1:
                with anyio.fail_after(60):
                    async for e in RunLog(js).follow(run_id):
                        seen.append(e)
                        if isinstance(e, ev.ToolCalled) and e.call.id.endswith("/2.0"):
                            kill9(host1)  # mid-run: turn 2's job is out, its outcome has no host to go to
                            break
            requests_before = server.served
            with process(host_args, nats_server.url, tmp_path / "host2.log", "sa host: serving"):
                events = await Env(nats_server.url, js, None, server, []).wait_run(run_id)
            host2_log = (tmp_path / "host2.log").read_text()
        requests = server.requests

    assert "resumed 1 run(s)" in host2_log
    assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "chained 3"}
    assert [e.seq for e in events] == list(range(len(events)))  # one contiguous log, no fork
    # every model request is distinct: none recorded before the kill was made again
    bodies = [json.dumps(r["messages"], sort_keys=True) for r in requests]
    assert len(bodies) == len(set(bodies)) == 4 and requests_before == 2
    responded = [e.request_id for e in events if isinstance(e, ev.ModelResponded)]
    assert responded == [f"{run_id}/1", f"{run_id}/2", f"{run_id}/3", f"{run_id}/4"]
    # the job that was out during the kill ran once and was recorded once
    called = [e.call.id for e in events if isinstance(e, ev.ToolCalled)]
    completed = [e.call_id for e in events if isinstance(e, ev.ToolCompleted)]
    assert len(called) == len(set(called)) == 4 and sorted(completed) == sorted(called)


def served_as(log: Path) -> str:
    """The host id a `sa host` process announced in its ready line."""
    return log.read_text().split("sa host: serving", 1)[1].split(" as ", 1)[1].split(";", 1)[0]


async def test_kill_9_of_a_host_beside_hosts_of_another_bundle_its_bundles_other_host_takes_over(
        nats_server, topo, tmp_path: Path):
    """Two `sa host` processes serve `adder`, a third serves `xss`. The adder host that is killed mid-run has
    its partitions taken by the other adder host, never by the xss host, and every run finishes once."""
    js = topo
    with ScriptedModelServer(responder=calc_responder) as server:
        adder = write_bundle(tmp_path, "adder", base_url=server.base_url)
        xss = write_bundle(tmp_path, "xss", base_url=server.base_url)
        args = ["--task-ack-wait", "2"]
        logs = {name: tmp_path / f"{name}.log" for name in ("a1", "a2", "x")}
        url, ready = nats_server.url, "sa host: serving"
        async with running_worker(url, [adder, xss]):
            with process(["host", str(adder), *args], url, logs["a1"], ready) as a1, \
                    process(["host", str(adder), *args], url, logs["a2"], ready), \
                    process(["host", str(xss), *args], url, logs["x"], ready):
                ids = {name: served_as(log) for name, log in logs.items()}
                kv = await fleet_kv(js, LEASES_BUCKET)

                async def holders() -> dict[tuple[str, int], str]:
                    entries = await kv_entries(kv)
                    return {slot: e.value.decode() for k, e in entries.items()
                            if (slot := parse_lease_key(k)) is not None}

                with anyio.fail_after(30):  # both adder hosts hold their share
                    while sorted((await holders()).values()).count(ids["a1"]) != 2:
                        await anyio.sleep(0.05)
                theirs = {p for (b, p), h in (await holders()).items() if h == ids["a1"]}
                actors = [f"adder:k{i}" for i in range(40)]
                victims = [a for a in actors if partition_of(a, 4) in theirs][:4]
                others = [a for a in actors if partition_of(a, 4) not in theirs][:4]
                runs = [await publish_task(js, a, "chain: 3") for a in victims + others]
                xss_run = await publish_task(js, "xss:k0", "compute: 2 + 2")
                with anyio.fail_after(60):
                    async for e in RunLog(js).follow(runs[0]):
                        if isinstance(e, ev.ToolCalled):
                            kill9(a1)  # mid-run: its job is out, its outcome has no host to go to
                            break
                env = Env(nats_server.url, js, None, server, [])
                results = [await env.wait_run(r, timeout=90) for r in runs]
                xss_events = await env.wait_run(xss_run)
                after = await holders()
    for events in results:
        assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "chained 3"}
        assert [e.seq for e in events] == list(range(len(events)))  # one writer: no gap, no fork
        assert kinds(events).count("run.started") == 1
    assert kinds(xss_events)[-1] == "run.completed"
    assert {after[("adder", p)] for p in range(4)} == {ids["a2"]}
    assert {after[("xss", p)] for p in range(4)} == {ids["x"]}


def thread_responder(body: dict[str, Any]) -> str:
    """`steps: N` (the newest task of the thread) makes N calculator calls, one per turn, then submits an
    answer naming the task and how many messages came before it: what the run saw of its thread."""
    messages = body["messages"]
    newest = max(i for i, m in enumerate(messages)
                 if m["role"] == "user" and "<tool_response>" not in str(m["content"]))
    task = str(messages[newest]["content"])
    done = sum("<tool_response>" in str(m["content"]) for m in messages[newest + 1:])
    if done < int(task.split(":")[1]):
        return hermes_call("calculator", {"expression": f"{done} + 1"})
    return hermes_call("submit", {"answer": f"{task} after {newest} earlier messages"})


async def test_kill_9_of_the_host_mid_thread_run_resumes_it_with_its_conversation(
        nats_server, topo, tmp_path: Path):
    """A thread's second run, its host killed between two tool turns, is resumed by another host from the
    log alone: the conversation it continues comes from the first run by reference, no recorded model
    call is made again, and the thread's next run then continues from the resumed run's end."""
    js = topo
    with ScriptedModelServer(responder=thread_responder) as server:
        bundle = write_bundle(tmp_path, base_url=server.base_url)
        host_args = ["host", str(bundle), "--task-ack-wait", "2"]
        async with running_worker(nats_server.url, [bundle]):
            with process(host_args, nats_server.url, tmp_path / "host1.log", "sa host: serving") as host1:
                first = await publish_task(js, "calc", "steps: 1", task_id="thread-1", thread="th")
                one = await Env(nats_server.url, js, None, server, []).wait_run(first)
                second = await publish_task(js, "calc", "steps: 2", task_id="thread-2", thread="th")
                with anyio.fail_after(60):
                    async for e in RunLog(js).follow(second):
                        if isinstance(e, ev.ToolCalled) and e.call.id.endswith("/2.0"):
                            kill9(host1)  # turn 2's job is out; its outcome has no host to go to
                            break
            requests_before = server.served
            with process(host_args, nats_server.url, tmp_path / "host2.log", "sa host: serving"):
                two = await Env(nats_server.url, js, None, server, []).wait_run(second)
                third = await publish_task(js, "calc", "steps: 0", task_id="thread-3", thread="th")
                three = await Env(nats_server.url, js, None, server, []).wait_run(third)
            host2_log = (tmp_path / "host2.log").read_text()
        requests = server.requests

    assert "resumed 1 run(s)" in host2_log
    assert [kinds(r)[-1] for r in (one, two, three)] == ["run.completed"] * 3
    assert [e.seq for e in two] == list(range(len(two)))  # one contiguous log, no fork
    started = two[0]
    assert isinstance(started, ev.RunStarted) and started.thread == "th" and started.previous_run == first
    # the resumed run saw its thread: the same count of earlier messages as before the kill
    answers = [r[-1].output["answer"] for r in (one, two, three)]
    assert answers[0].startswith("steps: 1 after ")
    earlier = int(answers[1].split(" after ")[1].split()[0])
    assert answers[1] == f"steps: 2 after {earlier} earlier messages" and earlier > 2
    assert int(answers[2].split(" after ")[1].split()[0]) > earlier  # run 3 continued from run 2's end
    # every request of the second run carried the first run's task; none was made twice
    second_requests = [r for r in requests if any(m["content"] == "steps: 2" for m in r["messages"])
                       and not any(m["content"] == "steps: 0" for m in r["messages"])]
    assert len(second_requests) == 3 and requests_before == 2 + 2  # run 1: 2 calls; run 2: 2 before the kill
    assert all(any(m["content"] == "steps: 1" for m in r["messages"]) for r in second_requests)
    bodies = [json.dumps(r["messages"], sort_keys=True) for r in requests]
    assert len(bodies) == len(set(bodies))
    called = [e.call.id for e in two if isinstance(e, ev.ToolCalled)]
    completed = [e.call_id for e in two if isinstance(e, ev.ToolCompleted)]
    assert len(called) == len(set(called)) == 3 and sorted(completed) == sorted(called)


async def test_kill_9_of_a_worker_mid_job_the_run_completes_and_the_write_happens_once(
        nats_server, topo, tmp_path: Path):
    js = topo
    with ScriptedModelServer(responder=calc_responder) as server:
        bundle = write_bundle(tmp_path, "notes", tools=("note",), base_url=server.base_url,
                              extra="limits: {max_duration: 60s}\ndata_provider: workspace\nworkspace: wsk\n")
        async with running_host(nats_server.url, [bundle], server):
            worker_args = ["worker", "--bundle", str(bundle), "--concurrency", "2"]
            with process(worker_args, nats_server.url, tmp_path / "w1.log", "serving") as w1:
                w1_pid = w1.pid
                run_id = await publish_task(js, "notes", "note: hello|spin=25000000")
                with anyio.fail_after(30):  # wait until the worker holds the job
                    while (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending < 1:
                        await anyio.sleep(0.02)
                kill9(w1)
            with process(worker_args, nats_server.url, tmp_path / "w2.log", "serving") as w2:
                w2_pid = w2.pid
                events = await Env(nats_server.url, js, None, server, []).wait_run(run_id, timeout=90)
    # the killed worker had set the consumer's AckWait to the default: its job moved on that long after the
    # worker's last heartbeat, however long the tool's max duration (60 s here)
    assert (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).config.ack_wait == DEFAULT_TOOL_ACK_WAIT_S
    assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "1"}
    kv = await workspace_kv(js, "wsk")
    entry = await kv.get("log.txt")
    assert entry.value == b"hello\n"
    history = await kv.history("log.txt")
    assert len(history) == 1  # written exactly once
    notes = [e for e in events if isinstance(e, ev.ToolRedelivered | ev.ToolCompleted) and e.tool == "note"]
    # one outcome recorded, from the 2nd worker, preceded by the record of the dead first delivery
    assert kinds(notes) == ["tool.redelivered", "tool.completed"]
    redelivered, done = notes
    assert done.seq == redelivered.seq + 1 and done.script is not None  # its script run rides in it
    started = ev.expand(done)[0]
    assert isinstance(started, ev.ScriptStarted)
    assert started.worker.endswith(":" + str(w2_pid)) and not started.worker.endswith(":" + str(w1_pid))
    assert redelivered.attempt == 2 and redelivered.worker == started.worker
    (why,) = redelivered.earlier
    assert why.startswith("delivery 1 was not acknowledged: its worker stopped heartbeating"), why
    assert "attempt 2" in describe(redelivered) and "stopped heartbeating" in describe(redelivered)


async def test_a_hundred_agents_each_run_a_task_concurrently(nats_server, topo, tmp_path: Path):
    js = topo
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle], concurrency=16):
            peak = 0

            def watch(_: ev.Event) -> None:
                nonlocal peak
                peak = max(peak, len(host.drivers))

            host.on_event = watch
            runs = {}
            for i in range(100):
                runs[i] = await publish_task(js, f"calc:a{i}", f"compute: {i} * 2")
            env = Env(nats_server.url, js, host, server, [])
            results: dict[int, list[ev.Event]] = {}

            async def wait(i: int) -> None:
                results[i] = await env.wait_run(runs[i], timeout=120)

            async with anyio.create_task_group() as tg:
                for i in runs:
                    tg.start_soon(wait, i)
            # idle agents cost nothing: no actor, driver or waiting task once the last runs' actors let go
            # (after their index entries), and no conversation remembered for runs in no thread (the issue's
            # 100,000-agent RSS figure is bench/scale.py's)
            with anyio.fail_after(10):
                while host.actors or host.drivers or host.waiting:
                    await anyio.sleep(0.02)
            assert len(host.conversations) == 0
    assert len(results) == 100
    for i, events in results.items():
        assert kinds(events)[-1] == "run.completed", (i, kinds(events))
        assert events[-1].output == {"answer": str(i * 2)} and events[0].actor == f"calc:a{i}"
    assert peak > 1  # the agents' runs overlapped: actors run concurrently
    assert not host.actors  # idle actors hold nothing
    log = await RunLog(js).read(runs[7])
    assert kinds(log.events) == kinds(results[7])
