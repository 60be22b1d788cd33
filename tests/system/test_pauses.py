"""Processes paused (SIGSTOP) past what the fleet waits for them, then woken (SIGCONT), and a host whose clock
jumps: real `sa host` and `sa worker` processes on a real nats-server, the scripted model server.

* A host paused past its lease while it drives runs, its partition taken by the other host: once with a
  steady clock, once with the paused host's clock running at half speed, and once not paused but with its
  clock jumping back 3 x TTL mid-run (both Debian's libfaketime);
* a worker paused past the tool AckWait while it holds jobs (another worker runs them again; its late
  outcomes must change nothing), and the nats-server leading EVENTS on a 3-node cluster paused past a Raft
  election: `testbed.checker`'s counts, each 0.

What must hold for the host, read back from the stores:
* no event the paused host sends after the other host took its partition is stored: every event carries its
  writer (`Sa-Writer`), and after the moment the other host was seen holding the lease the woken host has
  written nothing to a run, unless it took that run back itself later (its own `run.taken` first);
* the other host fenced each run it took over (`run.taken` naming it) before driving it;
* every run completes once, every workspace write happens exactly once, no model request for a step
  arrives after its reply was recorded (`tests/system/test_faults.verify`).
"""

from __future__ import annotations

import glob
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_faults import WORKSPACE, Shape, verify, wait_all_terminal, write_bundle

from runtime import events as ev
from runtime.bundle import load_bundle
from runtime.client.audit import audit
from runtime.commands import publish_task
from runtime.nats.cluster import LocalCluster
from runtime.nats.connection import close, connect
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    EVENTS,
    HDR_WRITER,
    LEASES_BUCKET,
    TOOLS,
    WORKERS_CONSUMER,
    parse_lease_key,
)
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer
from testbed.checker import anomalies, check, read_stores
from testbed.fleet import SaProcess, StepModel, start_all, step_task

pytestmark = [pytest.mark.anyio, pytest.mark.fault_bed]
PARTITIONS = 2
TTL = 2
JUMP_S = 3 * TTL  # how far back the `jump` host's clocks go
TOOL_ACK_WAIT = 3.0
LEADER_PAUSE_AFTER_S = 2.0  # how long the paused EVENTS leader stays stopped after another node leads


async def holders(js: Any) -> dict[int, str]:
    """Partition -> the host id holding its lease now."""
    entries = await kv_entries(await fleet_kv(js, LEASES_BUCKET))
    return {slot[1]: e.value.decode() for k, e in entries.items() if (slot := parse_lease_key(k)) is not None}


async def stored(js: Any) -> list[tuple[int, str, ev.Event, float]]:
    """Every event of EVENTS: (stream sequence, writer, event, when the server stored it), in order (the
    events of a group share its message's)."""
    last = (await js.stream_info(EVENTS)).state.last_seq
    out = []
    for seq in range(1, last + 1):
        msg = await js.get_msg(EVENTS, seq)
        writer = (msg.headers or {}).get(HDR_WRITER, "")
        out += [(seq, writer, event, msg.time.timestamp()) for event in ev.decode_all(msg.data)]
    return out


async def in_flight(js: Any, host: SaProcess) -> int:
    """How many unfinished runs the partitions `host` holds have now."""
    held = {p for p, h in (await holders(js)).items() if h == host.id}
    active = await kv_entries(await fleet_kv(js, ACTIVE_BUCKET))
    return sum(int(key.split(".")[0][1:]) in held for key in active)


@pytest.mark.parametrize("clock", ["steady", "slow", "jump"])
async def test_a_host_paused_past_its_lease_stores_nothing_after_the_takeover(nats_server, tmp_path: Path,
                                                                             clock: str):
    """`slow`: the paused host's clock also runs at half speed (libfaketime), so the jump its monotonic clock
    makes over the pause is half the pause, short of its lease's life: only its measured clock rate
    (`Leases.clock_rate`) tells it that the lease is gone.

    `jump`: the host is not stopped; its clocks (wall and monotonic: libfaketime fakes both) jump
    `JUMP_S` back mid-run, a pause as the host sees it from inside: its renewals, timed on the clock it
    reads, wait `JUMP_S` longer while its network work goes on, and its leases look younger than they are,
    so the server expires them and the other host takes its partitions while it still drives runs."""
    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))  # threads: the MT build
    if clock != "steady" and not libs:
        pytest.skip("Debian's libfaketime is not installed (`make faketime` installs it)")
    model = StepModel()
    offset = tmp_path / "faketime.rc"
    nc = await connect(nats_server.url, name="pause-test")
    procs: list[SaProcess] = []
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
        await ensure_topology(js, partitions=PARTITIONS, tool_ack_wait=3.0)
        with ScriptedModelServer(responder=model) as server:
            bundle = write_bundle(tmp_path, server.base_url)
            args = ["host", str(bundle), "--task-ack-wait", "3", "--lease-ttl", str(TTL)]
            ready = "sa host: serving"
            # `env` execs the host in its own process (the `faketime` command would fork it: a SIGSTOP
            # would then stop the wrapper, not the host)
            faked = {"steady": [], "slow": ["FAKETIME=+0 x0.5"],
                     # re-read every second: the offset written there is the jump
                     "jump": [f"FAKETIME_TIMESTAMP_FILE={offset}", "FAKETIME_CACHE_DURATION=1"]}[clock]
            offset.write_text("+0\n")
            slow = ["env", f"LD_PRELOAD={libs[0]}", *faked] if faked else []
            hosts = [SaProcess(f"host{i}", args, nats_server.url, tmp_path / f"host{i}.log", ready,
                               prefix=slow if i == 0 else [])
                     for i in range(2)]
            victim, other = hosts
            worker = SaProcess("worker", ["worker", "--bundle", str(bundle), "--concurrency", "4"],
                               nats_server.url, tmp_path / "worker.log", "serving")
            procs = [*hosts, worker]
            await anyio.to_thread.run_sync(start_all, procs)
            with anyio.fail_after(30):  # one partition each
                while sorted((await holders(js)).values()) != sorted(h.id for h in hosts):
                    await anyio.sleep(0.05)
            if clock == "slow":
                with anyio.fail_after(60):  # the slow host measured its clock against the server's
                    while "its clock runs at" not in victim.log.read_text(errors="replace"):
                        await anyio.sleep(0.1)
            # a jumped host goes on driving its runs (only its timers wait): longer runs, still in flight
            # when the other host takes them
            steps, delay_ms = (5, 1000) if clock == "jump" else (3, 300)  # 5: the KV history kept
            shapes = [Shape(i, steps, 0, delay_ms) for i in range(12)]
            for s in shapes:
                s.run_id = await publish_task(js, f"faults:a{s.index}",
                                              step_task(s.index, steps=steps, spin=0, delay_ms=delay_ms))
            with anyio.fail_after(30):  # mid-run: a model reply or a tool job of the victim's runs is out
                while not await in_flight(js, victim) or len(model.requests) < 6:
                    await anyio.sleep(0.02)
            assert victim.proc is not None
            paused_at = (await js.stream_info(EVENTS)).state.last_seq
            if clock == "jump":
                offset.write_text(f"-{JUMP_S}\n")
            else:
                os.kill(victim.proc.pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(30):  # the other host holds the victim's partition (its lease expired)
                    while (await holders(js)) != dict.fromkeys(range(PARTITIONS), other.id):
                        await anyio.sleep(0.02)
                taken_at = (await js.stream_info(EVENTS)).state.last_seq
            finally:
                if clock != "jump":
                    os.kill(victim.proc.pid, signal.SIGCONT)  # at once: before the new owner has done a step
            await wait_all_terminal(js, shapes, 90)
            log = await stored(js)  # a slow host's events carry its slow clock: the server's says when
            counts = await verify(js, shapes, model, {(e.run_id, e.seq): t for _, _, e, t in log})
            audited = await audit(js)  # the fenced logs are whole: `run.taken` is no gap, fork or stray
    finally:
        for p in procs:
            p.stop()
        await close(nc)
    runs = {s.run_id for s in shapes}
    stale, fenced = [], set()
    retaken: set[str] = set()  # runs the woken host took back later, fencing the other host in turn
    for seq, writer, event, _ in log:
        if event.run_id not in runs:
            continue
        if isinstance(event, ev.RunTaken):
            assert writer == event.host, (seq, writer, event)  # a fence is written by the host it names
            if writer == other.id and seq > paused_at:  # perhaps before we saw it hold the lease
                fenced.add(event.run_id)
        if seq > taken_at and writer == victim.id:
            if isinstance(event, ev.RunTaken):
                retaken.add(event.run_id)
            elif event.run_id not in retaken:
                stale.append((seq, event.run_id, ev.kind_of(event)))
    assert not stale, f"the paused host's events stored after the takeover: {stale}"
    victims = {e.run_id for _, w, e, _ in log if w == victim.id and isinstance(e, ev.RunStarted)}
    unfinished = {e.run_id for s, _, e, _ in log if s > taken_at}
    assert victims & unfinished, "the paused host had no run in flight: the test proved nothing"
    assert victims & unfinished <= fenced | retaken, "a run taken over without a run.taken fence"
    assert counts["writes"] == sum(s.steps for s in shapes)
    assert len(audited.runs) == len(shapes) and not audited.findings, audited.findings


async def _publish(js: Any, shapes: list[Shape]) -> None:
    for s in shapes:
        task = step_task(s.index, steps=s.steps, spin=s.spin, delay_ms=s.delay_ms)
        while True:  # NATS electing a leader: again, same task id, stored once
            try:
                s.run_id = await publish_task(js, f"faults:a{s.index}", task, task_id=f"pause-{s.index}")
                break
            except Exception:
                await anyio.sleep(0.2)


async def _checked(js: Any, shapes: list[Shape], model: StepModel, bundle: Path) -> dict[str, int]:
    """`testbed.checker`'s counts for the runs of `shapes` (each anomaly must be 0), printed with its details
    (`-s` shows them: the figures a report quotes)."""
    details: list[str] = []
    counts = await check(js, {s.index: (s.run_id, s.steps) for s in shapes}, model,
                         bundle=load_bundle(bundle), workspace=WORKSPACE, details=details)
    print(f"\ncounts: {counts}" + "".join(f"\n  anomaly: {line}" for line in details))
    return counts


async def test_a_worker_paused_past_its_ack_wait_applies_nothing_twice(nats_server, tmp_path: Path):
    """A worker SIGSTOPped while it holds jobs, for longer than the tool AckWait: the other worker runs them
    again; SIGCONT, the paused one finishes them too and sends its late outcomes. They must change nothing:
    every write applied once, every outcome recorded once, every run completes (`testbed.checker`)."""
    model = StepModel()
    nc = await connect(nats_server.url, name="pause-test")
    procs: list[SaProcess] = []
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
        await ensure_topology(js, partitions=PARTITIONS, tool_ack_wait=TOOL_ACK_WAIT)
        with ScriptedModelServer(responder=model) as server:
            bundle = write_bundle(tmp_path, server.base_url)
            host = SaProcess("host", ["host", str(bundle), "--task-ack-wait", "3", "--lease-ttl", str(TTL)],
                             nats_server.url, tmp_path / "host.log", "sa host: serving")
            victim, rescuer = (SaProcess(f"worker{i}", ["worker", "--bundle", str(bundle), "--concurrency",
                                                       "4"], nats_server.url, tmp_path / f"worker{i}.log",
                                         "serving") for i in range(2))
            procs = [host, victim, rescuer]
            await anyio.to_thread.run_sync(start_all, [host, victim])  # the rescuer starts at the pause
            shapes = [Shape(i, 3, 200_000, 100) for i in range(12)]  # a step spins: jobs are held a while
            await _publish(js, shapes)
            with anyio.fail_after(60):  # mid-job: the only worker holds jobs
                while (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending < 2:
                    await anyio.sleep(0.02)
            assert victim.proc is not None
            os.kill(victim.proc.pid, signal.SIGSTOP)
            try:
                await anyio.to_thread.run_sync(start_all, [rescuer])
                with anyio.fail_after(60):  # past the AckWait: what the paused worker held is run again
                    while not (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_redelivered:
                        await anyio.sleep(0.05)
                    while "redelivered" not in await _kinds_stored(js):  # and recorded by a run
                        await anyio.sleep(0.1)
            finally:
                os.kill(victim.proc.pid, signal.SIGCONT)  # its late outcomes now come in
            await wait_all_terminal(js, shapes, 120)
            counts = await _checked(js, shapes, model, bundle)
    finally:
        for p in procs:
            p.stop()
        await close(nc)
    assert not anomalies(counts), counts
    assert counts["writes"] == sum(s.steps for s in shapes)


async def _kinds_stored(js: Any) -> str:
    """Every event kind stored in EVENTS so far, as one string (`tool.redelivered` shows a job run again)."""
    last = (await js.stream_info(EVENTS)).state.last_seq
    kinds = {ev.kind_of(e) for seq in range(1, last + 1)
             for e in ev.decode_all((await js.get_msg(EVENTS, seq)).data)}
    return " ".join(sorted(kinds))


async def test_the_events_leader_paused_past_an_election_loses_nothing(tmp_path: Path):
    """The nats-server leading EVENTS SIGSTOPped for longer than a Raft election (a GC pause, a frozen VM)
    on a 3-node cluster (R3) while runs are in flight, then SIGCONT: it comes back a follower of a newer
    term. Its clients reconnect elsewhere; nothing acknowledged is lost, nothing is applied twice, no
    recorded model call is made again, no log forks (`testbed.checker`: every count 0)."""
    model = StepModel()
    cluster = await LocalCluster(3, root=tmp_path / "cluster").astart()
    procs: list[SaProcess] = []
    nc = None
    try:
        nc = await connect(cluster.urls, name="pause-test")
        js = nc.jetstream()
        await ensure_topology(js, replicas=3, partitions=PARTITIONS, tool_ack_wait=TOOL_ACK_WAIT)
        with ScriptedModelServer(responder=model) as server:
            bundle = write_bundle(tmp_path, server.base_url)
            procs = [SaProcess(f"host{i}", ["host", str(bundle), "--task-ack-wait", "3"], cluster.url,
                               tmp_path / f"host{i}.log", "sa host: serving") for i in range(2)]
            procs += [SaProcess(f"worker{i}", ["worker", "--bundle", str(bundle), "--concurrency", "4"],
                                cluster.url, tmp_path / f"worker{i}.log", "serving") for i in range(2)]
            await anyio.to_thread.run_sync(start_all, procs)
            shapes = [Shape(i, 3, 0, 300) for i in range(16)]
            await _publish(js, shapes)
            with anyio.fail_after(30):  # mid-run
                while len(model.requests) < 8:
                    await anyio.sleep(0.02)
            leader = (await js.stream_info(EVENTS)).cluster.leader
            node = cluster.nodes[cluster.index_of(leader)]
            assert node.process is not None
            pid = node.process.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(60):  # another node leads EVENTS (a newer term)
                    while True:
                        try:
                            now = (await js.stream_info(EVENTS)).cluster.leader
                        except Exception:  # asked the paused node, or no leader yet
                            now = None
                        if now not in (None, leader):
                            break
                        await anyio.sleep(0.2)
                await anyio.sleep(LEADER_PAUSE_AFTER_S)  # the new leader takes writes while the old sleeps
            finally:
                os.kill(pid, signal.SIGCONT)
            print(f"\nEVENTS leader {leader} paused; {now} took over")
            await read_stores(lambda: runs_kv(js), "the runs bucket")  # the cluster answers this client again
            await wait_all_terminal(js, shapes, 180)
            counts = await _checked(js, shapes, model, bundle)
    finally:
        for p in procs:
            p.stop()
        if nc is not None:
            await close(nc)
        await anyio.to_thread.run_sync(cluster.stop)
    assert not anomalies(counts), counts
