"""The model endpoint's fleet-wide share, on a real nats-server with in-process hosts and the scripted model
over real HTTP, made full by a `Capacity` (429 with Retry-After beyond its limit).

What is proved, by counts and orders, never by elapsed time:
* the limit holds across hosts: two hosts, one server counting the requests it holds at once, peak <= limit;
* a dead host's permits come back: a host killed while holding the only permit, its run still completes
  on the other host;
* priorities: with the limit saturated, a high-priority task's request reaches the server before the
  low-priority ones queued ahead of it;
* Retry-After is honoured and recorded: the run's log shows `model.throttled` with the server's wait, the
  call is not counted again, and `replay --verify` passes;
* budgets: a run over its token budget, and an agent over its daily one, fail `budget_exceeded` naming it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from host_helpers import calc_responder, hosts, kinds, running_fleet, wait_until, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import load_bundle
from runtime.client.verify import verify
from runtime.commands import publish_task
from runtime.host.endpoint import PERMITS, FleetTokens
from runtime.host.leases import LeaseConfig
from runtime.log import RunLog
from runtime.model.limits import endpoint_key
from runtime.testing import Capacity, Reply, ScriptedModelServer, last_message

pytestmark = pytest.mark.anyio
FAST = LeaseConfig(ttl=2.0, renew=0.5)


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


def text_reply(delay: float = 0.0):
    """A plain answer, the same for every request: a run is one model call (its bundle has no terminal
    tool: `write_bundle(..., terminal=None)`)."""
    def reply(body):
        return Reply.of_text(f"done: {last_message(body, 'user')}", delay=delay)
    return reply


async def ended(js, run_ids: list[str], timeout: float = 60.0) -> dict[str, list[ev.Event]]:
    """Each run's events up to its end, followed concurrently."""
    out: dict[str, list[ev.Event]] = {}

    async def follow(run_id: str) -> None:
        events = []
        async for e in RunLog(js).follow(run_id):
            events.append(e)
        out[run_id] = events

    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(follow, run_id)
    return out


async def waiting_pulls(js, server: ScriptedModelServer) -> int:
    """Permit requests waiting at the server: one per model call queued anywhere in the fleet."""
    info = await js.consumer_info(PERMITS, endpoint_key(server.base_url, "scripted"))
    return info.num_waiting or 0


async def test_the_endpoint_limit_holds_across_two_hosts(nats_server, topo, tmp_path: Path):
    bundle = write_bundle(tmp_path, extra="endpoint: {max_in_flight: 3}\n", terminal=None)
    capacity = Capacity(3, retry_after=0.2)
    with ScriptedModelServer(responder=text_reply(delay=0.05), capacity=capacity) as server:
        async with hosts(nats_server.url, [bundle], server, 2, lease=FAST) as (a, b):
            await wait_until(lambda: bool(a.host.partitions and b.host.partitions), what="both hosts serve")
            runs = [await publish_task(topo, f"calc:u{i}", f"task {i}", task_id=f"t{i}") for i in range(24)]
            logs = await ended(topo, runs)
            started = (a.host.stats.runs_started, b.host.stats.runs_started)
    assert all(kinds(events)[-1] == "run.completed" for events in logs.values())
    assert capacity.peak <= 3 and capacity.refused == 0 and capacity.admitted == 24
    assert all(n > 0 for n in started), started  # both hosts called the model, sharing the 3 permits


async def test_a_dead_hosts_permit_comes_back(nats_server, topo, tmp_path: Path):
    """The host holding the only permit dies mid-call (its connection cut: nothing handed back); the other
    host takes the run over, gets the permit once the dead host's lease on it lapses, and completes it."""
    bundle = write_bundle(tmp_path, extra="endpoint: {max_in_flight: 1}\n", terminal=None)
    hold = threading.Event()

    def reply(body):
        hold.wait(30)  # the first request is held until its host is dead
        return Reply.of_text("done")

    capacity = Capacity(1)
    with ScriptedModelServer(responder=reply, capacity=capacity) as server:
        async with hosts(nats_server.url, [bundle], server, 2, lease=FAST, permit_lease=2.0) as handles:
            await wait_until(lambda: all(h.host.partitions for h in handles), what="both hosts serve")
            run_id = await publish_task(topo, "calc", "hold on", task_id="held")
            await wait_until(lambda: server.served == 1, what="the first request reached the server")
            dead = next(h for h in handles if run_id in h.host.drivers)
            survivor = next(h for h in handles if h is not dead)
            await dead.crash()
            hold.set()
            logs = await ended(topo, [run_id])
            recovered = survivor.host.stats.runs_recovered
    assert kinds(logs[run_id])[-1] == "run.completed" and recovered == 1
    assert server.served == 2 and capacity.refused == 0  # the dead host's request, then the survivor's


async def test_a_high_priority_call_overtakes_the_queued_low_ones(nats_server, topo, tmp_path: Path):
    """One permit, held by a first low-priority call; three more low ones queue, then one high: when the
    permit comes back the high one's request is the next the server sees, then the low ones."""
    bundle = write_bundle(tmp_path, extra="endpoint: {max_in_flight: 1}\n", terminal=None)
    hold = threading.Event()

    def reply(body):
        if last_message(body, "user") == "first":
            hold.wait(30)
        return Reply.of_text("done")

    with ScriptedModelServer(responder=reply, capacity=Capacity(1)) as server:
        async with hosts(nats_server.url, [bundle], server, 2, lease=FAST) as (a, b):
            await wait_until(lambda: bool(a.host.partitions and b.host.partitions), what="both hosts serve")
            runs = [await publish_task(topo, "calc:first", "first", task_id="first", priority=1)]
            await wait_until(lambda: server.served == 1, what="the first call holds the permit")
            for i in range(3):
                runs.append(await publish_task(topo, f"calc:low{i}", f"low {i}", task_id=f"low{i}",
                                               priority=1))
            with anyio.fail_after(20):
                while await waiting_pulls(topo, server) < 3:
                    await anyio.sleep(0.05)
            runs.append(await publish_task(topo, "calc:high", "high", task_id="high", priority=9))
            with anyio.fail_after(20):
                while await waiting_pulls(topo, server) < 4:
                    await anyio.sleep(0.05)
            hold.set()
            logs = await ended(topo, runs)
    order = [last_message(body, "user") for body in server.requests]
    assert order[:2] == ["first", "high"], order
    assert sorted(order[2:]) == ["low 0", "low 1", "low 2"]
    started = next(e for e in logs[runs[-1]] if isinstance(e, ev.RunStarted))
    assert started.priority == 9


async def test_retry_after_is_honoured_and_recorded(nats_server, topo, tmp_path: Path):
    bundle = write_bundle(tmp_path, extra="endpoint: {retry_after_max: 5s}\n", terminal=None)
    replies = [Reply.error(429, "full", retry_after=0.3)]
    async with running_fleet(nats_server.url, topo, bundle, replies=replies, responder=text_reply(),
                             worker=False) as env:
        run_id = await publish_task(topo, "calc", "hello", task_id="t")
        events = await env.wait_run(run_id)
    assert kinds(events) == ["run.started", "model.requested", "model.throttled", "model.responded",
                             "turn.completed", "run.completed"]
    throttled = events[2]
    assert isinstance(throttled, ev.ModelThrottled)
    assert throttled.status == 429 and throttled.retry_after == pytest.approx(0.3)
    assert 0.3 <= throttled.wait_s <= 0.3 * 1.2 and throttled.attempt == 1
    responded = events[3]
    assert isinstance(responded, ev.ModelResponded) and responded.request_id == throttled.request_id
    report = verify(load_bundle(bundle).kernel_config(), events)
    assert report.ok, report.problems
    assert report.inputs == 2  # the throttle and the reply: inputs, and one model call


def usage_of(responder, prompt: int = 20, completion: int = 5):
    """`responder`'s replies with fixed token counts (25 per call)."""
    def reply(body):
        return Reply.of_text(responder(body), prompt_tokens=prompt, completion_tokens=completion)
    return reply


async def test_a_run_over_its_token_budget_fails_naming_it(nats_server, topo, tmp_path: Path):
    bundle = write_bundle(tmp_path, extra="budgets: {run_tokens: 40}\n")
    async with running_fleet(nats_server.url, topo, bundle, responder=usage_of(calc_responder)) as env:
        run_id = await publish_task(topo, "calc", "chain: 3", task_id="t")
        events = await env.wait_run(run_id)
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed) and failed.reason == "budget_exceeded"
    assert "the run's token budget of 40 is spent (50 tokens used)" in failed.detail
    assert sum(isinstance(e, ev.ModelResponded) for e in events) == 2  # the third call was never made
    report = verify(load_bundle(bundle).kernel_config(), events)
    assert report.ok, report.problems


async def test_an_agent_over_its_daily_budget_fails_its_next_run(nats_server, topo, tmp_path: Path):
    bundle = write_bundle(tmp_path, extra="budgets: {agent_tokens_per_day: 40}\n")
    async with running_fleet(nats_server.url, topo, bundle, responder=usage_of(calc_responder)) as env:
        first = await env.wait_run(await publish_task(topo, "calc:a", "compute: 1 + 1", task_id="t1"))
        second = await env.wait_run(await publish_task(topo, "calc:b", "compute: 2 + 2", task_id="t2"))
        served = env.server.served
    assert kinds(first)[-1] == "run.completed"  # 2 calls, 50 tokens: the budget had room before each
    failed = second[-1]
    assert isinstance(failed, ev.RunFailed) and failed.reason == "budget_exceeded"
    assert "agent calc's token budget of 40 per day is spent (50 used)" in failed.detail
    refused = next(e for e in second if isinstance(e, ev.ModelFailed))
    assert refused.error_kind == "budget_exceeded" and served == 2  # no request for the second run
    report = verify(load_bundle(bundle).kernel_config(), second)
    assert report.ok, report.problems


async def test_token_counts_are_the_fleets(nats_server, js):
    """Two hosts' counts of one agent's day add up in the `budgets` bucket, each seeing the other's."""
    a, b = FleetTokens(js), FleetTokens(js)
    await a.open()
    await b.open()
    a.add("day.calc.1", 30, ttl=60)
    b.add("day.calc.1", 12, ttl=60)
    assert a.used("day.calc.1") == 30 and b.used("day.calc.1") == 12  # each sees its own at once
    await a.flush()
    await b.flush()
    await a.flush()  # reads back what b wrote
    assert a.used("day.calc.1") == b.used("day.calc.1") == 42
