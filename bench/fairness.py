"""A fair share of a scarce model endpoint: many agents at once against a server that admits few requests.

    .venv/bin/python bench/fairness.py [--agents 1000] [--tasks 8] [--limit 32] [--service 0.2] [--hosts 2]
                                       [--urgent 0.05] [--quick] [--baseline]

The workload: `--agents` agents (instances of one bundle, each its own actor) each publish `--tasks` tasks
at once, one model call each; the scripted model server (`runtime.testing.Capacity`) admits `--limit`
requests in flight, takes `--service` seconds per request, and answers 429 with `Retry-After: 1` beyond
that. A `--urgent` share of the agents send their tasks at priority 9, the others at priority 1. The bundle
sets `endpoint: {max_in_flight: <limit>}`, so the fleet (`--hosts` `sa host` processes sharing the endpoint's
permits through NATS, `runtime.host.endpoint`) queues its calls instead of being refused.

What it prints (figures and ratios from this run; nothing here asserts):
* failed runs (aim 0), the server's peak of requests in flight and its 429s (aim: peak <= limit, no 429);
* fairness: each low-priority agent's completed tasks at the moment half of all low-priority tasks had
  completed, and Jain's index over them (aim >= 0.9; 1.0 is a perfectly even share);
* priority: p50 / p99 of the time a model call waited for the endpoint (`model.responded.queued_ms`), high
  against low (aim: high p99 <= a tenth of low p99), and the task latency (publish to end) of each;
* the cost of the limiter: an acquire and release of a fleet permit, uncontended (one pull, one delivered
  permit, one nak), and one model call through a host's client with the limit and without it,
  alternating, beside the same call against the same server;
* `--baseline` runs the same workload once more with no `max_in_flight` (the client only honours the 429s'
  Retry-After): its failed runs, 429s, peak and Jain's index beside the limited run's.

`--quick` scales it down (100 agents x 4 tasks, limit 8, 0.1 s per request) to a run of well under a minute;
the full run (1,000 x 8, limit 32, 0.2 s: about 50 s of model time) takes a few minutes on 2 cores.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import events as ev  # noqa: E402
from runtime.commands import run_id_for  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.jetstream import jetstream_for  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.subjects import HDR_MSG_ID, task_subject  # noqa: E402
from runtime.nats.topology import ensure_topology  # noqa: E402
from runtime.testing import Capacity, Reply, ScriptedModelServer  # noqa: E402

CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]
LOW, HIGH = 1, 9
TOOL = '''\
"""Finish with an answer."""
from grail import Input

answer: str = Input("answer")

{"answer": answer}
'''


def bundle(root: Path, base_url: str, limit: int | None) -> Path:
    """One model call per task (a plain answer ends the run); no tool runs, so no worker is needed."""
    folder = root / "fair"
    (folder / "tools").mkdir(parents=True, exist_ok=True)
    (folder / "tools" / "submit.pym").write_text(TOOL)
    endpoint = f"max_in_flight: {limit}, " if limit is not None else ""
    (folder / "bundle.yaml").write_text(
        "name: fair\nsystem_prompt: Answer briefly.\n"
        f"model: {{adapter: openai, base_url: '{base_url}', name: scripted}}\n"
        "constraint: {strategy: json_schema}\ntools:\n  - tools/submit.pym\n"
        f"endpoint: {{{endpoint}retry_after_max: 5s, throttle_retries: 8}}\n"
        "termination: {max_turns: 3, max_consecutive_errors: 3}\n")
    return folder / "bundle.yaml"


def spawn(args: list[str], url: str, log: Path, ready: str, timeout: float = 120) -> subprocess.Popen:
    out = open(log, "ab")
    proc = subprocess.Popen([*CLI, *args], env={**os.environ, "NATS_URL": url}, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{args[0]} did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def jain(shares: list[float]) -> float:
    """Jain's fairness index: 1.0 when every share is equal, 1/n when one takes all."""
    total, squares = sum(shares), sum(x * x for x in shares)
    return total * total / (len(shares) * squares) if squares else 1.0


@dataclass
class Outcome:
    """What one run of the workload produced, as the log recorded it."""

    sent: dict[str, tuple[str, int, float]] = field(default_factory=dict)  # run -> (agent, priority, sent)
    later: set[str] = field(default_factory=set)  # runs of an agent's 2nd and later tasks
    ended: dict[str, tuple[str, float]] = field(default_factory=dict)  # run -> (status, when)
    queued: dict[str, float] = field(default_factory=dict)  # run -> ms its model call(s) waited
    throttled: int = 0
    elapsed: float = 0.0


async def workload(tmp: Path, args: argparse.Namespace, *, limit: int | None,
                   tag: str) -> tuple[Outcome, Capacity]:
    capacity = Capacity(args.limit, retry_after=1.0)
    service = args.service
    model = ScriptedModelServer(responder=lambda body: Reply.of_text("ok", delay=service), record=False,
                                capacity=capacity).start()
    root = tmp / tag
    root.mkdir(parents=True)
    server = EmbeddedNats(root / "nats").start()
    hosts: list[subprocess.Popen] = []
    out = Outcome()
    try:
        nc = await connect(server.url)
        js = jetstream_for(nc)
        await ensure_topology(js, partitions=8)
        path = bundle(root, model.base_url, limit)
        per_host = args.agents * args.tasks // args.hosts + 64
        for i in range(args.hosts):
            hosts.append(spawn(["host", str(path), "--max-runs", str(per_host)], server.url,
                               root / f"host{i}.log", "sa host: serving"))
        await _watch(nc, out)
        urgent = max(1, round(args.agents * args.urgent))
        agents = [f"fair:a{i:04d}" for i in range(args.agents)]
        started = time.time()
        pending = []
        for round_ in range(args.tasks):  # round robin in the stream, as agents publishing at once would
            for i, agent in enumerate(agents):
                priority = HIGH if i < urgent else LOW
                task_id = f"{agent}-{round_}"
                run = run_id_for(agent, task_id)
                out.sent[run] = (agent, priority, time.time())
                if round_:
                    out.later.add(run)
                body = f'{{"input": "task {round_}", "task_id": "{task_id}", "priority": {priority}}}'
                pending.append(await js.publish_async(task_subject(agent), body.encode(),
                                                      headers={HDR_MSG_ID: task_id}))
                if len(pending) >= 256:
                    await asyncio.gather(*pending)
                    pending.clear()
        await asyncio.gather(*pending)
        deadline = time.monotonic() + args.timeout
        while len(out.ended) < len(out.sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        out.elapsed = time.time() - started
        await close(nc)
    finally:
        for p in hosts:
            p.send_signal(signal.SIGTERM)
        for p in hosts:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        model.close()
        server.stop()
    return out, capacity


async def _watch(nc, out: Outcome) -> None:
    """Follow the runs' ends, their model calls' queue time and their throttles on core subscriptions."""
    async def on_event(msg) -> None:
        for event in ev.decode_all(msg.data):
            if isinstance(event, ev.ModelResponded):
                out.queued[event.run_id] = out.queued.get(event.run_id, 0.0) + event.queued_ms
            elif isinstance(event, ev.ModelThrottled):
                out.throttled += 1
            elif isinstance(event, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
                out.ended.setdefault(event.run_id, (ev.kind_of(event).split(".")[1], time.time()))

    for kind in ("model.responded", "model.throttled", "run.completed", "run.failed", "run.cancelled"):
        await nc.subscribe(f"events.*.*.{kind}", cb=on_event, pending_msgs_limit=1_000_000)


def fairness(out: Outcome) -> tuple[float, int, int]:
    """Jain's index over the low-priority agents' completed tasks when half of all low tasks had completed;
    and the fewest and most any agent had completed then."""
    low = {run: agent for run, (agent, priority, _) in out.sent.items() if priority == LOW}
    ends = sorted(when for run, (status, when) in out.ended.items() if run in low and status == "completed")
    if not ends:
        return float("nan"), 0, 0
    half = ends[len(low) // 2 - 1] if len(ends) >= len(low) // 2 else ends[-1]
    done: dict[str, int] = {agent: 0 for agent in set(low.values())}
    for run, (status, when) in out.ended.items():
        if run in low and status == "completed" and when <= half:
            done[low[run]] += 1
    shares = list(done.values())
    return jain([float(x) for x in shares]), min(shares), max(shares)


def waits(out: Outcome, priority: int, *, later_only: bool = False) -> list[float]:
    """Seconds each model call of the runs at `priority` waited for the endpoint."""
    return [out.queued[run] / 1000 for run, (_, p, _) in out.sent.items()
            if p == priority and run in out.queued and (run in out.later or not later_only)]


def latencies(out: Outcome, priority: int) -> list[float]:
    return [out.ended[run][1] - sent for run, (_, p, sent) in out.sent.items()
            if p == priority and run in out.ended]


def spread(values: list[float], digits: int = 3) -> str:
    return f"{pct(values, .5):.{digits}f} / {pct(values, .99):.{digits}f} s"


def rows(out: Outcome, capacity: Capacity, limit: int, label: str) -> list[tuple[str, str, str]]:
    failed = sum(1 for status, _ in out.ended.values() if status != "completed")
    index, least, most = fairness(out)
    rows = [
        (f"{label}: runs failed / not ended", f"{failed} / {len(out.sent) - len(out.ended)}",
         f"of {len(out.sent):,} in {out.elapsed:.1f} s ({len(out.ended) / out.elapsed:,.0f} runs/s); aim 0"),
        (f"{label}: server peak in flight / 429s", f"{capacity.peak} / {capacity.refused}",
         f"limit {limit}; model.throttled recorded: {out.throttled}"),
        (f"{label}: Jain's index at half the low tasks", f"{index:.3f}",
         f"each low agent then had {least}..{most} task(s) done; aim >= 0.9")]
    for what, later in (("endpoint wait p50 / p99, high", False), ("  the same, agents' later tasks", True)):
        high, low = waits(out, HIGH, later_only=later), waits(out, LOW, later_only=later)
        ratio = pct(high, .99) / pct(low, .99) if pct(low, .99) > 0 else float("nan")
        note = " (every agent's first task, the start burst, left out)" if later else " (aim <= 0.1)"
        rows.append((f"{label}: {what}", spread(high),
                     f"low: {spread(low)}; high p99 = {ratio:.3f}x low's{note}"))
    rows.append((f"{label}: task latency p50 / p99, high", spread(latencies(out, HIGH), 2),
                 f"low: {spread(latencies(out, LOW), 2)}"))
    return rows


async def acquire_cost(tmp: Path, rounds: int = 2000) -> list[tuple[str, str, str]]:
    """An uncontended acquire + release of a fleet permit, and one model call with and without a limit."""
    from runtime.host.endpoint import FleetGate
    from runtime.model.client import ModelClient
    from runtime.model.limits import Ticket

    server = EmbeddedNats(tmp / "cost").start()
    model = ScriptedModelServer(responder=lambda body: "ok", record=False).start()
    try:
        nc = await connect(server.url)
        gate = FleetGate(nc, "ep-bench", 4)
        await gate.open()
        task = asyncio.ensure_future(gate.run())
        ticket = Ticket("a")
        for _ in range(100):  # warm
            async with gate.slot(ticket):
                pass
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            async with gate.slot(ticket):
                pass
        per, cpu = (time.perf_counter() - t0) / rounds, (time.process_time() - c0) / rounds
        client = ModelClient(base_url=model.base_url, model="scripted", max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        plain, limited = [], []
        for i in range(1000):
            client.limiter = gate if i % 2 else None
            t = time.perf_counter()
            await client.complete(messages, ticket=ticket)
            (limited if i % 2 else plain).append(time.perf_counter() - t)
        await client.aclose()
        task.cancel()
        await close(nc)
    finally:
        model.close()
        server.stop()
    return [("permit acquire + release, uncontended", f"{per * 1e3:.3f} ms",
             f"{cpu * 1e6:.0f} us of CPU in the caller (nats-server apart); no limit: a None check"),
            ("model call p50, with a limit / without", f"{statistics.median(limited) * 1e3:.2f} / "
             f"{statistics.median(plain) * 1e3:.2f} ms",
             "alternating, same client and server (a zero-latency scripted model)")]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=8, help="tasks per agent, published at once")
    ap.add_argument("--limit", type=int, default=32, help="requests the model server admits at once")
    ap.add_argument("--service", type=float, default=0.2, help="seconds the model takes per request")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--urgent", type=float, default=0.05, help="share of agents whose tasks are priority 9")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every run to end")
    ap.add_argument("--quick", action="store_true", help="100 agents x 4 tasks, limit 8, 0.1 s per request")
    ap.add_argument("--baseline", action="store_true", help="also run it with no max_in_flight")
    ap.add_argument("--keep", type=Path, help="keep the hosts' logs and the NATS store in this folder")
    args = ap.parse_args()
    if args.quick:
        args.agents, args.tasks, args.limit, args.service = 100, 4, 8, 0.1
    ideal = args.agents * args.tasks * args.service / args.limit
    print(f"cores: {os.cpu_count()}   {args.agents:,} agents x {args.tasks} tasks, {args.hosts} hosts, "
          f"server admits {args.limit} at {args.service:g} s each (all of it at the limit: {ideal:.0f} s)")
    print(f"{'figure':<52}{'value':>18}   comparison (same run)")
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(args.keep) if args.keep is not None else scratch
        for label, value, comparison in await acquire_cost(Path(tmp)):
            print(f"{label:<52}{value:>18}   {comparison}", flush=True)
        out, capacity = await workload(Path(tmp), args, limit=args.limit, tag="limited")
        for label, value, comparison in rows(out, capacity, args.limit, "limited"):
            print(f"{label:<52}{value:>18}   {comparison}", flush=True)
        if args.baseline:
            out, capacity = await workload(Path(tmp), args, limit=None, tag="baseline")
            for label, value, comparison in rows(out, capacity, args.limit, "no limit"):
                print(f"{label:<52}{value:>18}   {comparison}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
