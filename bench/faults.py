"""Reliability under faults: time to resume and what was lost, new defaults beside the previous ones.

    .venv/bin/python bench/faults.py [--runs 10] [--only new|old]

Each configuration gets its own 3-node NATS cluster (R3 streams, 8 partitions), the scripted model
server, two `sa host` and two `sa worker` processes. Three phases run one after the other, each on a
fresh batch of runs (a few workspace-writing tool steps each) published as load; mid-run the phase kills:

* a worker holding jobs (SIGKILL). Time to resume: from the kill until the last of its jobs began again
  on the other worker (the `ts` of the `tool.redelivered` events the host recorded). Bound: AckWait.
* the host serving the most unfinished runs (SIGKILL). Time to resume: from the kill until the first of
  its runs appended an event again (only host-stamped kinds count). Bound: the lease TTL.
* the NATS node leading the EVENTS stream (SIGKILL; back 2 s later). Time to resume: from the kill until
  EVENTS stored an event again (the server's store time of its last message, polled).

A killed process comes back after 1 s (a restarted host or worker is the usual operator response). After
each phase, once every run of the batch ended, the stores are counted: runs lost (not completed),
duplicate effects (workspace writes beyond one per tool step: each run appends one line per step to its
own file, so its KV history must hold exactly its steps), and repeated model calls for recorded steps (a
request for step j of a run arriving after the run's j-th `model.responded` was appended). The hosts'
logs give one more count: partitions a live host stopped serving during the phase (fenced because
renewals failed, or found its lease gone): false takeovers, unless NATS itself was away.

The two configurations: the new defaults (tool AckWait 3 s, heartbeats every 0.75 s; lease TTL 2 s,
renewed every 0.5 s from a thread of its own) and the previous ones (AckWait 30 s; lease TTL 6 s renewed
every 2 s), measured in the same run. Figures are printed; nothing asserts.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import events as ev  # noqa: E402
from runtime.commands import publish_task  # noqa: E402
from runtime.log import RunLog  # noqa: E402
from runtime.nats.cluster import LocalCluster  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv, workspace_kv  # noqa: E402
from runtime.nats.records import RunIndex  # noqa: E402
from runtime.nats.subjects import (  # noqa: E402
    ACTIVE_BUCKET,
    EVENTS,
    LEASES_BUCKET,
    TOOLS,
    WORKERS_CONSUMER,
    bundle_token,
    parse_lease_key,
    workspace_bucket,
)
from runtime.nats.topology import ensure_topology  # noqa: E402
from runtime.testing import ScriptedModelServer  # noqa: E402
from testbed.fleet import SaProcess, StepModel, step_task  # noqa: E402
from testbed.scripts import APPEND_LINE, SUBMIT  # noqa: E402

WORKSPACE = "wsbench"
HOST_STAMPED = (ev.ModelRequested, ev.ToolCalled, ev.TurnCompleted, ev.RunCompleted, ev.RunFailed)



@dataclass
class Config:
    name: str
    ack_wait: float
    lease_ttl: float


@dataclass
class Phase:
    fault: str
    resume_s: float | None = None
    detail: str = ""
    runs: int = 0
    lost: int = 0
    duplicate_writes: int = 0
    repeated_calls: int = 0
    fenced: int = 0  # partitions a live host stopped serving (fenced or lost), from the hosts' logs


class Bench:
    def __init__(self, cfg: Config, root: Path, runs: int, spin: int) -> None:
        self.cfg, self.root, self.n, self.spin = cfg, root, runs, spin
        self.model = StepModel()
        self.next_index = 0
        self.stored_again: float | None = None

    async def run(self) -> list[Phase]:
        cluster = await LocalCluster(3, root=self.root / "cluster").astart()
        self.cluster = cluster
        procs: list[SaProcess] = []
        nc = await connect(cluster.urls, name="bench-faults")
        self.js = js = nc.jetstream()
        try:
            await ensure_topology(js, replicas=3, partitions=8, tool_ack_wait=self.cfg.ack_wait)
            with ScriptedModelServer(responder=self.model) as server:
                bundle = self._bundle(server.base_url)
                host_args = ["host", str(bundle), "--lease-ttl", f"{self.cfg.lease_ttl:g}",
                             "--task-ack-wait", "3"]
                worker_args = ["worker", "--bundle", str(bundle), "--concurrency", "2", "--ack-wait",
                               f"{self.cfg.ack_wait:g}"]
                self.hosts = [SaProcess(f"host{i}", host_args, cluster.url, self.root / f"host{i}.log",
                                        "sa host: serving") for i in range(2)]
                self.workers = [SaProcess(f"worker{i}", worker_args, cluster.url,
                                          self.root / f"worker{i}.log", "serving") for i in range(2)]
                procs = self.hosts + self.workers
                for p in procs:
                    p.start()
                    await anyio.to_thread.run_sync(lambda p=p: p.wait_ready(120))
                return [await self.phase("worker kill", self.kill_worker),
                        await self.phase("host kill", self.kill_host),
                        await self.phase("NATS node kill (EVENTS leader)", self.kill_node)]
        finally:
            for p in procs:
                p.stop()
            await close(nc)
            await anyio.to_thread.run_sync(cluster.stop)

    def _bundle(self, base_url: str) -> Path:
        folder = self.root / "faults"
        (folder / "tools").mkdir(parents=True, exist_ok=True)
        (folder / "tools" / "step.pym").write_text(APPEND_LINE)
        (folder / "tools" / "submit.pym").write_text(SUBMIT)
        (folder / "bundle.yaml").write_text(
            "name: faults\nsystem_prompt: You append lines with tools.\n"
            f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
            "constraint: {strategy: ebnf}\ntools:\n  - tools/step.pym\n  - tools/submit.pym\n"
            "termination: {terminal_tool: submit, max_turns: 8}\n"
            f"limits: {{max_duration: 60s}}\ndata_provider: workspace\nworkspace: {WORKSPACE}\n")
        return folder / "bundle.yaml"

    async def phase(self, fault: str, kill: Any) -> Phase:
        batch = list(range(self.next_index, self.next_index + self.n))
        self.next_index += self.n
        steps = {i: 3 for i in batch}
        runs: dict[int, str] = {}
        for i in batch:  # the load: every run of the batch in flight at once
            task = step_task(i, steps=steps[i], spin=self.spin, delay_ms=150)
            runs[i] = await publish_task(self.js, f"faults:b{i}", task, task_id=f"bench-{self.cfg.name}-{i}")
        await anyio.sleep(1.5)
        marks = {h.log: h.log.stat().st_size for h in self.hosts}
        killed_at, victim_runs = await kill()
        result = Phase(fault, runs=len(batch))
        await self.wait_ended(set(runs.values()), timeout=180)
        logs = {i: (await RunLog(self.js).read(r)).events for i, r in runs.items()}
        result.resume_s, result.detail = self.resume(fault, killed_at, logs, victim_runs)
        await self.count(result, runs, logs, steps)
        for path, offset in marks.items():
            text = path.read_bytes()[offset:].decode(errors="replace")
            result.fenced += len(re.findall(r"fenced\s+\(not\s+serving|lost\s+partition", text))
        return result

    # -- the faults ----------------------------------------------------------------------------------------

    async def kill_worker(self) -> tuple[float, set[str]]:
        with anyio.fail_after(60):  # mid-job: both workers hold jobs (one holds at most 2 x concurrency)
            while (await self.js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending < 5:
                await anyio.sleep(0.02)
        victim = self.workers[0]
        victim.kill9()
        at = time.time()
        await anyio.sleep(1.0)
        await anyio.to_thread.run_sync(victim.start)
        return at, set()

    async def kill_host(self) -> tuple[float, set[str]]:
        leases = await kv_entries(await fleet_kv(self.js, LEASES_BUCKET))
        holder = {parse_lease_key(k): e.value.decode() for k, e in leases.items()}  # (bundle, p) -> host
        active = await kv_entries(await fleet_kv(self.js, ACTIVE_BUCKET))
        count: dict[str, set[str]] = {}
        for key, entry in active.items():
            p, run = key.split(".", 1)
            slot = (bundle_token(entry.value.decode()), int(p[1:]))
            count.setdefault(holder.get(slot, ""), set()).add(run)
        victim = max(self.hosts, key=lambda h: len(count.get(h.id, ())))
        theirs = count.get(victim.id, set())
        victim.kill9()
        at = time.time()
        await anyio.sleep(1.0)
        await anyio.to_thread.run_sync(victim.start)
        return at, theirs

    async def kill_node(self) -> tuple[float, set[str]]:
        leader = (await self.js.stream_info(EVENTS)).cluster.leader
        i = self.cluster.index_of(leader)
        await anyio.to_thread.run_sync(self.cluster.kill, i)
        at = time.time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.first_stored_after, at)
            await anyio.sleep(2.0)
            await anyio.to_thread.run_sync(self.cluster.restart, i)
        return at, set()

    async def first_stored_after(self, at: float) -> None:
        """When EVENTS stored a message again after `at`, by the server's clock of storing it (a host
        stamps an event before its append succeeds, so event times cannot tell). Direct gets are
        answered by any replica, so this reads through the election."""
        self.stored_again = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                last = await self.js.get_last_msg(EVENTS, "events.>", direct=True)
                if last.time is not None and last.time.timestamp() > at:
                    self.stored_again = last.time.timestamp() - at
                    return
            except Exception:  # nobody answers for a moment
                pass
            await anyio.sleep(0.05)

    def resume(self, fault: str, at: float, logs: dict[int, list[ev.Event]],
               victim_runs: set[str]) -> tuple[float | None, str]:
        if fault.startswith("NATS"):
            return self.stored_again, "the first event any run stored again"
        if fault == "worker kill":
            again = [e.ts - at for events in logs.values() for e in events
                     if isinstance(e, ev.ToolRedelivered) and e.ts > at]
            if not again:
                return None, "no job of the killed worker was redelivered"
            return max(again), f"last of {len(again)} redelivered jobs; the first after {min(again):.1f} s"
        pool = [events for events in logs.values() if not victim_runs or events[0].run_id in victim_runs]
        after = [e.ts - at for events in pool for e in events if isinstance(e, HOST_STAMPED) and e.ts > at]
        what = f"{len(pool)} run(s) in flight on the killed host" if victim_runs else "any run"
        return (min(after), what) if after else (None, what)

    # -- the counts ----------------------------------------------------------------------------------------

    async def wait_ended(self, wanted: set[str], timeout: float) -> None:
        kv = await runs_kv(self.js)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                index = await kv_entries(kv)
                done = {k for k, e in index.items() if k in wanted and
                        RunIndex.decode(e.value).status in ("completed", "failed", "cancelled")}
                if done == wanted:
                    return
            except Exception:  # NATS electing a leader
                pass
            await anyio.sleep(0.5)

    async def count(self, result: Phase, runs: dict[int, str], logs: dict[int, list[ev.Event]],
                    steps: dict[int, int]) -> None:
        bucket = workspace_bucket(WORKSPACE)
        files = await kv_entries(await workspace_kv(self.js, WORKSPACE))
        info = await self.js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
        revisions = {s.split(".", 2)[2]: n for s, n in (info.state.subjects or {}).items()}
        arrivals: dict[tuple[int, int], list[float]] = {}
        for t, i, step in self.model.requests:
            arrivals.setdefault((i, step), []).append(t)
        for i, events in logs.items():
            if not events or not isinstance(events[-1], ev.RunCompleted):
                result.lost += 1
            name = f"r{i}.txt"
            written = files[name].value.decode().splitlines() if name in files else []
            result.duplicate_writes += max(0, revisions.get(name, 0) - steps[i])
            result.duplicate_writes += max(0, len(written) - len(set(written)))
            for step, reply in enumerate(e for e in events if isinstance(e, ev.ModelResponded)):
                result.repeated_calls += sum(t > reply.ts for t in arrivals.get((i, step), []))


def report(results: dict[str, list[Phase]], configs: list[Config]) -> str:
    """One block per fault, one line per configuration."""
    out = []
    for k, fault in enumerate(p.fault for p in results[configs[0].name]):
        out.append(f"{fault}:")
        for c in configs:
            p = results[c.name][k]
            resume = f"{p.resume_s:5.1f} s" if p.resume_s is not None else "  n/a  "
            out.append(f"  {c.name:18} (AckWait {c.ack_wait:2g} s, lease TTL {c.lease_ttl:g} s)  "
                       f"resumed after {resume}  runs lost {p.lost}/{p.runs}  "
                       f"duplicate effects {p.duplicate_writes}  repeated model calls {p.repeated_calls}  "
                       f"partitions dropped by live hosts {p.fenced}  [{p.detail}]")
    return "\n".join(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per phase (the load)")
    ap.add_argument("--spin", type=int, default=1_500_000, help="loop iterations per tool step")
    ap.add_argument("--only", choices=("new", "old"))
    args = ap.parse_args()
    configs = [Config("new defaults", 3.0, 2.0), Config("previous defaults", 30.0, 6.0)]
    if args.only:
        configs = [c for c in configs if c.name.startswith(args.only)]
    results: dict[str, list[Phase]] = {}
    with tempfile.TemporaryDirectory(prefix="sa-bench-faults-") as tmp:
        for c in configs:
            t0 = time.monotonic()
            results[c.name] = await Bench(c, Path(tmp) / c.name.replace(" ", "-"), args.runs, args.spin).run()
            print(f"[{c.name}: {time.monotonic() - t0:.0f} s]", flush=True)
    print(report(results, configs))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.ERROR)
    anyio.run(main, backend="asyncio")
