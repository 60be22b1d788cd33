"""Scale figures for issue 6 §5, each beside a same-run baseline (figures and ratios; nothing asserts).

    .venv/bin/python bench/scale.py [--runs 100] [--events 40] [--replay 50000] [--jobs 2000] [--skip-tools]

Measured here (no agent host needed):
* event appends/s the way the host appends: one writer per run, each append carrying the expected last
  subject sequence of its run (`bus.occ_headers`) plus a Msg-Id and waiting for its ack, many runs
  concurrently, beside raw acked `js.publish`/s with the same concurrency and payloads, and beside
  pipelined `publish_async` (the ceiling of one Python process). Aim: appends ≥ 0.5x raw.
* replay events/s of one long run through `runtime.replay.read_run` (ordered consumer, callback mode,
  decoding every event). Aim: ≥ 50k/s.
* sandboxed tool calls/s end to end with 1, 2 and 4 `sa worker` processes beside Monty-alone runs/s
  (bench/worker.py's machinery). Aim: ≥ 1,000/s with 2 workers.

Slots for figures that need the agent host (`runtime/host`) print "not measured yet": RSS of a host
holding 10,000 idle agents, task latency p50/p99 with 1,000 active agents, takeover time after a host
is killed. Fill them in `idle_agents_rss`, `task_latency`, `takeover_time`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.worker import TOOL, end_to_end, monty_alone, start_workers, stop  # noqa: E402
from runtime import bus  # noqa: E402
from runtime import events as ev  # noqa: E402

NOT_YET = "not measured yet (needs the agent host)"
Row = tuple[str, str, str]  # label, figure, comparison


def event(run: str, seq: int) -> ev.Event:
    """A typical small event (~300 B of msgpack), as a tool result would append."""
    return ev.ToolCompleted(run_id=run, seq=seq, ts=time.time(), agent="bench", call_id=f"{run}/{seq}.0",
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
            headers = bus.occ_headers("bench", run, last, f"{run}/{seq}")
            ack = await js.publish(bus.event_subject("bench", run, "tool.completed"), data, headers=headers)
            last = ack.seq

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(r) for r in range(runs)))
    return runs * per_run / (time.perf_counter() - t0)


async def raw_publishes(js, tag: str, runs: int, per_run: int) -> float:
    """Publishes/s with the same concurrency, payloads and acks, without OCC headers or Msg-Id."""

    async def writer(r: int) -> None:
        run = f"{tag}-{r}"
        for seq in range(per_run):
            await js.publish(bus.event_subject("bench", run, "tool.completed"), ev.encode(event(run, seq)))

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(r) for r in range(runs)))
    return runs * per_run / (time.perf_counter() - t0)


async def pipelined(js, tag: str, n: int, window: int = 64) -> float:
    """publish_async with a window of un-acked publishes: one process's ceiling (research/nats.md §5)."""
    t0 = time.perf_counter()
    pending = []
    for seq in range(n):
        pending.append(await js.publish_async(bus.event_subject("bench", tag, "tool.completed"),
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
    from runtime.replay import read_run

    run = "replay1"
    pending = []
    for seq in range(n):  # fill fast: these are not what is measured
        pending.append(await js.publish_async(bus.event_subject("bench", run, "tool.completed"),
                                              ev.encode(event(run, seq))))
        if len(pending) >= 256:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        log = await read_run(js, run, "bench", timeout=120)
        rates.append(len(log.events) / (time.perf_counter() - t0))
        assert len(log.events) == n and log.events[-1].seq == n - 1
    rate = statistics.median(rates)
    return [(f"replay events/s (read_run, {n:,} events)", f"{rate:,.0f}",
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
# slots for the host-dependent figures (the next helper fills these)
# ---------------------------------------------------------------------------------------------------------


async def idle_agents_rss(js) -> list[Row]:
    """RSS of one host process holding 10,000 idle agents (aim < 1 GB)."""
    return [("host RSS with 10,000 idle agents", NOT_YET, "aim < 1 GB")]


async def task_latency(js) -> list[Row]:
    """Task latency p50/p99 (publish -> run.completed) with 1,000 active agents and a scripted model."""
    return [("task latency p50/p99, 1,000 agents", NOT_YET, "")]


async def takeover_time(js) -> list[Row]:
    """Seconds from SIGKILL of a host until another resumes its runs (aim < 10 s)."""
    return [("takeover after a host is killed", NOT_YET, "aim < 10 s")]


# ---------------------------------------------------------------------------------------------------------


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="concurrent runs (writers) for the append figures")
    ap.add_argument("--events", type=int, default=40, help="events appended per run")
    ap.add_argument("--replay", type=int, default=50_000, help="events in the replayed run")
    ap.add_argument("--jobs", type=int, default=2000, help="tool jobs per worker measurement")
    ap.add_argument("--concurrency", type=int, default=16, help="jobs in flight per worker process")
    ap.add_argument("--skip-tools", action="store_true", help="skip the worker figures (they take longest)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, bus.EmbeddedNats(Path(tmp) / "nats") as server:
        nc = await bus.connect(server.url)
        js = nc.jetstream()
        await bus.ensure_topology(js, partitions=1)
        sections: list[tuple[str, Callable[[], Awaitable[list[Row]]]]] = [
            ("appends", lambda: appends(js, args.runs, args.events)),
            ("replay", lambda: replay(js, args.replay)),
        ]
        if not args.skip_tools:
            sections.append(("tools", lambda: tool_calls(js, server.url, Path(tmp), args.jobs,
                                                         args.concurrency)))
        sections += [("idle agents", lambda: idle_agents_rss(js)), ("latency", lambda: task_latency(js)),
                     ("takeover", lambda: takeover_time(js))]
        print(f"cores: {os.cpu_count()}   nats-server: embedded, file storage, R1   "
              f"python {sys.version.split()[0]}")
        print(f"{'figure':<48}{'value':>16}   comparison (same run)")
        for _, measure in sections:
            for label, value, comparison in await measure():
                print(f"{label:<48}{value:>16}   {comparison}", flush=True)
        await bus.close(nc)


if __name__ == "__main__":
    asyncio.run(main())
