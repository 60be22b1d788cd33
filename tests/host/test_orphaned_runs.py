"""A run no driver holds in a slot its host serves is found again: by its next tool outcome, by itself when a
fence stopped its driver and the slot was served again, and by a takeover whose listing of unfinished runs is
checked against the stream leader.

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
from runtime.log import RunLog
from runtime.nats import kv as kv_module
from runtime.nats.kv import IncompleteListing, kv_entries

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
    kv = await bus.fleet_kv(js, bus.ACTIVE_BUCKET)
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
    kv = await bus.fleet_kv(js, bus.ACTIVE_BUCKET)
    await kv.put("p1.r0", b"calc")

    async def empty(*args: Any, **kw: Any) -> list[Any]:
        return []

    monkeypatch.setattr(kv_module, "last_per_subject", empty)
    monkeypatch.setattr(kv_module, "COMPLETE_RETRY_S", 0.01)
    with pytest.raises(IncompleteListing, match=r"p1\.r0"):
        await kv_entries(kv, "p1.*", complete=True)
