"""Durable timers end to end on a real nats-server: a run that calls `sleep` is parked (no driver, no
`active` entry, indexed `sleeping until T`) and woken by the cluster's scheduled wake-up; a cancel ends a
sleeping run at once and deletes its wake-up; and a run sleeping across `kill -9` of every `sa host`
process wakes and completes once a host is back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import hosts, kinds, running_fleet, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.commands import publish_task
from runtime.host.leases import LeaseConfig
from runtime.log import RunLog
from runtime.nats.kv import kv_entries
from runtime.nats.records import SLEEPING, parse_active
from runtime.nats.subjects import SCHEDULES, timer_subject, wake_subject
from runtime.schedules import cancel_wake
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from runtime.timers import iso
from testbed.fleet import SaProcess, start_all

pytestmark = pytest.mark.anyio
FAST = LeaseConfig(ttl=2.0, renew=0.5)


def sleeper(body: dict[str, Any]) -> str:
    """A task `sleep N` calls sleep(N) once, then answers `awake after <what sleep returned>`."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    last = last_message(body)
    if "<tool_response>" in last:
        return "awake after " + last.split("<tool_response>")[1].split("</tool_response>")[0].strip()
    return hermes_call("sleep", {"seconds": float(task.split()[1])})


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4)
    return js


def timer_bundle(root: Path) -> Path:
    return write_bundle(root, "napper", tools=(), extra="timers: [sleep, wait_until]\n",
                        terminal=None)  # a run ends on the model's reply in text


async def stored(js: Any, subject: str) -> int:
    return dict((await js.stream_info(SCHEDULES, subjects_filter="schedules.>")).state.subjects or {}).get(
        subject, 0)


async def sleeping(client: Client, run_id: str, timeout: float = 30.0) -> str:
    """The run's index status once it says it sleeps."""
    with anyio.fail_after(timeout):
        while True:
            info = await client.run_info(run_id)
            if info is not None and info.status.startswith(SLEEPING):
                return info.status
            await anyio.sleep(0.05)


async def test_a_sleeping_run_holds_nothing_and_the_cluster_wakes_it(nats_server, topo, tmp_path):
    async with running_fleet(nats_server.url, topo, timer_bundle(tmp_path), responder=sleeper,
                             worker=False) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(topo, "napper", "sleep 2")
        status = await sleeping(client, run_id)
        # parked: no driver holds it, its `active` entry says when it wakes, its wake-up waits in the cluster
        assert run_id not in env.host.drivers and env.host.stats.runs_parked == 1
        call_id = f"{run_id}/1.0"
        started = next(e for e in (await RunLog(topo).read(run_id)).events if isinstance(e, ev.TimerStarted))
        assert status == SLEEPING + iso(started.due)
        [entry] = [e for key, e in (await kv_entries(env.host.index.active)).items() if key.endswith(run_id)]
        assert parse_active(entry.value) == ("napper", started.due)
        assert await stored(topo, timer_subject(call_id)) == 1
        events = await env.wait_run(run_id)
        verified = await client.get(run_id).verify()
    assert verified.ok and verified.checked >= 1, verified.problems  # timer.started is decided again
    # folded back for its wake-up, fenced first (`run.taken`: the host that parked it may be another one)
    assert kinds(events) == ["run.started", "model.requested", "model.responded", "timer.started",
                             "run.taken", "timer.fired", "turn.completed", "model.requested",
                             "model.responded", "turn.completed", "run.completed"]
    fired = next(e for e in events if isinstance(e, ev.TimerFired))
    assert fired.call_id == call_id and fired.by == "schedule" and fired.ts >= started.due
    assert json.loads(events[-1].output.removeprefix("awake after "))["due"]
    assert await stored(topo, timer_subject(call_id)) == 0 and await stored(topo, wake_subject(call_id)) == 0


async def test_cancel_ends_a_sleeping_run_at_once_and_deletes_its_wake_up(nats_server, topo, tmp_path):
    async with running_fleet(nats_server.url, topo, timer_bundle(tmp_path), responder=sleeper,
                             worker=False) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(topo, "napper", "sleep 3600")
        await sleeping(client, run_id)
        call_id = f"{run_id}/1.0"
        assert await stored(topo, timer_subject(call_id)) == 1  # its wake-up, an hour from now
        listed = await sa(nats_server.url, "runs", "napper")
        assert listed.code == 0 and "sleeping until" in listed.out, listed.out + listed.err
        ending = await client.control.cancel(run_id, reason="not needed any more", by="ops")
        assert isinstance(ending, ev.RunCancelled) and ending.reason == "not needed any more"
        events = (await RunLog(topo).read(run_id)).events
        # cancelled while it slept: folded back (and fenced) for the cancel
        assert kinds(events)[-3:] == ["timer.started", "run.taken", "run.cancelled"]
        assert await stored(topo, timer_subject(call_id)) == 0  # and its wake-up is gone
        with anyio.fail_after(10):  # the index follows the log: written once the ending is
            while (info := await client.run_info(run_id)) is None or info.status != "cancelled" or \
                    any(key.endswith(run_id) for key in await kv_entries(env.host.index.active)):
                await anyio.sleep(0.05)
        assert run_id not in env.host.drivers


async def test_a_run_sleeping_across_kill_9_of_every_host_wakes_and_completes(nats_server, topo, tmp_path):
    with ScriptedModelServer(responder=sleeper) as server:
        bundle = write_bundle(tmp_path, "napper", tools=(), extra="timers: [sleep]\n",
                              base_url=server.base_url, terminal=None)
        hosts = [SaProcess(f"host{i}", ["host", str(bundle), "--task-ack-wait", "3"], nats_server.url,
                           tmp_path / f"host{i}.log", "sa host: serving") for i in range(2)]
        try:
            await anyio.to_thread.run_sync(start_all, hosts)
            async with Client(await bus.connect(nats_server.url), owns_connection=True) as client:
                run_id = await publish_task(topo, "napper", "sleep 4")
                call_id = f"{run_id}/1.0"
                await sleeping(client, run_id)  # parked, its wake-up in the cluster
                for host in hosts:
                    await anyio.to_thread.run_sync(host.kill9)
                # the instant passes while no host runs: the wake-up fires and waits in SCHEDULES
                with anyio.fail_after(30):
                    while await stored(topo, wake_subject(call_id)) == 0:
                        await anyio.sleep(0.1)
                assert "timer.fired" not in kinds((await RunLog(topo).read(run_id)).events)
                await anyio.to_thread.run_sync(hosts[0].start)
                await anyio.to_thread.run_sync(hosts[0].wait_ready)
                with anyio.fail_after(60):
                    events = [e async for e in RunLog(topo).follow(run_id)]
        finally:
            for host in hosts:
                await anyio.to_thread.run_sync(host.stop)
        assert kinds(events)[-1] == "run.completed" and kinds(events).count("timer.fired") == 1
        # woken once: by the restarted host's takeover (its `active` entry was due) or by the cluster's
        # wake-up, whichever came first; the other found the timer fired and changed nothing
        assert next(e for e in events if isinstance(e, ev.TimerFired)).by in ("host", "schedule")
        assert len(server.requests) == 2  # the recorded model call was not made again


async def test_a_sleeping_run_whose_wake_up_was_lost_wakes_at_the_next_takeover_once_due(nats_server, topo,
                                                                                          tmp_path):
    bundle = timer_bundle(tmp_path)
    with ScriptedModelServer(responder=sleeper) as server:
        async with hosts(nats_server.url, [bundle], server, 1, lease=FAST) as (first,):
            client = Client(first.host.nc)
            run_id = await publish_task(topo, "napper", "sleep 1")
            await sleeping(client, run_id)
            await cancel_wake(topo, f"{run_id}/1.0")  # lost: the cluster will never wake it
            started = next(e for e in (await RunLog(topo).read(run_id)).events
                           if isinstance(e, ev.TimerStarted))
            await first.crash()
        while time.time() <= started.due:  # its instant passes while no host runs
            await anyio.sleep(0.1)
        async with hosts(nats_server.url, [bundle], server, 1, lease=FAST):
            with anyio.fail_after(60):
                events = [e async for e in RunLog(topo).follow(run_id)]
    assert kinds(events)[-1] == "run.completed"
    fired = next(e for e in events if isinstance(e, ev.TimerFired))
    assert fired.by == "host"  # the takeover found it due in `active`, and woke it itself


async def test_a_command_whose_run_cannot_be_fenced_here_is_handed_back_not_left_to_its_ack_wait(
        nats_server, topo, tmp_path):
    """A command for a sleeping run folds it back and fences it (`Recovery.unpark`); a host that cannot show
    it holds the run's slot (woken past its lease) is refused at that fence, and hands the command back (a
    nak) for the owner: before, the refusal escaped the handler and the command waited out its whole
    AckWait (60 s here) before anyone saw it again."""
    from runtime.commands import publish_command
    from runtime.host import HostConfig

    config = HostConfig(task_ack_wait=60.0)
    async with running_fleet(nats_server.url, topo, timer_bundle(tmp_path), responder=sleeper,
                             worker=False, config=config) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(topo, "napper", "sleep 3600")
        await sleeping(client, run_id)
        recovery = env.host.recovery
        lease_ok, refused = recovery.holds, []

        def no_lease(actor: str, p: int) -> bool:  # as a host woken past its lease finds
            refused.append(actor)
            return False

        recovery.holds = no_lease
        await publish_command(topo, "napper", ev.Cancel(run_id=run_id, reason="not needed", by="ops"))
        with anyio.fail_after(20):  # refused, handed back, delivered again and refused again: no AckWait
            while len(refused) < 2:
                await anyio.sleep(0.05)
        recovery.holds = lease_ok  # the lease is back (or the owner takes it): the command is applied
        with anyio.fail_after(20):
            while kinds(events := (await RunLog(topo).read(run_id)).events)[-1] != "run.cancelled":
                await anyio.sleep(0.05)
    assert kinds(events)[-3:] == ["timer.started", "run.taken", "run.cancelled"]  # nothing while refused
