"""Benchmark: `.pym` script runs on the warm sandbox pool, beside in-process `exec` of the same code.

    python bench/scripts.py [--samples 500] [--runs 400]

Prints, for a trivial script and for summing 1,000 ints:
  - p50/p99 latency of `Script.run` (the full async path: input validation, a fresh checkout of the
    process pool, Monty, result conversion), of a bare `AsyncMonty` checkout + feed (the floor under our
    layer), and of CPython `exec` (compile + exec) of the same code in this process, with the ratio;
  - runs/s with 1, 2 and 4 runs in flight;
  - the two ways a run is fed, in a worker's pattern (one run at a time, the pool settled after each, off
    the timed path; rounds alternating): inline from this thread through the synchronous pool (the default
    for a script without externals, `runtime.scripts.inline`) and through `AsyncMonty` (its ready session
    kept by `warm`): p50 and this process's CPU per run (its threads and the settling included), back to
    back and with 5 ms idle before each run (an idle sandbox process answers slowly).
Figures, not assertions: the machine's load moves them (see ../shared/research/monty.md §8).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.scripts import configure_pool, get_pool, loads, shutdown

TRIVIAL = '"""Trivial."""\n1 + 1\n'
SUM = '''"""Sum the values."""
from grail import Input

values: list[int] = Input("values")

total = 0
for v in values:
    total += v
total
'''
VALUES = list(range(1000))


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.0f} µs"


async def latency(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


def exec_latency(code: str, inputs: dict, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        exec(compile(code, "<bench>", "exec"), dict(inputs))
        out.append(time.perf_counter() - t)
    return out


async def throughput(run, total: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one():
        async with sem:
            await run()

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t)


ROUNDS = 5


async def inline_vs_async(script: Any, inputs: dict, samples: int,
                          gap: float) -> dict[str, tuple[list[float], float]]:
    """Per path: every run's wall time, and this process's CPU per run, over `ROUNDS` alternating rounds."""
    pool = get_pool()
    slice_s = pool.inline.slice_s
    walls: dict[str, list[float]] = {"inline": [], "async": []}
    cpu: dict[str, float] = {"inline": 0.0, "async": 0.0}
    try:
        async with pool.warm():
            for _ in range(ROUNDS):
                for path in ("inline", "async"):
                    pool.inline.slice_s = slice_s if path == "inline" else 0.0
                    c0 = time.process_time()
                    for _ in range(samples // ROUNDS):
                        if gap:
                            await asyncio.sleep(gap)
                        t = time.perf_counter()
                        r = await script.run(inputs)
                        walls[path].append(time.perf_counter() - t)
                        assert r.error is None, r
                        await pool.settled()  # a worker's cue once the outcome is out: off the timed path
                    cpu[path] += time.process_time() - c0
    finally:
        pool.inline.slice_s = slice_s
    n = ROUNDS * (samples // ROUNDS)
    return {path: (walls[path], cpu[path] / n) for path in walls}


async def main(samples: int, runs: int) -> None:
    configure_pool(min_processes=4, max_processes=4)
    trivial, summing = loads(TRIVIAL, name="trivial"), loads(SUM, name="sum")
    monty = await get_pool().monty()
    limits = trivial_limits = None
    from runtime.scripts import Limits

    limits = Limits.default().to_monty()
    trivial_limits = limits

    async def run_trivial():
        r = await trivial.run()
        assert r.output == 2, r

    async def run_sum():
        r = await summing.run({"values": VALUES})
        assert r.output == 499500, r

    async def raw_trivial():
        async with monty.checkout(limits=trivial_limits) as s:
            await s.feed_run("1 + 1")

    async def raw_sum():
        async with monty.checkout(limits=limits) as s:
            await s.feed_run(summing.code, inputs={"values": VALUES})

    for fn in (run_trivial, run_sum, raw_trivial, raw_sum):  # warm up every worker and code path
        await latency(fn, 40)

    print(
        f"# .pym script runs on a warm AsyncMonty pool ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, {samples} samples each)\n"
    )
    print("| job | path | p50 | p99 | p50 vs exec |")
    print("|---|---|---|---|---|")
    for label, run_fn, raw_fn, code, inputs in (
        ("trivial `1 + 1`", run_trivial, raw_trivial, trivial.code, {}),
        ("sum of 1,000 ints", run_sum, raw_sum, summing.code, {"values": VALUES}),
    ):
        ours = await latency(run_fn, samples)
        raw = await latency(raw_fn, samples)
        native = exec_latency(code, inputs, samples)
        base = statistics.median(native)
        for path, data in (
            ("`Script.run` (full async path)", ours),
            ("bare AsyncMonty checkout + feed", raw),
            ("CPython `exec` in process", native),
        ):
            ratio = statistics.median(data) / base
            print(f"| {label} | {path} | {us(pct(data, 50))} | {us(pct(data, 99))} | {ratio:6.1f}× |")

    print(f"\n# throughput: {runs} runs of `Script.run`, pool of 4 workers\n")
    print("| job | in flight | runs/s |")
    print("|---|---|---|")
    for label, fn in (("trivial", run_trivial), ("sum of 1,000 ints", run_sum)):
        for concurrency in (1, 2, 4):
            rate = await throughput(fn, runs, concurrency)
            print(f"| {label} | {concurrency} | {rate:8.0f} |")
    print("\n# inline (synchronous pool, this thread) vs the async pool, one run at a time as a worker runs "
          "them\n")
    print("| job | idle before each | inline p50 | async p50 | inline CPU/run | async CPU/run | CPU ratio |")
    print("|---|---|---|---|---|---|---|")
    jobs: tuple[tuple[str, Any, dict], ...] = (("trivial", trivial, {}),
                                               ("sum of 1,000 ints", summing, {"values": VALUES}))
    for label, script, inputs in jobs:
        for gap in (0.0, 0.005):
            got = await inline_vs_async(script, inputs, samples, gap)
            (iw, ic), (aw, ac) = got["inline"], got["async"]
            print(f"| {label} | {gap * 1000:.0f} ms | {us(statistics.median(iw))} "
                  f"| {us(statistics.median(aw))} | {us(ic)} | {us(ac)} | {ic / ac:.2f}× |")
    print(f"\nsandbox crashes during the benchmark: {get_pool().crashes}")
    await shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.runs))
