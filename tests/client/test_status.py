"""`sa status`: hosts and their partitions, workers, queue depths and runs in flight, read from NATS alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from host_helpers import Env, calc_responder, hosts, running_worker, wait_until, write_bundle
from rich.console import Console

from runtime import nats as bus
from runtime.client.status import gather, render
from runtime.commands import publish_task
from runtime.nats.subjects import TASKS, partition_of
from runtime.nats.topology import ensure_partition_consumers
from runtime.testing import Reply, ScriptedModelServer

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


async def test_status_shows_hosts_partitions_workers_queues_and_runs_in_flight(nats_server, topo, tmp_path):
    js = topo
    bundle = write_bundle(tmp_path)

    def held(body):  # the first model call of every run waits, so runs stay in flight while we look
        if "<tool_response>" not in json.dumps(body["messages"]):
            return Reply.of_text(calc_responder(body), delay=2.0)
        return calc_responder(body)

    with ScriptedModelServer(responder=held) as server:
        async with hosts(nats_server.url, [bundle], server, 2) as (a, b), \
                running_worker(nats_server.url, [bundle], concurrency=3):
            await wait_until(lambda: len(a.host.partitions) == len(b.host.partitions) == 2)
            runs = [await publish_task(js, f"calc:s{i}", f"compute: {i} + 1") for i in range(6)]
            await wait_until(lambda: len(a.host.drivers) + len(b.host.drivers) == 6)
            with anyio.fail_after(10):  # the worker's first heartbeat
                while not (status := await gather(js))["workers"]:
                    await anyio.sleep(0.1)
            cli = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [*CLI, "status", "--json"], env={**os.environ, "NATS_URL": nats_server.url},
                capture_output=True, text=True, timeout=60))
            env = Env(nats_server.url, js, None, server, [])
            for r in runs:
                await env.wait_run(r)
            with anyio.fail_after(10):  # a run's `active` entry goes just after its ending is in the log
                while (after := await gather(js))["runs_in_flight"]:
                    await anyio.sleep(0.05)
            served = {a.host.id: a.host.partitions, b.host.id: b.host.partitions}
    assert status["partitions_total"] == 4 and status["unserved_partitions"] == []
    assert {h["id"]: h["partitions"] for h in status["hosts"]} == served
    assert {p["partition"]: p["host"] for p in status["partitions"]} == \
        {p: host for host, ps in served.items() for p in ps}
    assert status["runs_in_flight"] == 6 and sum(h["runs"] for h in status["hosts"]) in range(0, 7)
    assert sum(p["runs_in_flight"] for p in status["partitions"]) == 6
    (worker,) = status["workers"]
    assert worker["concurrency"] == 3 and "calculator" in worker["tools"]
    assert set(status["queues"]) >= {"tasks_pending", "tool_jobs_pending", "results_pending", "dlq"}
    assert after["runs_in_flight"] == 0  # ended runs leave the `active` bucket
    assert cli.returncode == 0, cli.stderr
    shown = json.loads(cli.stdout)
    assert shown["partitions_total"] == 4 and len(shown["hosts"]) == 2 and len(shown["workers"]) == 1
    console = Console(record=True, width=140)
    console.print(render(status))
    text = console.export_text()
    for word in ("hosts", "partitions", "workers", "queues", a.host.id, "runs in flight", "dead letters"):
        assert word in text


async def test_status_marks_unserved_partitions_and_counts_waiting_tasks(nats_server, topo):
    js = topo
    agents = [f"calc:w{i}" for i in range(5)]
    for agent in agents:
        await publish_task(js, agent, "compute: 1")  # no host: they wait in the stream
    per_partition = [sum(partition_of(a, 4) == p for a in agents) for p in range(4)]
    status = await gather(js)
    assert status["hosts"] == [] and status["unserved_partitions"] == [0, 1, 2, 3]
    assert status["queues"]["stream_messages"][TASKS] == 5 and status["runs_in_flight"] == 0
    # no partition has a consumer yet: every task in the stream is waiting, none is held
    assert status["queues"]["tasks_pending"] == 5 and status["queues"]["tasks_held"] == 0
    assert [p["tasks_pending"] for p in status["partitions"]] == per_partition

    # a consumer on one partition that delivered one task (not acknowledged): that one is held, not waiting
    busy = next(p for p in range(4) if per_partition[p] >= 1)
    name, _ = await ensure_partition_consumers(js, busy, "calc")
    sub = await js.pull_subscribe_bind(name, stream=TASKS)
    (msg,) = await sub.fetch(1, timeout=5)
    status = await gather(js)
    row = status["partitions"][busy]
    assert (row["tasks_pending"], row["tasks_held"]) == (per_partition[busy] - 1, 1)
    assert status["queues"]["tasks_pending"] == 4 and status["queues"]["tasks_held"] == 1
    await msg.ack()
    await sub.unsubscribe()


async def test_status_shows_each_hosts_bundles_and_the_tasks_no_host_serves(nats_server, topo, tmp_path):
    """Hosts serving different bundles each hold every partition of their own bundle; a task for an agent no
    host serves waits, and status says for which agent."""
    js = topo
    adder, xss = write_bundle(tmp_path, "adder"), write_bundle(tmp_path, "xss")
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [adder], server, 1, unserved_after=3600.0) as (a,), \
                hosts(nats_server.url, [xss], server, 1, unserved_after=3600.0) as (x,):
            await wait_until(lambda: len(a.host.slots) == len(x.host.slots) == 4)
            await publish_task(js, "ghost:1", "compute: 1")
            status = await gather(js)
    by_id = {h["id"]: h for h in status["hosts"]}
    assert by_id[a.host.id]["leases"] == {"adder": [0, 1, 2, 3]} and by_id[a.host.id]["agents"] == ["adder"]
    assert by_id[x.host.id]["leases"] == {"xss": [0, 1, 2, 3]}
    assert by_id[x.host.id]["partitions"] == [0, 1, 2, 3]
    assert status["unserved_partitions"] == []
    assert [p["hosts"] for p in status["partitions"]] == [{"adder": a.host.id, "xss": x.host.id}] * 4
    assert status["unserved_agents"] == {"ghost": 1}
    ghost = partition_of("ghost:1", 4)
    assert [p["tasks_pending"] for p in status["partitions"]] == [int(p == ghost) for p in range(4)]
    console = Console(record=True, width=200)
    console.print(render(status))
    text = console.export_text()
    assert f"adder: {a.host.id}; xss: {x.host.id}" in text and "ghost: 1" in text


def test_status_without_a_server_says_what_to_do(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env["XDG_DATA_HOME"] = str(tmp_path)  # no `sa up` state file either
    out = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "NATS_URL" in out.stderr


def test_status_on_a_server_without_streams_says_to_start_a_host(tmp_path):
    """It printed the raw `NotFoundError: ... stream not found`."""
    from runtime.nats.server import EmbeddedNats

    server = EmbeddedNats().start()  # a server of its own: no streams at all
    url = server.url
    try:
        env = {**os.environ, "NATS_URL": url, "XDG_DATA_HOME": str(tmp_path)}
        out = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (f"sa status: no structured-agents streams on {url}: start a host "
                                  "(`sa host BUNDLE` or `sa up`)")
