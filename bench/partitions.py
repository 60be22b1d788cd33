"""Network partitions under load, the long version of tests/system/test_partitions.py: every fault, a bigger
load, and a table of recovery times and anomaly counts.

    sudo .venv/bin/python bench/partitions.py [--runs 120] [--window 15] [--seed 28] [--only host,worker]

One bed of machines (network namespaces on a bridge: `testbed.netbed`): a 3-node NATS cluster (R3
streams, deploy/nats/nats.conf), two `sa host` (16 partitions, lease TTL 2 s) and two `sa worker`, each on
its own machine; this process is the load driver and the scripted model server. Each phase publishes
`--runs` step tasks (2-4 workspace-writing tool steps each) over `--window` seconds and, a third of the way
in, injects one fault (`testbed.netfaults`):

  host cut        h0's link down while it serves runs; healed after TTL + 3 s.
                  recovery: until every partition it held is held by h1 (bound: TTL + 1 s)
  worker cut      w0's link down while jobs are held; healed after two AckWaits (its late outcomes arrive)
                  recovery: until the last job it held began again on w1 (bound: tool AckWait, 3 s)
  nats minority   a node leading neither the meta layer nor EVENTS cut off for 8 s
                  recovery: until EVENTS stored an event after the cut
  nats leader     the node leading EVENTS cut off for 8 s; recovery: the same
  host flap       h1's link down and up every 2 s for --flap seconds; recovery: from the last heal until
                  it holds a partition again
  host pause      h0 SIGSTOPped (a GC pause, a frozen VM) until the other host holds every partition it
                  had, then SIGCONT at once; recovery: until then (bound: TTL + 1 s); also counted: events
                  h0 stored after that (its `Sa-Writer` header) in runs it did not take back itself (must
                  be 0: the new owner's `run.taken` fences them, and h0's lease check stops it first)
  worker pause    w0 SIGSTOPped while workers hold jobs, for two AckWaits, then SIGCONT (its late
                  outcomes must change nothing); recovery: as for the worker cut
  leader pause    the NATS node leading EVENTS SIGSTOPped for 10 s (past a Raft election), then SIGCONT:
                  it comes back a follower of a newer term; recovery: until EVENTS stored an event again

Every phase also reports the slowest start of one of its tasks (publish to `run.started`). `--join` runs
instead the scenario of issue 28's idle host (a second host joins under load; see `join`).

After each phase, once every run of it ended, `testbed.checker` counts anomalies from the stores
(each must be 0). Needs root and `ip`; without them it says why and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from typing import Any  # noqa: E402

from runtime import events as ev  # noqa: E402
from runtime.nats.subjects import EVENTS, HDR_WRITER, TOOLS, WORKERS_CONSUMER, partition_of  # noqa: E402
from testbed.checker import anomalies  # noqa: E402
from testbed.fleet import StepModel  # noqa: E402
from testbed.netbed import Bed  # noqa: E402
from testbed.netfaults import (  # noqa: E402
    Fault,
    Load,
    Result,
    cut_host,
    cut_nats,
    cut_worker,
    flap_host,
    lease_holders,
    phase,
    start_delays,
    wait_ended,
)
from testbed.netns import unavailable  # noqa: E402


def faults(flap: float) -> dict[str, tuple[str, Fault]]:
    return {"host": ("host cut (h0)", cut_host("h0")), "worker": ("worker cut (w0)", cut_worker("w0")),
            "minority": ("nats minority cut", cut_nats("minority")),
            "leader": ("nats leader cut (EVENTS)", cut_nats("leader")),
            "flap": (f"host flap (h1, 2 s, {flap:g} s)", flap_host("h1", period=2.0, duration=flap)),
            "hostpause": ("host pause (h0)", pause_host("h0")),
            "workerpause": ("worker pause (w0)", pause_worker("w0")),
            "leaderpause": ("nats leader pause (EVENTS)", pause_leader(10.0))}


def pause_host(name: str) -> Fault:
    """SIGSTOP host `name` until its partitions are all held by another host; SIGCONT at once (see the
    module docstring)."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        victim = bed.host(name)
        assert victim.proc is not None
        mine = {s for s, h in (await lease_holders(bed.js)).items() if h == victim.id}
        t = time.time()
        os.kill(victim.proc.pid, signal.SIGSTOP)
        moved = None
        try:
            while moved is None and time.time() - t < 60:
                with anyio.move_on_after(2):
                    holders = await lease_holders(bed.js)
                    if all(holders.get(s) not in (None, victim.id) for s in mine):
                        moved = round(time.time() - t, 2)
                await anyio.sleep(0.05)
            first = (await bed.js.stream_info(EVENTS)).state.last_seq + 1
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        await anyio.sleep(3.0)  # what it does on waking
        return moved, {"slots": len(mine), "bound_s": bed.lease_ttl + 1,
                       "stale_appends_stored": await _written_after(bed.js, first, victim.id)}

    return fault


async def _written_after(js: Any, first: int, writer: str) -> int:
    """Events `writer` stored from stream sequence `first` on, in runs it did not start or fence first itself
    (a run it started there, or took back with `run.taken`, is its own: it won a lease again)."""
    last = (await js.stream_info(EVENTS)).state.last_seq
    retaken: set[str] = set()
    stale = 0
    for seq in range(first, last + 1):
        msg = await js.get_msg(EVENTS, seq)
        if (msg.headers or {}).get(HDR_WRITER) != writer:
            continue
        for event in ev.decode_all(msg.data):  # a group: several events in one message
            if isinstance(event, ev.RunTaken | ev.RunStarted):
                retaken.add(event.run_id)
            elif event.run_id not in retaken:
                stale += 1
    return stale


def pause_worker(name: str) -> Fault:
    """SIGSTOP worker `name` while workers hold jobs, for two AckWaits; then SIGCONT."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        victim = next(p for p in bed.workers if p.name == name)
        assert victim.proc is not None
        with anyio.fail_after(60):  # mid-job: jobs held by workers
            while (await bed.js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending < 2:
                await anyio.sleep(0.02)
        t = time.time()
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            await anyio.sleep(2 * bed.tool_ack_wait + 1)
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        return None, {"at": t, "healed": time.time(), "bound_s": bed.tool_ack_wait}

    return fault


def pause_leader(hold: float) -> Fault:
    """SIGSTOP the NATS node leading EVENTS for `hold` seconds; then SIGCONT."""

    async def fault(bed: Bed) -> tuple[float | None, dict[str, Any]]:
        info = await bed.js.stream_info(EVENTS)
        leader, before = str(info.cluster.leader), info.state.last_seq
        meta = await anyio.to_thread.run_sync(bed.meta_leader)
        pid = bed.nats[leader].pid
        t = time.time()
        os.kill(pid, signal.SIGSTOP)
        stored = None
        try:
            while stored is None and time.time() - t < hold:
                with anyio.move_on_after(1):
                    try:
                        if (await bed.js.stream_info(EVENTS)).state.last_seq > before:
                            stored = round(time.time() - t, 2)
                    except Exception:  # asked the paused node, or electing
                        pass
                await anyio.sleep(0.1)
            await anyio.sleep(max(0.0, t + hold - time.time()))
        finally:
            os.kill(pid, signal.SIGCONT)
        return stored, {"node": leader, "was_meta_leader": leader == meta, "paused_s": hold}

    return fault


async def main(args: argparse.Namespace) -> list[Result]:
    root = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    model = StepModel()
    bed = await Bed(root, responder=model, partitions=16).astart()
    results: list[Result] = []
    try:
        load = Load(bed, seed=args.seed)
        table = faults(args.flap)
        for key in args.only.split(","):
            name, fault = table[key]
            result = await phase(bed, model, name, fault, load, runs=args.runs, window=args.window,
                                 timeout=300)
            print(json.dumps({"fault": result.fault, "recovery_s": result.recovery_s, "notes": result.notes,
                              "counts": result.counts, "ended_s": result.ended_s}), flush=True)
            for line in result.details:
                print("  anomaly:", line, flush=True)
            results.append(result)
    finally:
        await bed.aclose()
    return results


async def join(args: argparse.Namespace) -> None:
    """Issue 28's idle host, looked for: h0 alone serves 16 partitions; while `--runs` step tasks (3-5
    turns) are published over `--window` s, h1 starts and takes 8 of them. Printed: the slowest start of a
    task on a partition h0 kept, and on one that moved (the symptom was h0 starting none of its kept
    partitions' tasks for seconds)."""
    root = Path(tempfile.mkdtemp(prefix="bench-partitions-join-"))
    model = StepModel()
    bed = await Bed(root, responder=model, partitions=16, worker_concurrency=8,
                    task_ack_wait=30.0).astart(later=("h1",))
    try:
        load, batch = Load(bed, seed=args.seed), {}
        h0, h1 = bed.host("h0"), bed.host("h1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(load.publish, batch, args.runs, args.window)
            h1.start()  # ~10 s to its ready line: it joins while the tasks are published
        await anyio.to_thread.run_sync(h1.wait_ready)
        await wait_ended(bed.js, {r for r, _ in batch.values()}, 300)
        holders = await lease_holders(bed.js)
        delays = await start_delays(bed.js, batch, load.published)
        kept = [d for i, d in delays.items() if holders.get(("net", partition_of(f"net:a{i}", 16))) == h0.id]
        moved = [d for i, d in delays.items() if holders.get(("net", partition_of(f"net:a{i}", 16))) == h1.id]
        print(f"join: {len(kept)} tasks on partitions h0 kept, slowest start {max(kept, default=0):.2f} s; "
              f"{len(moved)} on partitions h1 took, slowest {max(moved, default=0):.2f} s")
    finally:
        await bed.aclose()


def print_table(results: list[Result]) -> None:
    print(f"\n{'fault':<30} {'recovery s':>10} {'bound s':>8} {'runs':>5} {'anomalies':>9}  notes")
    for r in results:
        bad = anomalies(r.counts)
        notes = {k: v for k, v in r.notes.items() if k != "bound_s"}
        bound = r.notes.get("bound_s", "")
        rec = "-" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        print(f"{r.fault:<30} {rec:>10} {bound!s:>8} {r.counts.get('runs', 0):>5} {sum(bad.values()):>9}  "
              f"{json.dumps(notes)}{' ' + json.dumps(bad) if bad else ''}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--flap", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--only",
                        default="host,worker,minority,leader,flap,hostpause,workerpause,leaderpause")
    parser.add_argument("--join", action="store_true",
                        help="only the host-join scenario (issue 28's idle host): a second host joins while "
                        "tasks are published; slowest starts, kept vs moved")
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(f"bench/partitions.py: skipped: {why}")
        sys.exit(0)
    t0 = time.monotonic()
    if args.join:
        anyio.run(join, args)
        sys.exit(0)
    out = anyio.run(main, args)
    print_table(out)
    print(f"\n{len(out)} phase(s) in {time.monotonic() - t0:.0f} s")
