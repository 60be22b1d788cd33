"""Faults under load on a `testbed.netbed.Bed`: each phase publishes a batch of step tasks while one
fault happens, waits until every run of the batch ended, and counts anomalies (`testbed.checker`).

    bed = await Bed(root, responder=model).astart()
    result = await phase(bed, model, "host cut", cut_host, runs=40, window=6.0)
    result.recovery_s, result.notes, anomalies(result.counts)

The faults (each returns the time it took the fleet to recover and what it saw):

* `cut_host`: a host's link goes down. Recovery: until every slot it held is held by another host (bound:
  lease TTL + 1 s). Seen on the cut-off host's own loopback: when it served nothing any more (its slots
  and runs dropped by itself). Healed after the lease TTL + 3 s; then: until it holds a slot again, and
  how many stale appends its log says were refused (`Superseded`).
* `cut_worker`: a worker's link goes down while jobs are held. Recovery: until the last job redelivered
  while it was cut off began again on the other worker (the `tool.redelivered` events; bound: the tool
  AckWait after its last heartbeat). Healed after two AckWaits, so its late outcomes arrive and must change
  nothing.
* `cut_nats_minority` / `cut_nats_leader`: one NATS node cut off: one that leads neither the meta layer
  nor EVENTS, or the EVENTS leader. Recovery: until EVENTS stored an event again; then healed, and the
  time until the node is healthy again.
* `flap_host`: a host's link down and up every `period` seconds for `duration`. Recovery: from the last
  heal until the host holds a slot again.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from runtime import events as ev
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import EVENTS, LEASES_BUCKET, RESULTS, TOOLS, WORKERS_CONSUMER, parse_lease_key
from testbed.checker import check, read_stores
from testbed.fleet import StepModel, step_task
from testbed.netbed import Bed

Fault = Callable[[Bed], Awaitable[tuple[float | None, dict[str, Any]]]]
POLL_S = 0.1


@dataclass
class Result:
    fault: str
    recovery_s: float | None
    notes: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ended_s: float = 0.0  # from the phase's first publish until every run of it ended
    details: list[str] = field(default_factory=list)  # each anomaly described (`testbed.checker`)


class Load:
    """The load driver: step tasks published at a pace, remembered as index -> (run id, steps)."""

    def __init__(self, bed: Bed, seed: int) -> None:
        self.bed, self.rng = bed, random.Random(seed)
        self.next = 0
        self.seed = seed
        self.published: dict[int, float] = {}  # index -> when its task was acked by the stream

    async def publish(self, batch: dict[int, tuple[str, int]], n: int, window: float) -> None:
        for _ in range(n):
            i, self.next = self.next, self.next + 1
            steps = self.rng.randint(2, 4)
            spin, delay = self.rng.choice((0, 20_000)), self.rng.randint(20, 200)
            task = step_task(i, steps=steps, spin=spin, delay_ms=delay)
            while True:  # NATS away (a node cut off, a leader election): again, same task id, stored once
                try:
                    run_id = await publish_task(self.bed.js, f"net:a{i}", task,
                                                task_id=f"net-{self.seed}-{i}")
                    break
                except Exception:
                    await anyio.sleep(0.2)
            batch[i] = (run_id, steps)
            self.published[i] = time.time()
            await anyio.sleep(window / n)


async def phase(bed: Bed, model: StepModel, name: str, fault: Fault, load: Load, *, runs: int,
                window: float, timeout: float = 180.0) -> Result:
    """Publish `runs` tasks over `window` seconds; a third of the way in, inject `fault`; wait until every
    run ended; count (see the module docstring)."""
    batch: dict[int, tuple[str, int]] = {}
    out = Result(name, None)
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(load.publish, batch, runs, window)
        await anyio.sleep(window / 3)
        out.recovery_s, out.notes = await fault(bed)
    try:
        await wait_ended(bed.js, {run_id for run_id, _ in batch.values()}, timeout)
    except AssertionError as e:  # stuck runs: say where each one's work was last seen
        raise AssertionError(f"{e}\n{await stuck_report(bed, str(e))}") from None
    out.ended_s = round(time.monotonic() - t0, 1)
    from runtime.bundle import load_bundle

    out.counts = await check(bed.js, batch, model, bundle=load_bundle(bed.root / "bundle" / "bundle.yaml"),
                             workspace="wsnet", details=out.details)
    out.notes["slowest_start_s"] = await slowest_start(bed.js, batch, load.published)
    if name.startswith("worker"):
        at, healed = out.notes.pop("at", 0.0), out.notes.pop("healed", 0.0)
        out.notes.update(await _redelivered(bed, batch, at, healed))
        out.recovery_s = out.notes.pop("last_redelivered_s", None)
    return out


async def wait_ended(js: Any, wanted: set[str], timeout: float) -> None:
    """Until every run of `wanted` is indexed as ended; raises with the stuck runs' last events.

    The bucket is opened inside the loop too: right after a fault heals, the cluster may still be electing
    (its stream info unanswered for seconds: seen on CI after an EVENTS-leader cut whose node led the meta
    layer), and that is no anomaly of the runtime."""
    runs = None
    deadline = time.monotonic() + timeout
    while True:
        try:
            runs = runs or await runs_kv(js)
            index = await kv_entries(runs)
            ended = ("completed", "failed", "cancelled")
            done = {k for k, e in index.items() if k in wanted and RunIndex.decode(e.value).status in ended}
        except Exception:  # NATS away: look again
            done = set()
        if done == wanted:
            return
        if time.monotonic() > deadline:
            detail = []
            for run_id in sorted(wanted - done)[:10]:
                events = (await RunLog(js).read(run_id)).events
                detail.append(f"{run_id}: {[ev.kind_of(e) for e in events][-6:]}")
            raise AssertionError(f"{len(wanted - done)} run(s) not ended after {timeout} s:\n" +
                                 "\n".join(detail))
        await anyio.sleep(0.5)


async def stuck_report(bed: Bed, failure: str, *, runs: int = 4, lines: int = 12) -> str:
    """What a failed `wait_ended` cannot say by itself, for the first `runs` run ids it names: each
    process's log lines that mention the run (the last `lines`), and where the work queues stand (TOOLS and
    RESULTS, and their consumers). Enough to tell a job never stored from one held by a worker, or an
    outcome nobody took, when a partition test fails on a machine whose logs are gone afterwards."""
    out: list[str] = []
    logs = {p.name: p.log.read_text(errors="replace").splitlines() if p.log.exists() else []
            for p in bed.hosts + bed.workers}  # each read once, whatever the number of stuck runs
    for run_id in re.findall(r"^(r[0-9a-f]{16}):", failure, re.M)[:runs]:
        for name, text in logs.items():
            hits = [line.rstrip() for line in text if run_id in line][-lines:]
            if hits:
                out.append(f"-- {name} on {run_id}:\n" + "\n".join(hits))
    try:
        for stream in (TOOLS, RESULTS):
            state = (await bed.js.stream_info(stream)).state
            out.append(f"-- {stream}: {state.messages} message(s), first seq {state.first_seq}, last "
                       f"{state.last_seq}")
            for info in await bed.js.consumers_info(stream):
                if info.num_pending or info.num_ack_pending or info.num_redelivered:
                    out.append(f"   {info.name}: pending {info.num_pending}, ack pending "
                               f"{info.num_ack_pending}, redelivered {info.num_redelivered}, leader "
                               f"{info.cluster.leader if info.cluster else '?'}")
    except Exception as e:  # the report must not hide the failure it reports
        out.append(f"-- the work queues could not be read: {e!r}")
    return "\n".join(out)


async def start_delays(js: Any, batch: dict[int, tuple[str, int]], published: dict[int, float]
                       ) -> dict[int, float]:
    """Index -> seconds from its task's publish until its `run.started` was stamped."""
    log = RunLog(js)
    out = {}
    for i, (run_id, _) in batch.items():
        events = (await read_stores(functools.partial(log.read, run_id), f"run {run_id}")).events
        if events and i in published:
            out[i] = round(events[0].ts - published[i], 2)
    return out


async def slowest_start(js: Any, batch: dict[int, tuple[str, int]], published: dict[int, float]) -> float:
    """The longest a task of `batch` waited to start (a fault's cost to new work)."""
    return max((await start_delays(js, batch, published)).values(), default=0.0)


async def lease_holders(js: Any) -> dict[tuple[str, int], str]:
    """Slot -> the id of the host holding its lease now."""
    entries = await kv_entries(await fleet_kv(js, LEASES_BUCKET))
    out = {}
    for key, entry in entries.items():
        slot = parse_lease_key(key)
        if slot is not None:
            out[slot] = entry.value.decode()
    return out


def _log_mark(bed: Bed, name: str) -> int:
    return next(p for p in bed.hosts + bed.workers if p.name == name).log.stat().st_size


def _log_since(bed: Bed, name: str, mark: int) -> str:
    path = next(p for p in bed.hosts + bed.workers if p.name == name).log
    return path.read_bytes()[mark:].decode(errors="replace")


# -- the faults ----------------------------------------------------------------------------------------


def cut_host(name: str = "h0", *, heal_after: float | None = None) -> Fault:
    """See the module docstring."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        victim = bed.host(name)
        mine = {s for s, h in (await lease_holders(bed.js)).items() if h == victim.id}
        mark = _log_mark(bed, name)
        first = (await bed.js.stream_info(EVENTS)).state.last_seq + 1
        t = bed.cut(name)
        moved = dropped = None
        while (moved is None or dropped is None) and time.time() - t < 30:
            if moved is None:
                with anyio.move_on_after(2):
                    holders = await lease_holders(bed.js)
                    if all(holders.get(s) not in (None, victim.id) for s in mine):
                        moved = round(time.time() - t, 2)
            if dropped is None:
                m = await anyio.to_thread.run_sync(bed.metrics, name)
                if m and not any(m.get(k) for k in ("sa_host_partitions_owned", "sa_host_runs_in_flight",
                                                      "sa_host_tasks_waiting")):
                    dropped = round(time.time() - t, 2)
            await anyio.sleep(POLL_S)
        await anyio.sleep(max(0.0, t + (heal_after or bed.lease_ttl + 3) - time.time()))
        healed = bed.heal(name)
        rejoined = await _until_holds(bed, victim.id, 60)
        await anyio.sleep(2.0)  # what it sent while cut off arrives at once after the heal, if ever
        text = _log_since(bed, name, mark)
        notes = {"slots": len(mine), "bound_s": bed.lease_ttl + 1, "dropped_own_work_s": dropped,
                 "stale_appends_accepted": await stale_appends(bed.js, first, healed),
                 "rejoined_s": round(rejoined - healed, 2) if rejoined else None,
                 "fenced": len(re.findall(r"fenced\s+\(not\s+serving", text)),
                 "stale_appends_refused": len(re.findall(r"stops\s+driving", text))}
        return moved, notes

    return fault


async def _until_holds(bed: Bed, host_id: str, timeout: float) -> float | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if host_id in (await lease_holders(bed.js)).values():
                return time.time()
        except Exception:
            pass
        await anyio.sleep(POLL_S)
    return None


async def stale_appends(js: Any, first: int, healed: float, margin: float = 1.0) -> int:
    """Events stored after the heal although stamped by their writer at least `margin` s before it: only a
    process that could not reach NATS until the heal writes that late, i.e. the cut-off host, whose lease
    had expired by then. (nats-py resends what it could not send once it reconnects, and a TCP connection
    whose link comes back within its retransmission time delivers what it held.) Read from stream
    sequence `first` (the first event stored after the cut)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    psub = await js.pull_subscribe("events.>", stream=EVENTS, config=ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first, ack_policy=AckPolicy.NONE,
        mem_storage=True, num_replicas=1, inactive_threshold=30.0))
    stale = 0
    try:
        while True:
            try:
                msgs = await psub.fetch(batch=500, timeout=2.0)
            except Exception:  # nothing more (a timeout), or NATS trouble: counted so far
                break
            for msg in msgs:
                stored = msg.metadata.timestamp.timestamp()
                if stored > healed and ev.decode_all(msg.data)[0].ts < healed - margin:
                    stale += 1
            if not msgs or msgs[-1].metadata.num_pending == 0:
                break
    finally:
        await psub.unsubscribe()
    return stale


def cut_worker(name: str = "w0") -> Fault:
    """See the module docstring (its recovery is read from the logs once the phase ended: `phase`)."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        with anyio.fail_after(60):  # mid-job: jobs held by workers
            while True:
                try:
                    if (await bed.js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending >= 2:
                        break
                except Exception:
                    pass
                await anyio.sleep(0.02)
        t = bed.cut(name)
        await anyio.sleep(2 * bed.tool_ack_wait + 1)
        healed = bed.heal(name)
        return None, {"at": t, "healed": healed, "bound_s": bed.tool_ack_wait}

    return fault


async def _redelivered(bed: Bed, batch: dict[int, tuple[str, int]], at: float, healed: float
                       ) -> dict[str, Any]:
    """Jobs that began again while the worker was cut off (only the other worker could take them: the
    cut-off one's jobs, and any given back), when the last of them did, and how many deliveries were
    given back by a worker (`earlier` says so) rather than lost with one."""
    log = RunLog(bed.js)
    times, given_back, later = [], 0, 0
    for run_id, _ in batch.values():
        for e in (await log.read(run_id)).events:
            if isinstance(e, ev.ToolRedelivered) and e.ts > at:
                given_back += sum("given back" in line for line in e.earlier)
                if e.ts < healed:
                    times.append(e.ts)
                else:
                    later += 1
    return {"jobs_redone": len(times), "redelivered_after_heal": later, "given_back": given_back,
            "last_redelivered_s": round(max(times) - at, 2) if times else None}


def cut_nats(which: str = "minority", *, hold: float = 8.0) -> Fault:
    """See the module docstring: `which` is ``minority`` or ``leader`` (of EVENTS)."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        info = await bed.js.stream_info(EVENTS)
        leader = str(info.cluster.leader)
        meta = await anyio.to_thread.run_sync(bed.meta_leader)
        names = [m.name for m in bed.nodes]
        victim = leader if which == "leader" else next(n for n in names if n not in (leader, meta))
        before = info.state.last_seq
        t = bed.cut(victim)
        stored: float | None = None
        healed = 0.0
        while stored is None and time.time() - t < 60:  # healed after `hold` whatever the driver sees
            if not healed and time.time() - t >= hold:
                healed = bed.heal(victim)
            with anyio.move_on_after(1):
                try:
                    if (await bed.js.stream_info(EVENTS)).state.last_seq > before:
                        stored = round(time.time() - t, 2)
                except Exception:
                    pass
            await anyio.sleep(POLL_S)
        await anyio.sleep(max(0.0, t + hold - time.time()))
        healed = healed or bed.heal(victim)
        i = names.index(victim)
        back = None
        while back is None and time.time() - healed < 60:
            if await anyio.to_thread.run_sync(bed.monitor, i, "/healthz") is not None:
                back = round(time.time() - healed, 2)
            await anyio.sleep(POLL_S)
        return stored, {"node": victim, "was_meta_leader": victim == meta, "healthy_after_heal_s": back,
                        "stored_before_heal": stored is not None and stored < hold}

    return fault


def flap_host(name: str = "h0", *, period: float = 2.0, duration: float = 20.0) -> Fault:
    """See the module docstring."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        victim = bed.host(name)
        mark = _log_mark(bed, name)
        end = time.time() + duration
        flaps = 0
        while time.time() < end:
            bed.cut(name)
            await anyio.sleep(period / 2)
            bed.heal(name)
            flaps += 1
            await anyio.sleep(period / 2)
        healed = time.time()
        rejoined = await _until_holds(bed, victim.id, 60)
        text = _log_since(bed, name, mark)
        return (round(rejoined - healed, 2) if rejoined else None,
                {"flaps": flaps, "fenced": len(re.findall(r"fenced\s+\(not\s+serving", text)),
                 "stale_appends_refused": len(re.findall(r"stops\s+driving", text))})

    return fault


__all__ = ["Fault", "Load", "Result", "cut_host", "cut_nats", "cut_worker", "flap_host", "lease_holders",
           "phase", "slowest_start", "stale_appends", "start_delays", "wait_ended"]
