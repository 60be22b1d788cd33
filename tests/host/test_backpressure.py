"""Back-pressure: a flood of tasks does not flood a host. With `max_runs` = B the host holds at most B runs
and waiting tasks in memory (the rest wait in the TASKS stream, on disk), its task consumers hold at most B
un-acked, a worker holds at most 2 x its concurrency jobs, and every task still completes."""

from __future__ import annotations

import time

import anyio
import pytest
from host_helpers import hermes_call, hosts, running_worker, write_bundle

from runtime.nats.subjects import HDR_MSG_ID, TASKS, TOOLS, WORKERS_CONSUMER, task_consumer_name, task_subject
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio
FLOOD = 2000
BOUND = 20
CONCURRENCY = 8


@pytest.fixture
async def topo(js):
    await ensure_topology(js, partitions=4, tool_ack_wait=5.0)
    return js


def submit_at_once(body):  # the shortest run there is: one model call, one tool call, done
    return hermes_call("submit", {"answer": "ok"})


async def test_a_flood_of_tasks_keeps_the_host_within_its_bound_and_all_complete(nats_server, topo, tmp_path):
    js = topo
    bundle = write_bundle(tmp_path)
    samples: list[tuple[int, int, int, int, int]] = []
    with ScriptedModelServer(responder=submit_at_once, record=False) as server:
        async with hosts(nats_server.url, [bundle], server, 1, max_runs=BOUND) as (h,), \
                running_worker(nats_server.url, [bundle], concurrency=CONCURRENCY):
            host = h.host
            t0 = time.monotonic()
            pending = []
            for i in range(FLOOD):  # distinct agents: nothing but the bound keeps them from all starting
                pending.append(await js.publish_async(task_subject(f"calc:f{i}"),
                                                      f'{{"input": "go", "task_id": "f{i}"}}'.encode(),
                                                      headers={HDR_MSG_ID: f"f{i}"}))
                if len(pending) >= 256:
                    await anyio.sleep(0)
                    for fut in pending:
                        await fut
                    pending.clear()
            for fut in pending:
                await fut
            published = time.monotonic() - t0

            async def sample() -> None:
                while True:
                    held = sum(len(a.mailbox) + (a.current is not None) for a in host.actors.values())
                    acks = [(await js.consumer_info(TASKS, task_consumer_name(p, "calc"))).num_ack_pending
                            for p in range(4)]
                    tools = (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending
                    samples.append((host.budget.used, held, len(host.drivers), sum(acks), tools))
                    await anyio.sleep(0.05)

            with anyio.fail_after(240):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sample)
                    while sum(host.stats.runs_ended.values()) < FLOOD:
                        await anyio.sleep(0.1)
                    tg.cancel_scope.cancel()
            took = time.monotonic() - t0
            left = (await js.stream_info(TASKS)).state.messages
    print(f"\n{FLOOD} tasks published in {published:.1f}s, all ended after {took:.1f}s; "
          f"peak budget {host.budget.peak}, {len(samples)} samples")
    assert host.stats.runs_ended == {"completed": FLOOD} and left == 0
    assert host.budget.peak <= BOUND  # never more than the bound in memory...
    assert max(s[1] for s in samples) <= BOUND and max(s[2] for s in samples) <= BOUND
    assert max(s[3] for s in samples) <= BOUND  # ...nor un-acked on the server side
    assert max(s[4] for s in samples) <= 2 * CONCURRENCY  # a worker holds running + one buffer of jobs
    assert max(s[0] for s in samples) == BOUND  # and the bound was reached: the flood did push


async def test_a_small_budget_shared_by_many_partitions_serves_all_of_them(nats_server, js, tmp_path):
    """16 partitions share a budget of 32: an idle partition's open pull request may hold only its share,
    so the tasks of every other partition still flow (before, the first request reserved the whole
    budget for as long as it was open, re-reserved it first, and the other partitions' tasks never ran)."""
    await ensure_topology(js, partitions=16, tool_ack_wait=5.0)
    bundle = write_bundle(tmp_path)
    n = 48
    with ScriptedModelServer(responder=submit_at_once, record=False) as server:
        async with hosts(nats_server.url, [bundle], server, 1, max_runs=32) as (h,), \
                running_worker(nats_server.url, [bundle], concurrency=CONCURRENCY):
            host = h.host
            assert host.budget.sharers == 16 and host.budget.share == 2  # one task consumer per partition
            for i in range(n):
                await js.publish(task_subject(f"calc:s{i}"), f'{{"input": "go", "task_id": "s{i}"}}'.encode(),
                                 headers={HDR_MSG_ID: f"s{i}"})
            with anyio.fail_after(120):
                while sum(host.stats.runs_ended.values()) < n:
                    await anyio.sleep(0.1)
    assert host.stats.runs_ended == {"completed": n} and host.budget.peak <= 32


async def test_a_budget_grants_each_sharer_at_most_its_share():
    from runtime.nats.pull import Budget

    budget = Budget(10)
    for _ in range(4):
        budget.join()
    assert budget.share == 2
    assert await budget.reserve(256) == 2 and budget.used == 2  # not the whole budget
    budget.leave()
    budget.leave()
    assert budget.share == 5
    budget.expected_sharers = 10  # the first of ten consumers to come gets its tenth, not everything
    assert budget.share == 1
