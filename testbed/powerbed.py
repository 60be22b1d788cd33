"""Power loss under load: a 3-node NATS cluster whose every node stores JetStream on its own `testbed.lazyfs`
mount, the fleet on it (two `sa host`, two `sa worker`, the scripted model), and the faults a disk can
suffer. What `bench/powerloss.py` and tests/system/test_powerloss.py run.

    bed = await PowerBed(root, responder=model, sync="always").astart()
    result = await power_phase(bed, model, "power loss (all)", lose_power_all(), Load(bed, seed=1),
                               runs=20, window=4.0)
    result.counts (testbed.checker), result.notes["acked_lost"], result.notes["audit"]

Why loopback, not the network-namespace machines of the partition bed: a power loss is a process killed and
its disk's unsynced writes dropped; neither needs a link of its own. The one fault that does (a node cut
off while another loses power) is played by SIGSTOP, which freezes a node as a partition would and more
(its timers too). The cluster is `runtime.nats.cluster.LocalCluster` on deploy/nats/nats.conf itself, so
the shipped `sync_interval: always` is what is measured; `sync="default"` runs the same file with that
line removed (nats-server's own default: acknowledge from the page cache, sync every two minutes).

Before any load the bed syncs every mount (`LazyFS.command("sync")`): the cluster has been up for a while
and its periodic sync has run, so what a power loss can take is what was written since, as on a cluster in
service. The fleet's processes run on (other machines, in the story): only the NATS nodes lose power.

The faults (`Fault` as in `testbed.netfaults`: the bed in, (recovery seconds, notes) out):

* `lose_power_all`: every node at once: SIGKILL every nats-server, drop every mount's unsynced writes,
  power on (mount, restart) after `off_s`.
* `lose_power_paused`: one node (the EVENTS leader) loses power while another is frozen (SIGSTOP) and
  misses writes; the leader powers on, then the frozen node resumes (Jepsen's split-brain recipe: two
  nodes, each missing some acknowledged writes, make a majority).
* `corrupt_block`: one node (not the EVENTS leader) stopped (SIGKILL), the last block file of its EVENTS
  replica truncated to half or one bit of it flipped, restarted, then made EVENTS' leader (a step-down that
  prefers it), so that what it serves and appends to from then on is its own copy.

Each phase also counts acknowledged events lost (`acked_lost`): events every run's log held when read by
the load driver just before the fault (so stored and acknowledged), missing or different afterwards; and
`sa audit`'s findings (`runtime.client.audit`) over every run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import anyio

from runtime.client.audit import audit
from runtime.log import RunLog
from runtime.nats.cluster import CONFIG_TEMPLATE, LocalCluster
from runtime.nats.connection import close, connect
from runtime.nats.retry import retrying
from runtime.nats.subjects import EVENTS
from runtime.nats.topology import ensure_topology
from runtime.testing import Responder, ScriptedModelServer
from testbed.checker import check, read_stores
from testbed.fleet import SaProcess, StepModel
from testbed.lazyfs import LazyFS
from testbed.netfaults import Load, Result, wait_ended
from testbed.scripts import APPEND_LINE, SUBMIT

SYNC_LINE = re.compile(r"^\s*sync_interval:.*$", re.M)
WORKSPACE = "wsnet"  # `testbed.netfaults.Load` publishes to agent `net`: the bundle is named so
PowerFault = Callable[["PowerBed"], Awaitable[tuple[float | None, dict[str, Any]]]]
log = logging.getLogger("testbed")


def nats_config(root: Path, sync: str) -> Path:
    """deploy/nats/nats.conf as shipped (`sync="always"`), or with its `sync_interval` line replaced
    (`"default"`: removed; anything else: that interval)."""
    if sync == "always":
        return CONFIG_TEMPLATE
    text = CONFIG_TEMPLATE.read_text()
    if not SYNC_LINE.search(text):
        raise RuntimeError(f"{CONFIG_TEMPLATE} has no sync_interval line to change")
    replaced = SYNC_LINE.sub("" if sync == "default" else f"  sync_interval: {sync}", text)
    path = root / f"nats-sync-{sync}.conf"
    path.write_text(replaced)
    return path


class PowerBed:
    """See the module docstring. `sync`: ``always`` (the shipped config) or ``default`` (nats-server's)."""

    def __init__(self, root: Path, *, responder: Responder, sync: str = "always", hosts: int = 2,
                 workers: int = 2, partitions: int = 8, lease_ttl: float = 2.0, tool_ack_wait: float = 3.0,
                 task_ack_wait: float = 3.0, strict: bool = False) -> None:
        self.root, self.responder, self.sync = root, responder, sync
        self.counts = (hosts, workers)
        self.partitions, self.lease_ttl = partitions, lease_ttl
        self.tool_ack_wait, self.task_ack_wait = tool_ack_wait, task_ack_wait
        self.cluster = LocalCluster(3, root=root / "nats", config=nats_config(root, sync))
        self.disks = [LazyFS(root / "disks" / n.name, n.store_dir, strict=strict,
                             log=root / f"{n.name}.fs.log") for n in self.cluster.nodes]
        self.model: ScriptedModelServer | None = None
        self.hosts: list[SaProcess] = []
        self.workers: list[SaProcess] = []
        self.nc: Any = None
        self.js: Any = None

    async def astart(self, timeout: float = 120.0) -> PowerBed:
        try:
            for disk in self.disks:
                await anyio.to_thread.run_sync(disk.start)
            await self.cluster.astart(60.0)
            self.nc = await connect(self.cluster.urls, name="powerbed-driver")
            self.js = js = self.nc.jetstream()
            await retrying(lambda: ensure_topology(js, replicas=3, partitions=self.partitions,
                                                   tool_ack_wait=self.tool_ack_wait),
                           what="making the bed's topology", give_up=60.0, level=logging.INFO)
            self.model = ScriptedModelServer(responder=self.responder).start()
            bundle = self.write_bundle(self.model.base_url)
            self.hosts = [SaProcess(f"h{i}", ["host", str(bundle), "--lease-ttl", f"{self.lease_ttl:g}",
                                              "--task-ack-wait", f"{self.task_ack_wait:g}"],
                                    self.cluster.url, self.root / f"h{i}.log", "sa host: serving")
                          for i in range(self.counts[0])]
            self.workers = [SaProcess(f"w{i}", ["worker", "--bundle", str(bundle), "--concurrency", "2",
                                                "--ack-wait", f"{self.tool_ack_wait:g}"],
                                      self.cluster.url, self.root / f"w{i}.log", "serving")
                            for i in range(self.counts[1])]
            for p in self.hosts + self.workers:
                p.start()
            for p in self.hosts + self.workers:
                await anyio.to_thread.run_sync(p.wait_ready, timeout)
            self.sync_disks()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        return self

    def write_bundle(self, base_url: str) -> Path:
        folder = self.root / "bundle"
        (folder / "tools").mkdir(parents=True, exist_ok=True)
        (folder / "tools" / "step.pym").write_text(APPEND_LINE)
        (folder / "tools" / "submit.pym").write_text(SUBMIT)
        (folder / "bundle.yaml").write_text(
            "name: net\nsystem_prompt: You append lines with tools.\n"
            f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
            "constraint: {strategy: ebnf}\ntools:\n  - tools/step.pym\n  - tools/submit.pym\n"
            "termination: {terminal_tool: submit, max_turns: 8}\n"
            f"limits: {{max_duration: 120s}}\ndata_provider: workspace\nworkspace: {WORKSPACE}\n")
        return folder / "bundle.yaml"

    def sync_disks(self) -> None:
        """Every mount's unsynced writes made durable (a periodic sync that just ran)."""
        for disk in self.disks:
            disk.command("sync")

    # -- faults ------------------------------------------------------------------------------------------

    def power_off(self, nodes: list[int]) -> dict[str, Any]:
        """Every node of `nodes` loses power at once: SIGKILL them all, then drop each mount's unsynced
        writes and unmount; what the file systems dropped, summed (`by_kind`: bytes by kind of file)."""
        for i in nodes:
            self.cluster.kill(i)
        lost: dict[str, Any] = {}
        kinds: dict[str, int] = {}
        for i in nodes:
            for k, v in self.disks[i].crash().items():
                lost[k] = lost.get(k, 0) + v
            for k, v in self.disks[i].lost_by_kind[-1].items():
                kinds[k] = kinds.get(k, 0) + v
        lost["by_kind"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
        return lost

    async def power_on(self, nodes: list[int], timeout: float = 60.0) -> None:
        """Mount and restart `nodes` (together: alone, a node waits for a quorum to say it is healthy)."""
        for i in nodes:
            await anyio.to_thread.run_sync(self.disks[i].start)
        async with anyio.create_task_group() as tg:
            for i in nodes:
                tg.start_soon(functools.partial(anyio.to_thread.run_sync, self.cluster.restart, i, timeout))

    def signal(self, i: int, sig: signal.Signals) -> None:
        process = self.cluster.nodes[i].process
        assert process is not None, f"node {i} is not running"
        os.kill(process.pid, sig)

    async def events_leader(self) -> int:
        info = await read_stores(lambda: self.js.stream_info(EVENTS), "who leads EVENTS")
        return self.cluster.index_of(str(info.cluster.leader))

    async def make_leader(self, i: int, tries: int = 6) -> bool:
        """Move EVENTS' leadership to node `i` (a step-down naming it preferred, repeated while another is
        elected); whether it leads."""
        name = self.cluster.nodes[i].name
        body = json.dumps({"placement": {"preferred": name}}).encode()
        for _ in range(tries):
            if await self.events_leader() == i:
                return True
            with anyio.move_on_after(10):
                try:
                    await self.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{EVENTS}", body, timeout=5)
                except Exception as e:  # no leader for a moment: asked again
                    log.info("powerbed: step-down of EVENTS: %r", e)
            await anyio.sleep(1.0)
        return await self.events_leader() == i

    def events_blocks(self, i: int) -> list[Path]:
        """Node `i`'s EVENTS block files, oldest first."""
        found = self.cluster.nodes[i].store_dir.glob("jetstream/*/streams/EVENTS/msgs/*.blk")
        return sorted(found, key=lambda p: int(p.stem))

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.nc is not None:
                with anyio.move_on_after(5):
                    await close(self.nc)
                self.nc = None
            await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        for p in self.hosts + self.workers:
            try:
                p.stop()
            except Exception:
                pass
        if self.model is not None:
            self.model.close()
        for i in range(len(self.cluster.nodes)):  # a frozen node would not hear SIGTERM
            if self.cluster.nodes[i].running:
                self.signal(i, signal.SIGCONT)
        self.cluster.stop()
        for disk in self.disks:
            disk.stop()


# -- the faults ------------------------------------------------------------------------------------------


def lose_power_all(off_s: float = 1.0) -> PowerFault:
    """See the module docstring. Recovery: from power on until EVENTS stored an event again."""

    async def fault(bed: PowerBed) -> tuple[float | None, dict[str, Any]]:
        nodes = list(range(len(bed.cluster.nodes)))
        lost = await anyio.to_thread.run_sync(bed.power_off, nodes)
        await anyio.sleep(off_s)
        await bed.power_on(nodes)
        return await _stored_again(bed), {"fs_lost": lost}

    return fault


def lose_power_paused(paused_s: float = 2.0, off_s: float = 1.0) -> PowerFault:
    """See the module docstring."""

    async def fault(bed: PowerBed) -> tuple[float | None, dict[str, Any]]:
        leader = await bed.events_leader()
        frozen = (leader + 1) % len(bed.cluster.nodes)
        bed.signal(frozen, signal.SIGSTOP)
        try:
            await anyio.sleep(paused_s)  # the other two store and acknowledge what the frozen one misses
            lost = await anyio.to_thread.run_sync(bed.power_off, [leader])
            await anyio.sleep(off_s)
            await bed.power_on([leader])  # with the third node, a quorum: it comes back healthy
        finally:
            bed.signal(frozen, signal.SIGCONT)
        return await _stored_again(bed), {"fs_lost": lost, "powered_off": bed.cluster.nodes[leader].name,
                                          "frozen": bed.cluster.nodes[frozen].name}

    return fault


def corrupt_block(how: str, seed: int = 0) -> PowerFault:
    """See the module docstring: `how` is ``truncate`` or ``bitflip``."""

    async def fault(bed: PowerBed) -> tuple[float | None, dict[str, Any]]:
        leader = await bed.events_leader()
        victim = (leader + 1) % len(bed.cluster.nodes)
        await anyio.to_thread.run_sync(bed.cluster.kill, victim)
        blocks = bed.events_blocks(victim)
        if not blocks:
            raise RuntimeError(f"node {victim} holds no EVENTS block file")
        block = blocks[-1]
        size = block.stat().st_size
        if how == "truncate":
            os.truncate(block, size // 2)
            what = f"{block.name} truncated from {size} to {size // 2} bytes"
        elif how == "bitflip":
            at = random.Random(seed).randrange(size)
            with open(block, "r+b") as f:
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << random.Random(seed + 1).randrange(8))]))
            what = f"{block.name}: one bit flipped at byte {at} of {size}"
        else:
            raise ValueError(f"corrupt_block: how is truncate or bitflip, not {how!r}")
        for disk in bed.disks:
            disk.command("sync")  # the damage is on disk, not a write a crash could undo
        await anyio.to_thread.run_sync(bed.cluster.restart, victim, 60.0)
        recovery = await _stored_again(bed)
        leads = await bed.make_leader(victim)  # what it serves from now on is its own (damaged) copy
        return recovery, {"node": bed.cluster.nodes[victim].name, "damage": what, "then_led_events": leads}

    return fault


async def _stored_again(bed: PowerBed, timeout: float = 60.0) -> float | None:
    """Seconds until EVENTS' last sequence moves again (None: not within `timeout`)."""
    t = time.monotonic()
    before = None
    while time.monotonic() - t < timeout:
        with anyio.move_on_after(2):
            try:
                last = (await bed.js.stream_info(EVENTS)).state.last_seq
                if before is None:
                    before = last
                elif last > before:
                    return round(time.monotonic() - t, 2)
            except Exception:
                pass
        await anyio.sleep(0.1)
    return None


def load(bed: PowerBed, seed: int) -> Load:
    """The partition bed's load driver (`testbed.netfaults.Load`), on this bed (it uses only `js`)."""
    return Load(cast(Any, bed), seed)


# -- a phase ---------------------------------------------------------------------------------------------


async def snapshot(js: Any, batch: dict[int, tuple[str, int]]) -> dict[str, list[tuple[int, str, float]]]:
    """Every run's log as (seq, kind, ts), read now: what the stream has acknowledged so far."""
    from runtime import events as ev

    out = {}
    for run_id, _ in list(batch.values()):
        events = (await RunLog(js).read(run_id, timeout=5.0)).events
        out[run_id] = [(e.seq, ev.kind_of(e), e.ts) for e in events]
    return out


def acked_lost(before: dict[str, list[tuple[int, str, float]]],
               after: dict[str, list[tuple[int, str, float]]]) -> int:
    """Events of `before` that `after` does not hold at the same place (gone, or replaced by another)."""
    return sum(len(set(events) - set(after.get(run_id, []))) for run_id, events in before.items())


async def power_phase(bed: PowerBed, model: StepModel, name: str, fault: PowerFault, load: Load, *,
                      runs: int, window: float, timeout: float = 180.0) -> Result:
    """Publish `runs` tasks over `window` s; a third of the way in, read every run's log and inject `fault`;
    wait until every run ended (or `timeout`: the runs left are counted, `stuck`); count."""
    from runtime.bundle import load_bundle

    batch: dict[int, tuple[str, int]] = {}
    out = Result(name, None)
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(load.publish, batch, runs, window)
        await anyio.sleep(window / 3)
        before = await snapshot(bed.js, batch)
        out.notes["acked_before"] = sum(len(v) for v in before.values())
        out.recovery_s, notes = await fault(bed)
        out.notes.update(notes)
    out.notes["stuck"] = 0
    try:
        await wait_ended(bed.js, {run_id for run_id, _ in batch.values()}, timeout)
    except AssertionError as e:
        out.notes["stuck"] = int(str(e).split(" ", 1)[0])
        out.details.append(str(e)[:2000])
    out.ended_s = round(time.monotonic() - t0, 1)
    after = await read_stores(lambda: snapshot(bed.js, batch), "every run's log")
    out.notes["acked_lost"] = acked_lost(before, after)
    out.counts = await check(bed.js, batch, model, bundle=load_bundle(bed.root / "bundle" / "bundle.yaml"),
                             workspace=WORKSPACE, details=out.details)
    report = await read_stores(lambda: audit(bed.js), "the audit")
    wanted = {run_id for run_id, _ in batch.values()}
    findings = [(r, f) for r, f in report.findings if r.run_id in wanted]
    out.notes["audit"] = len(findings)
    out.details.extend(f"audit: {r.run_id}: {f.fault}: {f.detail}" for r, f in findings[:20])
    return out


__all__ = ["PowerBed", "PowerFault", "acked_lost", "corrupt_block", "load", "lose_power_all",
           "lose_power_paused", "nats_config", "power_phase", "snapshot"]
