"""A run no driver holds in a slot its host serves is found again: by its next tool outcome, by itself when a
fence stopped its driver and the slot was served again, by a takeover whose listing of unfinished runs is
checked against the stream leader, and, whatever the cause, by the host's periodic look for orphans.

Seen on machines of their own (`bench/partitions.py`, the cut of a minority NATS node): after every lease
was lost and taken again, a host's recovery listed a partition's unfinished runs from a replica still
catching up and missed six runs; their tool outcomes then came to the host, found no driver, were retried
20 times and dropped, and the six runs waited for ever with their `tool.called` answered.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from host_helpers import kinds, running_fleet, running_worker, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_task
from runtime.host import HostConfig
from runtime.log import RunLog
from runtime.nats import kv as kv_module
from runtime.nats.kv import IncompleteListing, fleet_kv, kv_entries
from runtime.nats.records import active_value
from runtime.nats.subjects import ACTIVE_BUCKET, active_key, partition_of
from runtime.observe.metrics import HostMetrics

pytestmark = pytest.mark.anyio


async def _driver_stopped_while_waiting_for_its_job(env: Any, js: Any) -> str:
    """A run waiting for its job (no worker yet) whose driver is stopped while its slot stays served."""
    host = env.host
    run_id = await publish_task(js, "calc", "compute: 6 * 7")
    with anyio.fail_after(30):
        while not any(isinstance(e, ev.ToolCalled) for e in (await RunLog(js).read(run_id)).events):
            await anyio.sleep(0.02)
        while run_id not in host.drivers:
            await anyio.sleep(0.02)
    actor = next(a for a in host.actors.values() if a.current is not None)
    actor.current[1].cancel()  # what a fence does to the work in hand
    with anyio.fail_after(10):
        while run_id in host.drivers:
            await anyio.sleep(0.02)
    assert host.slots  # it still serves its slots
    return run_id


async def test_an_outcome_finding_no_driver_folds_its_run_back(nats_server, js, tmp_path, monkeypatch):
    await bus.ensure_topology(js, partitions=2)
    bundle = write_bundle(tmp_path)
    async with running_fleet(nats_server.url, js, bundle, worker=False) as env:
        async def missed(*args: Any) -> None:  # as if the takeover's recovery missed the run
            return None

        monkeypatch.setattr(env.host.recovery, "refold", missed)
        run_id = await _driver_stopped_while_waiting_for_its_job(env, js)
        async with running_worker(nats_server.url, [bundle]):  # the job runs; its outcome finds no driver
            events = await env.wait_run(run_id, timeout=60)
    assert kinds(events)[-1] == "run.completed"
    calls = [e.call.id for e in events if isinstance(e, ev.ToolCalled)]
    done = [e.call_id for e in events if isinstance(e, ev.ToolCompleted)]
    assert calls and sorted(calls) == sorted(done)  # each call answered once: the outcome was not dropped


async def test_a_driver_stopped_in_a_slot_served_again_is_folded_back(nats_server, js, tmp_path):
    """A fence stops the work in hand; when the slot is served again at once, its recovery may run while
    the stopping driver still holds the run, and skip it: the stopped run is folded back by itself."""
    await bus.ensure_topology(js, partitions=2)
    bundle = write_bundle(tmp_path)
    async with running_fleet(nats_server.url, js, bundle, worker=False) as env:
        run_id = await _driver_stopped_while_waiting_for_its_job(env, js)
        with anyio.fail_after(20):  # before any outcome exists: no worker runs the job yet
            while run_id not in env.host.drivers:
                await anyio.sleep(0.05)
        async with running_worker(nats_server.url, [bundle]):
            events = await env.wait_run(run_id, timeout=60)
    assert kinds(events)[-1] == "run.completed"
    calls = [e.call.id for e in events if isinstance(e, ev.ToolCalled)]
    assert calls and len(calls) == len(set(calls))  # no call was made again


async def test_a_complete_listing_lists_again_until_it_has_every_key_the_leader_has(nats_server, js,
                                                                                      monkeypatch):
    kv = await fleet_kv(js, ACTIVE_BUCKET)
    for i in range(5):
        await kv.put(f"p0.r{i}", b"calc")
    real = kv_module.last_per_subject
    calls = 0

    async def lagging(*args: Any, **kw: Any) -> list[Any]:  # a replica that has not yet the last two keys
        nonlocal calls
        calls += 1
        msgs = await real(*args, **kw)
        return msgs if calls > 2 else [m for m in msgs if not m.subject.endswith(("r3", "r4"))]

    monkeypatch.setattr(kv_module, "last_per_subject", lagging)
    assert sorted(await kv_entries(kv, "p0.*", complete=True)) == [f"p0.r{i}" for i in range(5)]
    assert calls == 3
    calls = 0
    assert len(await kv_entries(kv, "p0.*")) == 3  # without `complete`, the stale listing as it came


async def test_a_listing_that_stays_incomplete_says_so(nats_server, js, monkeypatch):
    kv = await fleet_kv(js, ACTIVE_BUCKET)
    await kv.put("p1.r0", b"calc")

    async def empty(*args: Any, **kw: Any) -> list[Any]:
        return []

    monkeypatch.setattr(kv_module, "last_per_subject", empty)
    monkeypatch.setattr(kv_module, "COMPLETE_RETRY_S", 0.01)
    with pytest.raises(IncompleteListing, match=r"p1\.r0"):
        await kv_entries(kv, "p1.*", complete=True)


async def _orphan(js: Any, run_id: str, *, until: float | None = None) -> None:
    """What a driver stopped with nothing in flight leaves, once a takeover's recovery missed it: the run's
    first event and its `active` entry (asleep until `until`, if given), and no message that would bring
    it back."""
    started = ev.RunStarted(run_id=run_id, seq=0, ts=1.0, actor="calc", input="compute: 6 * 7")
    assert await RunLog(js).create(started) is not None
    kv = await fleet_kv(js, ACTIVE_BUCKET)
    await kv.put(active_key(partition_of("calc", 2), run_id), active_value("calc", until))


async def test_a_run_nothing_holds_is_adopted_by_the_host_serving_its_slot_and_only_once(nats_server, js,
                                                                                          tmp_path):
    await bus.ensure_topology(js, partitions=2)
    config = HostConfig(task_ack_wait=2.0, orphan_check=0.2)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), config=config) as env:
        await _orphan(js, "r-orphan")  # after the takeover: its recovery cannot have seen it
        await _orphan(js, "r-asleep", until=4e9)  # asleep until 2096: its wake-up brings it back, not this
        driven = await publish_task(js, "calc", "compute: 2 + 3")  # held by its driver all along
        assert kinds(await env.wait_run(driven))[-1] == "run.completed"
        events = await env.wait_run("r-orphan", timeout=60)
        await anyio.sleep(1.0)  # five more looks
        stats = env.host.stats
        metrics = HostMetrics()
        metrics.watch_host(env.host)
        adopted = metrics.registry.get_sample_value("sa_host_runs_adopted")
        asleep = (await RunLog(js).read("r-asleep")).events
    # fenced before it was driven: `run.taken` names the adopting host
    assert kinds(events)[:3] == ["run.started", "run.taken", "model.requested"]
    assert kinds(events)[-1] == "run.completed" and events[1].host == env.host.id
    assert "42" in str(events[-1])  # the calculator's answer: the run was driven to its real end
    calls = [e.call.id for e in events if isinstance(e, ev.ToolCalled)]
    assert calls and len(calls) == len(set(calls))  # driven by one driver: no call made twice
    assert (stats.runs_adopted, stats.runs_recovered) == (1, 0)  # the orphan only; not the others
    assert adopted == 1  # what an operator's alert reads
    assert kinds(asleep) == ["run.started"]
    idle = await fleet_kv(js, ACTIVE_BUCKET)
    assert sorted(await kv_entries(idle, ">")) == [active_key(partition_of("calc", 2), "r-asleep")]


async def test_no_look_for_orphans_when_told_not_to(nats_server, js, tmp_path):
    await bus.ensure_topology(js, partitions=2)
    config = HostConfig(task_ack_wait=2.0, orphan_check=None)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), config=config) as env:
        await _orphan(js, "r-left")
        await anyio.sleep(1.0)
        assert env.host.stats.runs_adopted == 0
        assert kinds((await RunLog(js).read("r-left")).events) == ["run.started"]


async def test_a_takeover_fences_the_run_before_the_new_owner_does_a_step(nats_server, js, tmp_path):
    """Folding a run to take it over appends `run.taken` first: the driver that held it, with the run's last
    sequence as it knew it, is refused by the log at its next append, though the new driver did nothing."""
    from runtime.log import Superseded

    await bus.ensure_topology(js, partitions=2)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), worker=False) as env:
        run_id = await publish_task(js, "calc", "compute: 6 * 7")
        with anyio.fail_after(30):  # waiting for its job (no worker): nothing more to append for now
            while not any(isinstance(e, ev.ToolCalled) for e in (await RunLog(js).read(run_id)).events):
                await anyio.sleep(0.02)
            while run_id not in env.host.drivers:
                await anyio.sleep(0.02)
        old = env.host.drivers[run_id]
        new = await env.host.recovery.fold_existing(run_id, old.actor, old.partition, fence=True)
        assert new is not None and new.last_seq > old.last_seq
        stale = ev.stamp(ev.RunCancelled(run_id=run_id, reason="stale"), seq=old.state.seq, actor=old.actor)
        with pytest.raises(Superseded):
            await RunLog(js).append(stale, expect=old.last_seq)
        events = (await RunLog(js).read(run_id)).events
    assert isinstance(events[-1], ev.RunTaken) and events[-1].host == env.host.id
    assert not any(isinstance(e, ev.RunCancelled) for e in events)


async def test_a_run_folded_back_for_a_command_is_fenced_before_it_is_driven(nats_server, js, tmp_path):
    """A command (or an outcome) that finds no driver folds its run back (`Recovery.unpark`), and can reach
    the run's new owner before its takeover fenced the run: the host that drove it until then (paused past
    its lease, or with a slow clock) must be refused at its next append, though the new driver wrote
    nothing yet. Unfenced, that stale append was stored (issue 40: a run unparked for its outcome, driven
    by two hosts)."""
    from runtime.log import Superseded

    await bus.ensure_topology(js, partitions=2)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path), worker=False) as env:
        run_id = "r-unparked"
        started = ev.RunStarted(run_id=run_id, seq=0, ts=1.0, actor="calc", input="compute: 6 * 7")
        last = await RunLog(js).create(started)  # what the old owner wrote, and knows as the run's last
        assert last is not None
        kv = await fleet_kv(js, ACTIVE_BUCKET)
        await kv.put(active_key(partition_of("calc", 2), run_id), active_value("calc", 4e9))  # asleep
        driver = await env.host.recovery.unpark(run_id, "calc", partition_of("calc", 2))
        assert driver is not None and driver.last_seq > last
        stale = ev.stamp(ev.RunCancelled(run_id=run_id, reason="stale"), seq=1, actor="calc")
        with pytest.raises(Superseded):  # the old owner's next append
            await RunLog(js).append(stale, expect=last)
        events = (await RunLog(js).read(run_id)).events
    assert kinds(events)[:2] == ["run.started", "run.taken"] and events[1].host == env.host.id
    assert not any(isinstance(e, ev.RunCancelled) for e in events)
