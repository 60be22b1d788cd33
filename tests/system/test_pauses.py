"""A host paused past its lease (SIGSTOP) while it drives runs, its partition taken by the other host, then
woken (SIGCONT): real `sa host` and `sa worker` processes on a real nats-server, the scripted model server;
once with a steady clock, once with the paused host's clock running at half speed (Debian's libfaketime).

What must hold, read back from the stores:
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
from test_faults import Shape, verify, wait_all_terminal, write_bundle

from runtime import events as ev
from runtime.client.audit import audit
from runtime.commands import publish_task
from runtime.nats.connection import close, connect
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.subjects import ACTIVE_BUCKET, EVENTS, HDR_WRITER, LEASES_BUCKET, parse_lease_key
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer
from testbed.fleet import SaProcess, StepModel, start_all, step_task

pytestmark = pytest.mark.anyio
PARTITIONS = 2
TTL = 2


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


@pytest.mark.parametrize("clock", ["steady", "slow"])
async def test_a_host_paused_past_its_lease_stores_nothing_after_the_takeover(nats_server, tmp_path: Path,
                                                                             clock: str):
    """`slow`: the paused host's clock also runs at half speed (libfaketime), so the jump its monotonic clock
    makes over the pause is half the pause, short of its lease's life: only its measured clock rate
    (`Leases.clock_rate`) tells it that the lease is gone."""
    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))  # threads: the MT build
    if clock == "slow" and not libs:
        pytest.skip("Debian's libfaketime is not installed (`make faketime` installs it)")
    model = StepModel()
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
            slow = ["env", f"LD_PRELOAD={libs[0]}", "FAKETIME=+0 x0.5"] if clock == "slow" else []
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
            shapes = [Shape(i, 3, 0, 300) for i in range(12)]
            for s in shapes:
                s.run_id = await publish_task(js, f"faults:a{s.index}", step_task(s.index, steps=3, spin=0,
                                                                                 delay_ms=300))
            with anyio.fail_after(30):  # mid-run: a model reply or a tool job of the victim's runs is out
                while not await in_flight(js, victim) or len(model.requests) < 6:
                    await anyio.sleep(0.02)
            assert victim.proc is not None
            paused_at = (await js.stream_info(EVENTS)).state.last_seq
            os.kill(victim.proc.pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(30):  # the other host holds the victim's partition (its lease expired)
                    while (await holders(js)) != dict.fromkeys(range(PARTITIONS), other.id):
                        await anyio.sleep(0.02)
                taken_at = (await js.stream_info(EVENTS)).state.last_seq
            finally:
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
    assert counts["writes"] == 3 * len(shapes)
    assert len(audited.runs) == len(shapes) and not audited.findings, audited.findings
