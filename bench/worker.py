"""Sandboxed tool calls per second end to end through NATS, with 1 and 2 `sa worker` processes, beside
Monty-alone runs per second measured in the same run (the ratio is what the runtime costs).

    .venv/bin/python bench/worker.py [--jobs 3000] [--concurrency 16]
    .venv/bin/python bench/worker.py --writes [--jobs 300]   # the cost of a job's workspace writes only
    .venv/bin/python bench/worker.py --instructions [--jobs 1000] [--against OTHER_CHECKOUT]

`--instructions` counts the instructions a worker process executes per job under valgrind (cachegrind,
no cache simulation): a run with N jobs minus a run with none, over N. Why: on a shared 2-core machine the
CPU time per job moves by ±30 % with the load, while the instruction count moves by a few percent, so a
change of 10 % in the worker's own cost shows. `--against DIR` measures the worker of another checkout
(DIR/runtime) first, in the same run, for a ratio. valgrind slows the worker ~50x: 1,000 jobs take minutes.

End to end = publish `ToolJob`s to TOOLS (acked, with Msg-Id) -> worker process(es) fetch, run the .pym in
Monty, publish `ToolOutcome`s to RESULTS -> this process consumes every outcome. The clock runs from the
first publish to the last outcome. Numbers only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.jobs import ToolJob, ToolOutcome  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.pull import fetch_batch  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.subjects import RESULTS  # noqa: E402
from runtime.nats.topology import ensure_partition_consumers, ensure_topology  # noqa: E402

TOOL = '''\
"""Add two numbers and describe the sum."""
from grail import Input

a: int = Input("a")
b: int = Input("b")

{"sum": a + b, "text": "the sum is " + str(a + b)}
'''


async def monty_alone(path: Path, n: int, concurrency: int) -> float:
    """Runs/s of the same tool called directly (no NATS), `concurrency` at a time."""
    from runtime.tools import ScriptTool, ToolContext

    tool = ScriptTool.from_path(path)
    sem = asyncio.Semaphore(concurrency)
    await asyncio.gather(*(tool.execute({"a": 1, "b": i}, ToolContext()) for i in range(200)))  # warm up

    async def one(i: int) -> None:
        async with sem:
            r = await tool.execute({"a": i, "b": 1}, ToolContext())
            assert r.error is None, r.error

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


def start_workers(url: str, tools: Path, k: int, concurrency: int, logdir: Path) -> list[subprocess.Popen]:
    procs = []
    for i in range(k):
        log = logdir / f"worker{i}.log"
        cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--tools", str(tools),
               "--concurrency", str(concurrency)]
        procs.append(subprocess.Popen(cmd, env={**os.environ, "NATS_URL": url}, stdout=subprocess.DEVNULL,
                                      stderr=open(log, "wb")))
    for i, p in enumerate(procs):
        log = logdir / f"worker{i}.log"
        while b"serving" not in log.read_bytes():
            if p.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.02)
    return procs


async def end_to_end(js, tag: str, n: int) -> tuple[float, dict[str, int]]:
    """Publish n jobs, wait for n outcomes; returns (calls/s, outcomes per worker)."""
    _, rcons = await ensure_partition_consumers(js, 0, "bench")  # the jobs' actor is `bench`
    psub = await js.pull_subscribe_bind(durable=rcons, stream=RESULTS)
    by_worker: dict[str, int] = {}
    got = 0
    t0 = time.perf_counter()

    async def publish() -> None:
        pending = []
        for i in range(n):
            j = ToolJob(run_id=f"{tag}", actor="bench", call_id=f"{tag}/{i}.0", tool="add",
                        arguments={"a": i, "b": 1})
            pending.append(await js.publish_async(j.subject, j.encode(), headers=j.headers()))
            if len(pending) >= 64:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)

    pub = asyncio.create_task(publish())
    while got < n:
        for m in await fetch_batch(psub, 256, 1.0):
            o = ToolOutcome.decode(m.data)
            assert o.result.error is None, o.result.error
            by_worker[o.worker] = by_worker.get(o.worker, 0) + 1
            got += 1
            await m.ack()
    elapsed = time.perf_counter() - t0
    await pub
    await psub.unsubscribe()
    return n / elapsed, by_worker


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the worker process's own CPU, its sandbox processes' CPU) so far, user + system (Linux /proc): the
    Monty pool runs scripts in child processes, counted live and, once reaped, in the worker's cutime."""
    def stat(p: int) -> list[int]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return [0] * 15
        return [int(f) if f.lstrip("-").isdigit() else 0 for f in fields[:15]]

    tick = os.sysconf("SC_CLK_TCK")
    own = stat(pid)
    children = own[13] + own[14] + sum(sum(stat(c)[11:13]) for c in _children(pid))
    return (own[11] + own[12]) / tick, children / tick


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                for c in (t / "children").read_text().split()]
    except OSError:
        return []


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(30)


async def workspace_writes(js, jobs: int) -> None:
    """ms per job spent applying its workspace writes (`WorkspaceResultHandler.handle`, the marker
    included), one job at a time: 1 write (a plain publish), 2 writes (one atomic batch), beside the same 2
    writes as 2 plain revision-checked publishes (what a job paid before writes were atomic)."""
    from runtime.jobs import ToolJob
    from runtime.nats.kv import workspace_kv
    from runtime.tools.data import JobContext, WorkspaceResultHandler

    handler = WorkspaceResultHandler(js)
    kv = await workspace_kv(js, "bench")

    async def handled(n: int, tag: str) -> float:
        revisions: dict[str, int] = {}
        t0 = time.perf_counter()
        for j in range(jobs):
            job = ToolJob(run_id="r-bench", actor="a", call_id=f"r-bench/{tag}{j}", tool="t",
                          workspace="bench")
            ctx = JobContext(job, revisions=dict(revisions), complete=True)
            await handler.handle("t", {"writes": [{"path": f"{tag}{i}.txt", "content": f"{j}"}
                                                  for i in range(n)]}, ctx)
            revisions = ctx.revisions
        return (time.perf_counter() - t0) / jobs * 1e3

    async def plain(n: int, tag: str) -> float:
        revisions = {f"{tag}{i}": 0 for i in range(n)}
        t0 = time.perf_counter()
        for j in range(jobs):
            for key in revisions:
                ack = await js.publish(f"$KV.ws_bench.{key}", str(j).encode(),
                                       headers={"Nats-Expected-Last-Subject-Sequence": str(revisions[key])})
                revisions[key] = ack.seq
        return (time.perf_counter() - t0) / jobs * 1e3

    await kv.put("warm", b"")
    print(f"workspace writes, {jobs} jobs one at a time        ms/job")
    print(f"{'1 write (plain publish + marker)':<48}{await handled(1, 'one'):>8.2f}")
    print(f"{'2 writes, one atomic batch (+ marker)':<48}{await handled(2, 'two'):>8.2f}")
    print(f"{'baseline: 2 plain publishes, no marker':<48}{await plain(2, 'raw'):>8.2f}")


async def instructions(js: Any, url: str, tools: Path, tree: Path, jobs: int, logdir: Path) -> float:
    """Instructions the worker process of `tree` executes per job (valgrind I refs: N jobs minus none)."""
    counts = []
    for n in (0, jobs):
        log = logdir / f"valgrind-{tree.name}-{n}.log"
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--tools", str(tools),
               "--concurrency", "16"]
        env = {**os.environ, "NATS_URL": url, "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
        while b"serving" not in log.read_bytes():
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            await asyncio.sleep(0.2)
        await end_to_end(js, f"vw{n}{tree.name}", 100)  # the same warm-up in both runs
        if n:
            await end_to_end(js, f"vr{n}{tree.name}", n)
        proc.send_signal(signal.SIGTERM)
        proc.wait(600)
        found = re.search(r"I\s+refs:\s+([\d,]+)", log.read_text())
        if found is None:
            raise RuntimeError(f"no instruction count in {log}: {log.read_text()[-500:]}")
        counts.append(int(found.group(1).replace(",", "")))
    return (counts[1] - counts[0]) / jobs


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16, help="jobs in flight per worker process")
    ap.add_argument("--writes", action="store_true", help="only measure a job's workspace writes")
    ap.add_argument("--instructions", action="store_true", help="instructions per job under valgrind")
    ap.add_argument("--against", type=Path, help="with --instructions: another checkout, measured first")
    args = ap.parse_args()

    if args.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
            tools = Path(tmp) / "add.pym"
            tools.write_text(TOOL)
            nc = await connect(server.url)
            await ensure_topology(nc.jetstream(), partitions=1)
            trees = ([args.against.resolve()] if args.against else []) + [ROOT]
            found = {tree: await instructions(nc.jetstream(), server.url, tools, tree, min(args.jobs, 3000),
                                              Path(tmp)) for tree in trees}
            await close(nc)
        for tree, count in found.items():
            print(f"{tree!s:<48}{count:>12,.0f} instructions per job (the worker process)")
        if args.against:
            print(f"ratio {found[ROOT] / found[args.against.resolve()]:.3f} (this checkout / --against)")
        return

    if args.writes:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
            nc = await connect(server.url)
            await ensure_topology(nc.jetstream(), partitions=1)
            await workspace_writes(nc.jetstream(), min(args.jobs, 1000))
            await close(nc)
        return

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        tools = Path(tmp) / "add.pym"
        tools.write_text(TOOL)
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js, partitions=1)

        alone = await monty_alone(tools, args.jobs, args.concurrency)
        print(f"cores: {os.cpu_count()}   jobs per measurement: {args.jobs}   in flight per worker: "
              f"{args.concurrency}")
        print(f"{'setup':<34}{'calls/s':>10}{'vs Monty alone':>16}{'worker CPU/job':>22}   spread")
        print(f"{'Monty alone (in-process)':<34}{alone:>10.0f}{1.0:>15.2f}x")
        for k in (1, 2):
            procs = start_workers(server.url, tools, k, args.concurrency, Path(tmp))
            try:
                await end_to_end(js, f"warm{k}", 200)  # start each worker's sandbox pool
                before = [cpu_seconds(p.pid) for p in procs]
                rate, spread = await end_to_end(js, f"run{k}", args.jobs)
                after = [cpu_seconds(p.pid) for p in procs]
            finally:
                stop(procs)
            own = sum(a[0] - b[0] for a, b in zip(after, before, strict=True)) / args.jobs * 1e3
            sandbox = sum(a[1] - b[1] for a, b in zip(after, before, strict=True)) / args.jobs * 1e3
            label = f"end to end, {k} worker process{'es' if k > 1 else ''}"
            print(f"{label:<34}{rate:>10.0f}{rate / alone:>15.2f}x{own:>9.3f} + {sandbox:.3f} ms   "
                  f"{sorted(spread.values())}")
        print("worker CPU/job: the worker process's own + its sandbox processes', per job")
        await close(nc)


if __name__ == "__main__":
    asyncio.run(main())
