"""What recording external calls costs: a tool job whose script makes K external calls, run through NATS
by an in-process worker, for K = 0 and K = 10, one job at a time; the difference per call is the price of
exactly-once (a KV get and a KV put per call, before the script sees the answer). The same script run
directly (no NATS, no recording) gives the sandbox's own cost per external call, measured in the same run.

    .venv/bin/python bench/externals.py [--jobs 60] [--calls 10]

Numbers only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.jobs import ToolJob, ToolOutcome  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.pull import fetch_batch  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.subjects import RESULTS  # noqa: E402
from runtime.nats.topology import ensure_partition_consumers, ensure_topology  # noqa: E402

SCRIPT = '''\
"""Call the host k times."""
from grail import external, Input

k: int = Input("k")


@external
async def echo(n: int) -> int:
    ...


total = 0
for i in range(k):
    total += await echo(i)
{"total": total}
'''

FACTORY = '''\
async def echo(n):
    return n


def build(tool_name, context):
    return {"echo": echo}
'''


async def main(jobs: int, calls: int) -> None:
    from runtime.tools import ScriptTool, ToolContext
    from runtime.worker import Worker, build_registry

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats() as server:
        root = Path(tmp)
        (root / "echo.pym").write_text(SCRIPT)
        (root / "echofactory.py").write_text(FACTORY)
        (root / "bundle.yaml").write_text("name: bench\nexternals: echofactory:build\ntools: [echo.pym]\n")
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js)
        _, rcons = await ensure_partition_consumers(js, 0, "bench")  # the jobs' actor is `bench`
        results = await js.pull_subscribe_bind(durable=rcons, stream=RESULTS)
        registry = build_registry(bundles=[root])
        worker = Worker(js, registry, concurrency=1)
        stop = asyncio.Event()
        task = asyncio.ensure_future(worker.run(stop))  # type: ignore[arg-type]

        async def one(i: int, k: int) -> float:
            job = ToolJob(run_id=f"b{k}", actor="bench", call_id=f"b{k}/{i}.0", tool="echo",
                          arguments={"k": k}, limits={"max_duration": 30, "max_suspensions": 100_000})
            t0 = time.perf_counter()
            await js.publish(job.subject, job.encode(), headers=job.headers())
            while True:
                for m in await fetch_batch(results, 1, 5.0):
                    await m.ack()
                    outcome = ToolOutcome.decode(m.data)
                    assert outcome.result.error is None, outcome.result.error
                    return time.perf_counter() - t0

        for k in (0, calls):  # warm up
            await one(-1, k)
        lat = {k: [await one(i, k) for i in range(jobs)] for k in (0, calls)}
        tool = ScriptTool.from_path(root / "echo.pym")

        async def echo(n: int) -> int:
            return n

        direct = {}
        for k in (0, calls):
            runs = []
            for _ in range(jobs):
                t0 = time.perf_counter()
                r = await tool.execute({"k": k}, ToolContext(externals={"echo": echo},
                                                             limits=None))
                assert r.error is None, r.error
                runs.append(time.perf_counter() - t0)
            direct[k] = runs
        stop.set()
        await asyncio.wait_for(task, 30)
        await close(nc)

    med = {k: statistics.median(v) * 1000 for k, v in lat.items()}
    dmed = {k: statistics.median(v) * 1000 for k, v in direct.items()}
    per_recorded = (med[calls] - med[0]) / calls
    per_direct = (dmed[calls] - dmed[0]) / calls
    print(f"job through NATS, median of {jobs}: {med[0]:.2f} ms with 0 external calls, "
          f"{med[calls]:.2f} ms with {calls}")
    print(f"same script in process (no NATS, not recorded): {dmed[0]:.2f} ms / {dmed[calls]:.2f} ms")
    print(f"per external call: {per_recorded:.3f} ms recorded (KV get + put) vs {per_direct:.3f} ms direct "
          f"-> recording adds {per_recorded - per_direct:.3f} ms per call")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(main(args.jobs, args.calls))
