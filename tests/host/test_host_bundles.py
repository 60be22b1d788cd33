"""Hosts that serve different bundles on one cluster: each takes only tasks of the agents it serves.

Two teams' hosts share one NATS: a host serving `adder` and a host serving `xss` each split the partitions
only with hosts serving the same bundle (`runtime.host.leases`), and consume only their bundles' task
subjects, so no host ever sees, let alone fails, a task of an agent it does not serve. A task for an agent
no live host serves waits in TASKS until one arrives; only once no host has served it for
`HostConfig.unserved_after` is it failed `unknown_agent` (`runtime.host.unserved`), so it is never lost
silently.

Evidence is the run logs and the `leases` bucket, never elapsed time.
"""

from __future__ import annotations

import anyio
import pytest
from host_helpers import Env, calc_responder, hosts, kinds, running_worker, wait_until, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_command, publish_task
from runtime.host.leases import LeaseConfig
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.subjects import LEASES_BUCKET, TASKS, parse_lease_key, partition_of
from runtime.testing import Reply, ScriptedModelServer

pytestmark = pytest.mark.anyio
FAST = LeaseConfig(ttl=2.0, renew=0.5)
N = 8  # partitions


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=N, tool_ack_wait=2.0)
    return js


def instances(bundle: str, count: int) -> list[str]:
    """`count` actors of `bundle` that together land in every partition (and more than once in some)."""
    out: list[str] = []
    seen: set[int] = set()
    for i in range(1000):
        actor = f"{bundle}:u{i}"
        p = partition_of(actor, N)
        if p not in seen or len(seen) == N:
            out.append(actor)
            seen.add(p)
        if len(out) == count:
            return out
    raise AssertionError("not enough instances")


async def lease_holders(js) -> dict[tuple[str, int], str]:
    """(bundle, partition) -> the host holding its lease, from the `leases` bucket."""
    kv = await fleet_kv(js, LEASES_BUCKET)
    out = {}
    for key, entry in (await kv_entries(kv)).items():
        slot = parse_lease_key(key)
        if slot is not None:
            out[slot] = entry.value.decode()
    return out


async def test_hosts_of_different_bundles_each_run_only_their_own_agents_tasks(nats_server, topo, tmp_path):
    js = topo
    adder, xss = write_bundle(tmp_path, "adder"), write_bundle(tmp_path, "xss")
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [adder], server, 1, lease=FAST) as (a,), \
                hosts(nats_server.url, [xss], server, 1, lease=FAST) as (x,), \
                running_worker(nats_server.url, [adder, xss]):
            await wait_until(lambda: bool(a.host.partitions) and bool(x.host.partitions))
            runs: dict[str, str] = {}
            for actor in instances("adder", 16) + instances("xss", 16):
                runs[actor] = await publish_task(js, actor, "compute: 20 + 22")
            env = Env(nats_server.url, js, None, server, [])
            results = {actor: await env.wait_run(run) for actor, run in runs.items()}
            holders = await lease_holders(js)
            adder_stats, xss_stats = a.host.stats, x.host.stats
    for actor, events in results.items():
        assert kinds(events)[-1] == "run.completed", (actor, kinds(events), events[-1])
        assert events[-1].output == {"answer": "42"} and events[0].actor == actor
    # each host took every partition of its own bundle, and none of the other's
    assert holders == {**{("adder", p): a.host.id for p in range(N)},
                       **{("xss", p): x.host.id for p in range(N)}}
    assert adder_stats.runs_ended == {"completed": 16} and xss_stats.runs_ended == {"completed": 16}


async def test_a_task_for_an_agent_no_host_serves_waits_until_a_host_serving_it_starts(
        nats_server, topo, tmp_path):
    js = topo
    adder, xss = write_bundle(tmp_path, "adder"), write_bundle(tmp_path, "xss")
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [adder], server, 1, lease=FAST, unserved_after=3600.0) as (a,), \
                running_worker(nats_server.url, [adder, xss]):
            early = [await publish_task(js, actor, "compute: 2 * 3") for actor in instances("xss", N)]
            # a task of the served agent published after them, in every partition: once they have all run,
            # the adder host has read every partition past the xss tasks, and left them alone
            later = [await publish_task(js, actor, "compute: 1 + 1") for actor in instances("adder", N)]
            env = Env(nats_server.url, js, None, server, [])
            for run in later:
                assert kinds(await env.wait_run(run))[-1] == "run.completed"
            untouched = [await RunLog(js).last(run) for run in early]
            waiting = (await js.stream_info(TASKS)).state.messages
            async with hosts(nats_server.url, [xss], server, 1, lease=FAST):
                results = [await env.wait_run(run) for run in early]
    assert untouched == [None] * N  # no run was started (nor failed) for them while nobody served xss
    assert waiting == N
    for events in results:
        assert kinds(events)[-1] == "run.completed" and events[-1].output == {"answer": "6"}
    assert a.host.stats.runs_ended == {"completed": N}


async def test_hosts_serving_overlapping_bundle_sets_share_only_what_they_both_serve(
        nats_server, topo, tmp_path):
    """One host serves adder and xss, another only adder: adder's partitions are split between both, xss's
    are all the first's; every task of both completes."""
    js = topo
    adder, xss = write_bundle(tmp_path, "adder"), write_bundle(tmp_path, "xss")
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [adder, xss], server, 1, lease=FAST) as (both,), \
                hosts(nats_server.url, [adder], server, 1, lease=FAST) as (solo,), \
                running_worker(nats_server.url, [adder, xss]):
            await wait_until(lambda: len(solo.host.slots) == N // 2 and len(both.host.slots) == N + N // 2)
            runs = [await publish_task(js, actor, "compute: 5 + 5")
                    for actor in instances("adder", 12) + instances("xss", 12)]
            env = Env(nats_server.url, js, None, server, [])
            results = [await env.wait_run(run) for run in runs]
            holders = await lease_holders(js)
    assert all(kinds(events)[-1] == "run.completed" for events in results)
    assert {holders[("xss", p)] for p in range(N)} == {both.host.id}
    adder_holders = [holders[("adder", p)] for p in range(N)]
    assert sorted(adder_holders.count(h) for h in (both.host.id, solo.host.id)) == [N // 2, N // 2]
    assert solo.host.stats.runs_ended.get("completed", 0) >= 1  # the adder-only host took its share


async def test_a_crashed_host_is_replaced_by_a_host_of_its_bundle_and_commands_reach_the_run(
        nats_server, topo, tmp_path):
    """Two adder hosts and an xss host: when an adder host dies its partitions go to the other adder host,
    never to the xss host, and its unfinished runs finish; a cancel published on the bundle's subject (another
    partition than the run's) reaches the run of an instance."""
    js = topo
    adder, xss = write_bundle(tmp_path, "adder"), write_bundle(tmp_path, "xss")

    def slow(body):  # every model reply takes a while, so runs are mid-flight at the crash
        return Reply.of_text(calc_responder(body), delay=0.3)

    with ScriptedModelServer(responder=slow) as server:
        async with hosts(nats_server.url, [adder], server, 2, lease=FAST) as (a1, a2), \
                hosts(nats_server.url, [xss], server, 1, lease=FAST) as (x,), \
                running_worker(nats_server.url, [adder, xss]):
            await wait_until(lambda: len(a1.host.partitions) + len(a2.host.partitions) == N and
                             min(len(a1.host.partitions), len(a2.host.partitions)) == N // 2)
            runs = [await publish_task(js, actor, "chain: 3") for actor in instances("adder", 12)]
            await wait_until(lambda: len(a1.host.drivers) >= 2)
            in_flight = set(a1.host.drivers)
            await a1.crash()
            await wait_until(lambda: len(a2.host.partitions) == N, timeout=15)
            env = Env(nats_server.url, js, None, server, [])
            results = {r: await env.wait_run(r, timeout=60) for r in runs}
            # a cancel sent on the bundle's subject, for a run of an instance in another partition
            target = next(actor for actor in instances("xss", N)
                          if partition_of(actor, N) != partition_of("xss", N))
            held = await publish_task(js, target, "chain: 50")
            with anyio.fail_after(30):
                while held not in x.host.drivers:
                    await anyio.sleep(0.02)
            await publish_command(js, "xss", ev.Cancel(run_id=held, reason="wrong door", by="test"))
            cancelled = await env.wait_run(held, timeout=30)
            holders = await lease_holders(js)
            xss_slots = x.host.slots
    assert in_flight <= set(results) and a2.host.stats.runs_recovered >= 1
    for run_id, events in results.items():
        assert kinds(events)[-1] == "run.completed", (run_id, kinds(events))
        assert [e.seq for e in events] == list(range(len(events)))  # one writer: no gap, no fork
    assert {holders[("adder", p)] for p in range(N)} == {a2.host.id}
    assert xss_slots == [("xss", p) for p in range(N)]  # the xss host took none of adder's
    assert kinds(cancelled)[-1] == "run.cancelled" and cancelled[-1].reason == "wrong door"


async def test_a_task_for_an_agent_nobody_serves_fails_unknown_agent_after_the_configured_wait(
        nats_server, topo, tmp_path):
    """No host serves `nosuch`: once that has been so for `unserved_after`, its task becomes a failed run
    that says why (today's `unknown_agent`), instead of waiting forever unseen; served agents go on."""
    js = topo
    adder = write_bundle(tmp_path, "adder")
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [adder], server, 1, lease=FAST, unserved_after=0.0) as (a,), \
                running_worker(nats_server.url, [adder]):
            await js.publish("agents.:.tasks", b"for no agent at all")  # dropped as not addressed to one
            unknown = await publish_task(js, "nosuch:i1", "compute: 1")
            ok = await publish_task(js, "adder", "compute: 5 - 2")
            env = Env(nats_server.url, js, None, server, [])
            failed = await env.wait_run(unknown)
            good = await env.wait_run(ok)
            with anyio.move_on_after(10):  # each task is acked once its run is indexed, just after its events
                while (left := (await js.stream_info(TASKS)).state.messages) > 0:
                    await anyio.sleep(0.05)
    assert kinds(failed) == ["run.started", "run.failed"]
    assert failed[-1].reason == "unknown_agent"
    assert "nosuch" in failed[-1].detail and "adder" in failed[-1].detail
    assert failed[0].actor == "nosuch:i1"
    assert good[-1].output == {"answer": "3"} and left == 0
    assert a.host.stats.unserved_failed == 1
