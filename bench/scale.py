"""Scale figures, each beside a same-run baseline (figures and ratios; nothing asserts).

    .venv/bin/python bench/scale.py [--runs 100] [--events 40] [--replay 50000] [--jobs 2000] [--skip-tools]
                                    [--only-fleet] [--idle-agents 100000]

Measured here (no agent host needed):
* event appends/s the way the host appends: one writer per run, each append carrying the expected last
  subject sequence of its run (`occ_headers`) plus a Msg-Id and waiting for its ack, many runs
  concurrently, beside raw acked `js.publish`/s with the same concurrency and payloads, and beside
  pipelined `publish_async` (the ceiling of one Python process). Aim: appends ≥ 0.5x raw.
* replay events/s of one long run through `runtime.log.RunLog.read` (ordered consumer, callback mode,
  decoding every event). Aim: ≥ 50k/s.
* sandboxed tool calls/s end to end with 1, 2 and 4 `sa worker` processes beside Monty-alone runs/s
  (bench/worker.py's machinery). Aim: ≥ 1,000/s with 2 workers.

With agent hosts (`sa host` and `sa worker` processes on a fresh server with 8 partitions, the scripted
model server; `--skip-fleet` leaves them out, `--only-fleet` runs only them):
* RSS of one host after serving N distinct agents one short run each (`--idle-agents`, default 100,000:
  every agent an actor once, now idle), beside its RSS before the first task and at 1,000 and 10,000 on the
  way; what each further 1,000 idle agents add (the slope past the last reading but one). Aim (issue #16):
  <= 500 MB at 100,000 agents; with fewer (`--idle-agents 10000` for a quick look) the figure at 100,000 is
  projected from the slope. 100,000 runs take ~4.5 minutes on this 2-core box at ~385 runs/s (longer when
  it is loaded); progress goes to stderr every 10 s.
* task latency p50/p99 (publish -> the run ended in the `runs` index) with 1,000 agents given a task
  at once, through 2 hosts and 2 workers, zero-latency model.
* takeover time after SIGKILL of one of two hosts (lease TTL 6 s, the previous default): until every
  partition is served again, and until the first of the dead host's runs appends again. Aim: < 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.worker import TOOL, end_to_end, monty_alone, start_workers, stop  # noqa: E402
from runtime import events as ev  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.kv import fleet_kv, kv_entries  # noqa: E402
from runtime.nats.records import RunIndex  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.subjects import (  # noqa: E402
    EVENTS,
    HDR_MSG_ID,
    LEASES_BUCKET,
    RUNS_BUCKET,
    event_subject,
    occ_headers,
    parse_lease_key,
    partition_of,
    run_events_filter,
    task_subject,
)
from runtime.nats.topology import ensure_topology  # noqa: E402
from testbed.scripts import SUBMIT  # noqa: E402

Row = tuple[str, str, str]  # label, figure, comparison


def event(run: str, seq: int) -> ev.Event:
    """A typical small event (~300 B of msgpack), as a tool result would append."""
    return ev.ToolCompleted(run_id=run, seq=seq, ts=time.time(), actor="bench", call_id=f"{run}/{seq}.0",
                            tool="calculator", output={"value": seq, "text": "the result is " + "x" * 160},
                            duration_ms=1.5)


# ---------------------------------------------------------------------------------------------------------
# appends with optimistic concurrency vs raw publishes
# ---------------------------------------------------------------------------------------------------------


async def occ_appends(js, tag: str, runs: int, per_run: int) -> float:
    """Appends/s: `runs` writers, each appending `per_run` events to its own run, OCC + Msg-Id, acked."""

    async def writer(r: int) -> None:
        run = f"{tag}-{r}"
        last = 0
        for seq in range(per_run):
            data = ev.encode(event(run, seq))
            headers = occ_headers("bench", run, last, f"{run}/{seq}")
            ack = await js.publish(event_subject("bench", run, "tool.completed"), data, headers=headers)
            last = ack.seq

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(r) for r in range(runs)))
    return runs * per_run / (time.perf_counter() - t0)


async def raw_publishes(js, tag: str, runs: int, per_run: int) -> float:
    """Publishes/s with the same concurrency, payloads and acks, without OCC headers or Msg-Id."""

    async def writer(r: int) -> None:
        run = f"{tag}-{r}"
        for seq in range(per_run):
            await js.publish(event_subject("bench", run, "tool.completed"), ev.encode(event(run, seq)))

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(r) for r in range(runs)))
    return runs * per_run / (time.perf_counter() - t0)


async def pipelined(js, tag: str, n: int, window: int = 64) -> float:
    """publish_async with a window of un-acked publishes: one process's ceiling (research/nats.md §5)."""
    t0 = time.perf_counter()
    pending = []
    for seq in range(n):
        pending.append(await js.publish_async(event_subject("bench", tag, "tool.completed"),
                                              ev.encode(event(tag, seq))))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return n / (time.perf_counter() - t0)


async def appends(js, runs: int, per_run: int, rounds: int = 3) -> list[Row]:
    occ, raw, pipe = [], [], []
    for i in range(rounds):  # interleaved, so both see the same machine noise
        raw.append(await raw_publishes(js, f"raw{i}", runs, per_run))
        occ.append(await occ_appends(js, f"occ{i}", runs, per_run))
        pipe.append(await pipelined(js, f"pipe{i}", runs * per_run))
    o, r, p = statistics.median(occ), statistics.median(raw), statistics.median(pipe)
    return [
        (f"event appends/s (OCC + Msg-Id, {runs} runs)", f"{o:,.0f}", f"{o / r:.2f}x raw acked publish"),
        (f"raw acked js.publish/s ({runs} concurrent)", f"{r:,.0f}", "1.00x"),
        ("pipelined publish_async/s (window 64)", f"{p:,.0f}", f"appends = {o / p:.2f}x of it"),
    ]


# ---------------------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------------------


async def replay(js, n: int, rounds: int = 3) -> list[Row]:
    """Events/s reading one run of `n` events back with the replay reader (decode included)."""
    from runtime.log import RunLog

    run = "replay1"
    pending = []
    for seq in range(n):  # fill fast: these are not what is measured
        pending.append(await js.publish_async(event_subject("bench", run, "tool.completed"),
                                              ev.encode(event(run, seq))))
        if len(pending) >= 256:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        log = await RunLog(js).read(run, "bench", timeout=120)
        rates.append(len(log.events) / (time.perf_counter() - t0))
        assert len(log.events) == n and log.events[-1].seq == n - 1
    rate = statistics.median(rates)
    return [(f"replay events/s (RunLog.read, {n:,} events)", f"{rate:,.0f}",
             f"{rate / 50_000:.2f}x the 50k aim")]


# ---------------------------------------------------------------------------------------------------------
# sandboxed tool calls through workers
# ---------------------------------------------------------------------------------------------------------


async def tool_calls(js, url: str, tmp: Path, jobs: int, concurrency: int) -> list[Row]:
    tools = tmp / "add.pym"
    tools.write_text(TOOL)
    alone = await monty_alone(tools, jobs, concurrency)
    rows: list[Row] = [("Monty alone runs/s (in-process)", f"{alone:,.0f}", "1.00x")]
    for k in (1, 2, 4):
        procs = start_workers(url, tools, k, concurrency, tmp)
        try:
            await end_to_end(js, f"warm{k}", 200)
            rate, spread = await end_to_end(js, f"run{k}", jobs)
        finally:
            stop(procs)
        rows.append((f"tool calls/s, {k} worker process{'es' if k > 1 else ''}", f"{rate:,.0f}",
                     f"{rate / alone:.2f}x Monty alone; per worker {sorted(spread.values())}"))
    return rows


# ---------------------------------------------------------------------------------------------------------
# figures that need agent hosts: `sa host` / `sa worker` processes on a fresh server with 8 partitions
# ---------------------------------------------------------------------------------------------------------

NOOP = '''\
"""Do one step of work."""
from grail import Input

n: int = Input("n")

{"n": n}
'''
CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


def fleet_bundle(root: Path, base_url: str) -> Path:
    folder = root / "bench"
    (folder / "tools").mkdir(parents=True, exist_ok=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    (folder / "tools" / "noop.pym").write_text(NOOP)
    (folder / "bundle.yaml").write_text(
        "name: bench\nsystem_prompt: You do steps.\n"
        f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
        "constraint: {strategy: ebnf}\ntools:\n  - tools/noop.pym\n  - tools/submit.pym\n"
        "termination: {terminal_tool: submit, max_turns: 30}\n")
    return folder / "bundle.yaml"


def responder(delay: float = 0.0):
    """`steps N` tasks: N noop calls, one per turn, then submit; anything else submits at once."""
    from runtime.testing import Reply, hermes_call

    def reply(body):
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
        steps = int(task.split()[1]) if task.startswith("steps ") else 0
        name, args = ("noop", {"n": done}) if done < steps else ("submit", {"answer": str(done)})
        return Reply.of_text(hermes_call(name, args), delay=delay)

    return reply


def spawn(args: list[str], url: str, log: Path, ready: str = "serving",
          timeout: float = 120) -> subprocess.Popen:
    out = open(log, "ab")  # the child keeps its own copy of the descriptor
    proc = subprocess.Popen([*CLI, *args], env={**os.environ, "NATS_URL": url}, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{args[0]} did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Fleet:
    """A fresh embedded server (8 partitions), the scripted model, N hosts and M workers as processes."""

    def __init__(self, tmp: Path, hosts: int, workers: int, delay: float = 0.0, lease_ttl: float = 6.0,
                 max_runs: int = 256) -> None:
        self.tmp, self.n_hosts, self.n_workers, self.delay = tmp, hosts, workers, delay
        self.lease_ttl, self.max_runs = lease_ttl, max_runs
        self.hosts: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []

    async def __aenter__(self) -> Fleet:
        from runtime.testing import ScriptedModelServer

        self.tmp.mkdir(parents=True, exist_ok=True)
        self.server = EmbeddedNats(self.tmp / "nats").start()
        self.model = ScriptedModelServer(responder=responder(self.delay), record=False).start()
        self.nc = await connect(self.server.url)
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, partitions=8)
        self.ended: dict[str, float] = {}  # run id -> its `runs` entry's update time once it ended
        await self.nc.subscribe(f"$KV.{RUNS_BUCKET}.>", cb=self._indexed)
        bundle = fleet_bundle(self.tmp, self.model.base_url)
        for i in range(self.n_workers):
            self.workers.append(spawn(["worker", "--bundle", str(bundle), "--concurrency", "16"],
                                      self.server.url, self.tmp / f"worker{i}.log"))
        for i in range(self.n_hosts):
            self.hosts.append(spawn(["host", str(bundle), "--lease-ttl", str(self.lease_ttl), "--max-runs",
                                     str(self.max_runs)], self.server.url, self.tmp / f"host{i}.log",
                                    "sa host: serving"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.hosts + self.workers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.hosts + self.workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        await close(self.nc)
        self.model.close()
        self.server.stop()

    async def publish(self, agents: list[str], task: str) -> dict[str, tuple[str, float]]:
        """One task per agent, pipelined; agent -> (run id, publish time)."""
        from runtime.commands import run_id_for

        sent: dict[str, tuple[str, float]] = {}
        pending = []
        for a in agents:
            sent[a] = (run_id_for(a, a), time.time())
            data = f'{{"input": "{task}", "task_id": "{a}"}}'.encode()
            headers = {HDR_MSG_ID: a}
            pending.append(await self.js.publish_async(task_subject(a), data, headers=headers))
            if len(pending) >= 256:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return sent

    async def _indexed(self, msg) -> None:
        """Every write to the `runs` index, as the host makes it (a core subscription: no consumer, and
        no read of the whole bucket per poll, which at 100,000 runs cost the bench seconds each time)."""
        if msg.data:  # not a delete or purge marker
            ix = RunIndex.decode(msg.data)
            if ix.status in ("completed", "failed", "cancelled"):
                self.ended.setdefault(msg.subject.rsplit(".", 1)[1], ix.updated)

    async def wait_ended(self, runs: set[str], timeout: float,
                         progress: Callable[[int], None] | None = None) -> dict[str, float]:
        """run id -> the `runs` index's update time once it ended; `progress(ended so far)` every
        `PROGRESS_S` while it waits."""
        deadline = time.monotonic() + timeout
        report = time.monotonic() + PROGRESS_S
        while time.monotonic() < deadline:
            done = sum(r in self.ended for r in runs)
            if done == len(runs):
                break
            if progress is not None and time.monotonic() >= report:
                progress(done)
                report += PROGRESS_S
            await asyncio.sleep(0.5)
        return {r: self.ended[r] for r in runs if r in self.ended}


PROGRESS_S = 10.0
IDLE_AIM_MB, IDLE_AIM_AGENTS = 500, 100_000
IDLE_SETTLE_S = 2.0  # after the last run ended, before RSS is read: the host's last acks and index writes


async def idle_agents_rss(tmp: Path, agents: int) -> list[Row]:
    """RSS of one `sa host` process after serving `agents` distinct agents (one short run each: one model
    call, one tool job), so every agent has been an actor once and is now idle; beside its RSS before the
    first task, and read at 1,000 and 10,000 agents on the way (the tasks are published in stages, each
    stage waited for, so every reading is of an idle host). The host runs with the default --max-runs
    (256): a stage's tasks flow through it in bounded batches (with 4,096 held at once they mostly waited
    on one model client's connection pool: 2 runs/s).

    What an idle agent costs is the slope past the first stages (the first 1,000 runs grow the host by
    its working set: buffers, connection pools, bounded caches filling); the aim is for 100,000 agents,
    measured when `agents` reaches it and otherwise projected from that slope."""
    stages = [n for n in (1_000, 10_000) if n < agents] + [agents]
    async with Fleet(tmp / "idle", hosts=1, workers=2) as fleet:
        pid = fleet.hosts[0].pid
        await asyncio.sleep(IDLE_SETTLE_S)
        before = rss_mb(pid)
        readings: list[tuple[int, float]] = []
        served, t0 = 0, time.monotonic()
        for stage in stages:
            sent = await fleet.publish([f"bench:idle{i}" for i in range(served, stage)], "go")

            def progress(done: int, base: int = served) -> None:
                ran = base + done
                print(f"  idle agents: {ran:,} of {agents:,} ended, {ran / (time.monotonic() - t0):,.0f} "
                      f"runs/s, host RSS {rss_mb(pid):,.0f} MB", file=sys.stderr, flush=True)

            ended = await fleet.wait_ended({r for r, _ in sent.values()}, timeout=max(120, len(sent) / 20),
                                           progress=progress)
            served += len(ended)
            await asyncio.sleep(IDLE_SETTLE_S)
            readings.append((served, rss_mb(pid)))
            if len(ended) < len(sent):
                break  # a stage that did not finish: the readings so far are all there is
        took = time.monotonic() - t0
    return idle_rows(before, readings, agents, served / took)


def idle_rows(before: float, readings: list[tuple[int, float]], wanted: int, rate: float) -> list[Row]:
    """The idle-agents figures: RSS before, at each stage, the slope per 1,000 agents over the last span
    (past the first stage), and the aim at 100,000 agents met or missed (projected from the slope below
    it)."""
    rows: list[Row] = [("host RSS before the first task", f"{before:,.0f} MB", "sa host, one bundle, leases")]
    for n, mb in readings:
        rows.append((f"host RSS, {n:,} agents served, now idle", f"{mb:,.0f} MB",
                     f"+{mb - before:,.0f} MB over before the first task"))
    n, mb = readings[-1]
    if len(readings) > 1:
        n0, mb0 = readings[-2]
        slope = (mb - mb0) / (n - n0) * 1000
        span = f"from {n0:,} to {n:,} agents"
    else:
        slope = (mb - before) / max(n, 1) * 1000
        span = "over all of them, the working set included"
    if n >= IDLE_AIM_AGENTS:
        at_aim, how = mb, "measured"
    else:
        at_aim, how = mb + max(slope, 0.0) * (IDLE_AIM_AGENTS - n) / 1000, "projected"
    verdict = "met" if at_aim <= IDLE_AIM_MB else "missed"
    if n < wanted:  # runs that never ended are a failure of their own, not a memory figure
        verdict = f"not judged: only {n:,} of {wanted:,} runs ended"
    rows.append(("host RSS per 1,000 more idle agents", f"{slope:+,.2f} MB", f"{span} ({rate:,.0f} runs/s)"))
    rows.append((f"host RSS at {IDLE_AIM_AGENTS:,} agents ({how})", f"{at_aim:,.0f} MB",
                 f"aim <= {IDLE_AIM_MB} MB: {verdict}"))
    return rows


async def task_latency(tmp: Path, agents: int) -> list[Row]:
    """Task latency (publish -> run ended, as the runs index records it) with `agents` agents each given
    one task at once: a burst of `agents` concurrent runs through 2 hosts and 2 workers, zero-latency
    scripted model, one model call and one tool job per run."""
    async with Fleet(tmp / "latency", hosts=2, workers=2) as fleet:
        await fleet.publish([f"bench:warm{i}" for i in range(50)], "go")
        await asyncio.sleep(3)
        sent = await fleet.publish([f"bench:lat{i}" for i in range(agents)], "go")
        ended = await fleet.wait_ended({r for r, _ in sent.values()}, timeout=300)
    lat = sorted(ended[r] - t for r, t in sent.values() if r in ended)
    if not lat:
        return [(f"task latency, {agents:,} active agents", "no run ended", "")]
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return [(f"task latency p50/p99, {agents:,} agents at once", f"{p50:.2f} / {p99:.2f} s",
             f"2 hosts, 2 workers; all {len(lat)} ended within {lat[-1]:.1f} s "
             f"({len(lat) / lat[-1]:,.0f} runs/s)")]


async def takeover_time(tmp: Path) -> list[Row]:
    """Seconds from SIGKILL of a host until the other serves every partition, and until the first of the
    dead host's runs appends again (lease TTL 6 s here, the previous default, to compare with earlier
    figures; `bench/faults.py` measures the current default). Runs take 20 steps (max_turns 30 in the
    bench bundle), so the dead host's runs are still in flight when it is killed."""
    async with Fleet(tmp / "takeover", hosts=2, workers=1, delay=0.3) as fleet:
        kv = await fleet_kv(fleet.js, LEASES_BUCKET)
        while True:  # both hosts hold their share
            holders = {e.value.decode() for e in (await kv_entries(kv)).values()}
            if len(holders) == 2 and len(await kv_entries(kv)) == 8:
                break
            await asyncio.sleep(0.2)
        sent = await fleet.publish([f"bench:to{i}" for i in range(40)], "steps 20")
        await asyncio.sleep(3.0)  # runs in flight everywhere
        victim = fleet.hosts[0]
        log = (fleet.tmp / "host0.log").read_text()
        victim_id = log.split(" as ", 1)[1].split(";")[0]
        leases = {k: e.value.decode() for k, e in (await kv_entries(kv)).items()}
        theirs = {slot[1] for k, h in leases.items() if h == victim_id and (slot := parse_lease_key(k))}
        runs = [r for a, (r, _) in sent.items() if partition_of(a, 8) in theirs]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        t0 = time.monotonic()
        last = {r: (await read_last(fleet.js, r, a)) for a, (r, _) in sent.items() if r in runs}
        served = resumed = None
        while time.monotonic() - t0 < 60 and (served is None or resumed is None):
            if served is None:
                leases = {k: e.value.decode() for k, e in (await kv_entries(kv)).items()}
                if len(leases) == 8 and victim_id not in leases.values():
                    served = time.monotonic() - t0
            if resumed is None:
                for a, (r, _) in sent.items():
                    if r in last and await read_last(fleet.js, r, a) > last[r]:
                        resumed = time.monotonic() - t0
                        break
            await asyncio.sleep(0.1)
    def fmt(x: float | None) -> str:
        return f"{x:.1f} s" if x is not None else "> 60 s"

    return [("takeover: partitions served again", fmt(served), f"aim < 10 s; {len(theirs)} of 8 partitions, "
             f"{len(runs)} runs in flight on the killed host"),
            ("takeover: first of its runs appends again", fmt(resumed), f"lease TTL {fleet.lease_ttl:g} s")]


async def read_last(js, run_id: str, agent: str) -> int:
    """The stream sequence of a run's last event (0 if none)."""
    try:
        msg = await js.get_last_msg(EVENTS, run_events_filter(agent, run_id), direct=True)
    except Exception:
        return 0
    return msg.seq


# ---------------------------------------------------------------------------------------------------------


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="concurrent runs (writers) for the append figures")
    ap.add_argument("--events", type=int, default=40, help="events appended per run")
    ap.add_argument("--replay", type=int, default=50_000, help="events in the replayed run")
    ap.add_argument("--jobs", type=int, default=2000, help="tool jobs per worker measurement")
    ap.add_argument("--concurrency", type=int, default=16, help="jobs in flight per worker process")
    ap.add_argument("--skip-tools", action="store_true", help="skip the worker figures (they take longest)")
    ap.add_argument("--skip-fleet", action="store_true", help="skip the figures that start hosts")
    ap.add_argument("--idle-agents", type=int, default=100_000,
                    help="distinct agents served before measuring the host's RSS (the issue's figure; "
                         "~4.5 minutes on 2 cores; 10000 for a quick look, projected to 100,000)")
    ap.add_argument("--active-agents", type=int, default=1_000, help="agents given a task at once")
    ap.add_argument("--only-fleet", action="store_true", help="only the figures that start hosts")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js, partitions=1)
        sections: list[tuple[str, Callable[[], Awaitable[list[Row]]]]] = [] if args.only_fleet else [
            ("appends", lambda: appends(js, args.runs, args.events)),
            ("replay", lambda: replay(js, args.replay)),
        ]
        if not args.skip_tools and not args.only_fleet:
            sections.append(("tools", lambda: tool_calls(js, server.url, Path(tmp), args.jobs,
                                                         args.concurrency)))
        if not args.skip_fleet:
            sections += [("idle agents", lambda: idle_agents_rss(Path(tmp), args.idle_agents)),
                         ("latency", lambda: task_latency(Path(tmp), args.active_agents)),
                         ("takeover", lambda: takeover_time(Path(tmp)))]
        print(f"cores: {os.cpu_count()}   nats-server: embedded, file storage, R1   "
              f"python {sys.version.split()[0]}")
        print(f"{'figure':<48}{'value':>16}   comparison (same run)")
        for _, measure in sections:
            for label, value, comparison in await measure():
                print(f"{label:<48}{value:>16}   {comparison}", flush=True)
        await close(nc)


if __name__ == "__main__":
    asyncio.run(main())
