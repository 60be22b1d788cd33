"""Partition leases: hosts split the partitions fairly; a stopping host releases its leases (a delete of
its own revision) and another host takes them from that release, not from an expiry; a crashed host's
leases are never deleted by anyone, another host takes them once they expire and resumes the partition's
unfinished runs; a host whose renewals fail fences itself while its lease still holds its revision; the
consumer count does not grow with the number of agents.

The evidence is the order of changes in the `leases` bucket and the revisions in it, never elapsed time:
how fast a takeover is belongs to the benchmarks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from host_helpers import (
    Env,
    HostHandle,
    calc_responder,
    hosts,
    kinds,
    running_worker,
    wait_until,
    write_bundle,
)
from nats.js.errors import KeyNotFoundError

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_command, publish_task
from runtime.host import leases as leases_module
from runtime.host.leases import LeaseConfig, Leases, Slot
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import HostBeat
from runtime.nats.subjects import HOSTS_BUCKET, LEASES_BUCKET, RESULTS, TASKS, lease_key, partition_of
from runtime.testing import Reply, ScriptedModelServer

pytestmark = pytest.mark.anyio
FAST = LeaseConfig(ttl=2.0, renew=0.5)  # fence after 1.75 s, expiry at 2 s: a crash is noticed within 2.5 s


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=5, tool_ack_wait=2.0)
    return js


Change = tuple[str, str | None, str | None]  # (key, operation: None put / "DEL" / "PURGE", holder of a put)
Op = tuple[str | None, str | None]  # (operation, holder) of one key


@asynccontextmanager
async def lease_changes(js) -> AsyncIterator[list[Change]]:
    """Every change of the `leases` bucket while open, in stream order, starting with each key's current
    value: a put (operation None) names its holder; "DEL" is a host releasing its own lease; "PURGE" is
    the server's marker of an expired one."""
    kv = await fleet_kv(js, LEASES_BUCKET)
    watcher = await kv.watchall()
    changes: list[Change] = []

    async def record() -> None:
        async for e in watcher:
            if e is not None:
                changes.append((e.key, e.operation, e.value.decode() if e.operation is None else None))

    async with anyio.create_task_group() as tg:
        tg.start_soon(record)
        try:
            yield changes
        finally:
            await watcher.stop()


def after_last_put_of(changes: list[Change], partition: int, holder: str) -> list[Op]:
    """The changes of `partition`'s lease after `holder`'s last put of it."""
    ops = [(op, who) for key, op, who in changes if key == lease_key(partition, "calc")]
    last = max(i for i, (op, who) in enumerate(ops) if op is None and who == holder)
    return ops[last + 1:]


def assert_disjoint_cover(handles: list[HostHandle], total: int) -> None:
    sets = [set(h.host.partitions) for h in handles]
    assert sum(len(s) for s in sets) == total and set().union(*sets) == set(range(total)), sets


async def test_hosts_share_the_partitions_fairly_and_a_stopping_host_hands_over_at_once(
        nats_server, topo, tmp_path):
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [bundle], server, 1) as (a,), lease_changes(topo) as changes:
            assert a.host.partitions == [0, 1, 2, 3, 4]  # alone: all of them
            async with hosts(nats_server.url, [bundle], server, 1, lease=FAST) as (b,):
                await wait_until(lambda: sorted([len(a.host.partitions), len(b.host.partitions)]) == [2, 3])
                assert_disjoint_cover([a, b], 5)  # ceil(5/2) = 3: one host has 3, the other 2
                kv = await fleet_kv(topo, LEASES_BUCKET)
                holders = {k: e.value.decode() for k, e in (await kv_entries(kv)).items()}
                assert holders == {lease_key(p, "calc"): h.host.id
                                   for h in (a, b) for p in h.host.partitions}
                beats = await kv_entries(await fleet_kv(topo, HOSTS_BUCKET))
                assert set(beats) == {a.host.id, b.host.id}
                assert a.host.stats.lost == 5 - len(a.host.partitions)  # a let go of exactly its excess
                handed = list(b.host.partitions)
            await wait_until(lambda: len(a.host.partitions) == 5)
    # b stopped cleanly: it deleted its own lease, and a's put is the very next change of the key (had b's
    # lease been left to expire, the next change would be the server's expiry marker, or nothing)
    for p in handed:
        assert after_last_put_of(changes, p, b.host.id)[:2] == [("DEL", None), (None, a.host.id)], changes
    assert b.host.stats.lost == b.host.stats.gained


async def test_a_crashed_hosts_partitions_are_taken_over_and_its_runs_finish_once(nats_server, topo,
                                                                                  tmp_path):
    js = topo
    bundle = write_bundle(tmp_path)

    def slow(body):  # every model reply takes a while, so runs are mid-flight at the crash
        return Reply.of_text(calc_responder(body), delay=0.3)

    with ScriptedModelServer(responder=slow) as server:
        async with hosts(nats_server.url, [bundle], server, 2, lease=FAST) as (a, b), \
                running_worker(nats_server.url, [bundle]), lease_changes(js) as changes:
            await wait_until(lambda: len(a.host.partitions) + len(b.host.partitions) == 5 and
                             min(len(a.host.partitions), len(b.host.partitions)) == 2)
            runs = [await publish_task(js, f"calc:i{i}", "chain: 3") for i in range(16)]
            await wait_until(lambda: len(a.host.drivers) >= 2)
            crashed = list(a.host.partitions)
            in_flight = set(a.host.drivers)
            await a.crash()
            await wait_until(lambda: len(b.host.partitions) == 5, timeout=15)
            served = set(b.host.partitions)
            env = Env(nats_server.url, js, b.host, server, [])
            results = {r: await env.wait_run(r, timeout=60) for r in runs}
            consumers = {s: (await js.stream_info(s)).state.consumer_count for s in (TASKS, RESULTS)}
    for p in crashed:  # nobody deleted the dead host's lease: it expired, then b acquired the partition
        after = after_last_put_of(changes, p, a.host.id)
        assert ("DEL", None) not in after and {who for op, who in after if op is None} == {b.host.id}, after
    assert b.host.stats.runs_recovered >= 1 and set(crashed) <= served
    for run_id, events in results.items():
        assert kinds(events)[-1] == "run.completed", (run_id, kinds(events))
        assert events[-1].output == {"answer": "chained 3"}
        assert [e.seq for e in events] == list(range(len(events)))  # no gap, no fork
        assert kinds(events).count("run.started") == 1
    assert in_flight <= set(results)
    assert consumers == {TASKS: 5, RESULTS: 5}  # 16 agents, 2 hosts: one pair per partition


async def test_a_command_on_another_subject_than_its_run_is_forwarded(nats_server, topo, tmp_path):
    js = topo
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer([Reply.of_text("slow", delay=3.0)]) as server:
        async with hosts(nats_server.url, [bundle], server, 1, lease=FAST):
            n = 5
            instance = next(f"x{i}" for i in range(100)
                            if partition_of(f"calc:x{i}", n) != partition_of("calc", n))
            run_id = await publish_task(js, f"calc:{instance}", "compute: 1")
            with anyio.fail_after(10):
                while server.served < 1:
                    await anyio.sleep(0.02)
            # published on the bundle's subject: another partition than the run's
            await publish_command(js, "calc", ev.Cancel(run_id=run_id, reason="wrong door", by="test"))
            events = await Env(nats_server.url, js, None, server, []).wait_run(run_id, timeout=10)
    assert kinds(events)[-1] == "run.cancelled" and events[-1].reason == "wrong door"


async def test_a_host_whose_renewals_fail_fences_itself_and_a_taken_lease_is_lost(nats_server, topo,
                                                                                  monkeypatch):
    js = topo
    kv = await fleet_kv(js, LEASES_BUCKET)
    log: list[tuple[str, int]] = []
    at_fence: dict[int, tuple[str, int, int]] = {}  # partition -> (holder in KV, its revision, revision held)

    async def gain(slot: Slot) -> None:
        log.append(("gain", slot[1]))

    async def loss(slot: Slot, why: str) -> None:
        p = slot[1]
        if why == "fenced":  # what the lease says at the moment this host stops serving
            try:
                entry = await kv.get(lease_key(p, "calc"))
                at_fence[p] = (entry.value.decode(), entry.revision, leases.held[slot].revision)
            except KeyNotFoundError:  # too late: it expired first
                at_fence[p] = ("(expired)", 0, leases.held[slot].revision)
        log.append((why, p))

    def beat() -> HostBeat:
        return HostBeat(name="h1", started=0.0, ttl=FAST.ttl)

    leases = Leases(js, "h1", 2, bundles=["calc"], on_gain=gain, on_loss=loss, beat=beat, config=FAST)
    both = [("calc", 0), ("calc", 1)]
    await leases.tick()
    assert sorted(log) == [("gain", 0), ("gain", 1)] and leases.serving == both
    log.clear()

    real_put = leases_module.put_kv

    async def unreachable(*args, **kwargs):
        raise TimeoutError("nats is away")

    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(leases._fence_watch, stop)
        monkeypatch.setattr(leases_module, "put_kv", unreachable)
        await leases.tick()  # renewals fail: still held, still served until the fence
        assert leases.serving == both
        await wait_until(lambda: len(log) == 2, timeout=5)
        # it stopped serving while the lease still held this host's revision: before it could expire
        assert sorted(at_fence) == [0, 1]
        for holder, revision, held in at_fence.values():
            assert holder == "h1" and revision == held, at_fence
        assert sorted(log) == [("fenced", 0), ("fenced", 1)] and leases.serving == []
        monkeypatch.setattr(leases_module, "put_kv", real_put)
        log.clear()
        await leases.tick()  # NATS is back: renewed (or, had the key expired, re-acquired) and served again
        assert sorted(log) == [("gain", 0), ("gain", 1)] and leases.serving == both
        # a lease that vanished (by protocol only expiry does that): lost at the next renewal
        await kv.delete(lease_key(0, "calc"))
        log.clear()
        await leases._renew(("calc", 0))
        assert log == [("lost", 0)] and leases.serving == [("calc", 1)]
        stop.set()
    await leases.release_all()
    assert await kv_entries(kv) == {}


async def test_a_steady_host_looks_at_the_buckets_only_when_something_changed(nats_server, topo, tmp_path,
                                                                               monkeypatch):
    """An idle host used to list both fleet buckets on every tick (twice a second): most of its idle CPU.
    Now a tick looks only when a watch saw a lease freed or a host come or go (or, rarely, as a safety
    net: pushed out of this test's reach), and a host that starts is still noticed at once."""
    monkeypatch.setattr(leases_module, "LOOK_EVERY_S", 3600.0, raising=False)
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with hosts(nats_server.url, [bundle], server, 1, lease=FAST) as (a,):
            leases = a.host.leases
            assert leases is not None
            looks: list[int] = []  # the tick count at each look
            real_read = leases.read

            async def counted() -> Any:
                looks.append(leases.ticks)
                return await real_read()

            leases.read = counted  # type: ignore[method-assign]
            start = leases.ticks
            await wait_until(lambda: leases.ticks >= start + 8)
            quiet = [t for t in looks if t <= start + 8]
            assert len(quiet) <= 1, f"a steady host looked on {len(quiet)} of 8 ticks: {looks}"
            before = len(looks)
            async with hosts(nats_server.url, [bundle], server, 1, lease=FAST) as (b,):
                await wait_until(lambda: len(a.host.partitions) < 5)
                assert len(looks) > before  # b's heartbeat made a look: that is how a saw it
                assert_disjoint_cover([a, b], 5)


def test_a_clock_that_jumps_back_leaves_no_lease_valid_until_it_is_renewed():
    """A host's monotonic clock read back (libfaketime's offset changed, a VM restored): a lease renewed
    just before looked younger by the whole jump, and the host kept acting for a slot whose lease the
    server had expired (tests/system/test_pauses.py's `jump`). `ClockRate.now` moves far ahead instead, so
    every renewal time from before the jump is ancient; a renewal after it counts as usual."""
    from runtime.host import clock as clock_module

    readings = iter([100.0, 100.0, 101.0, 95.0, 95.5, 96.0])  # a jump of 6 s back after 101
    clock = clock_module.ClockRate("h", monotonic=lambda: next(readings))
    renewed = clock.now()  # 100: renewed
    assert clock.since(renewed) == 1.0  # 101: a second later, as read
    assert clock.since(renewed) >= clock_module.JUMP_PENALTY_S  # 95: jumped back, the lease is not trusted
    assert clock.jumps == 1
    again = clock.now()  # 95.5: renewed after the jump
    assert clock.since(again) == pytest.approx(0.5) and clock.jumps == 1  # 96: as read again
