"""What an MCP call costs on a fleet: the same stdio server's tool called directly from a plain script (one
`mcp.Client` session, one call at a time) and as tool jobs through NATS by in-process workers (one session per
worker), in the same run; then calls per second with 1 and 2 workers, `--parallel` jobs in flight, against one
stdio server each (every worker starts its own server process, as on separate machines).

    .venv/bin/python bench/mcp_calls.py [--calls 100] [--parallel 16]

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

SERVER = '''\
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("echo")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(n: int) -> int:
    """Answer the number it was given."""
    return n


server.run("stdio")
'''


async def direct(script: Path, calls: int) -> list[float]:
    """Latency of each call made by a plain script over one session of its own."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    out = []
    params = StdioServerParameters(command=sys.executable, args=[str(script)])
    async with Client(params, cache=None) as client:
        await client.call_tool("echo", {"n": -1})  # warm up
        for i in range(calls):
            t0 = time.perf_counter()
            result = await client.call_tool("echo", {"n": i})
            assert not result.is_error, result
            out.append(time.perf_counter() - t0)
    return out


async def main(calls: int, parallel: int) -> None:
    from runtime.bundle import load_bundle
    from runtime.worker import Worker, build_registry

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats() as server:
        root = Path(tmp)
        script = root / "echo_server.py"
        script.write_text(SERVER)
        (root / "bundle.yaml").write_text(f"name: bench\nmcp:\n  s:\n    command: {sys.executable}\n"
                                          f"    args: [{script}]\n")
        digest = load_bundle(root).tools["s_echo"].content_hash
        plain = await direct(script, calls)
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js)
        _, rcons = await ensure_partition_consumers(js, 0, "bench")
        results = await js.pull_subscribe_bind(durable=rcons, stream=RESULTS)
        seq = 0

        async def jobs(n: int, in_flight: int) -> tuple[list[float], float]:
            """Publish `n` jobs keeping `in_flight` outstanding; each one's latency, and the wall time."""
            nonlocal seq
            started: dict[str, float] = {}
            lat: list[float] = []
            t_all = time.perf_counter()
            sent = 0
            while len(lat) < n:
                while sent < n and sent - len(lat) < in_flight:
                    seq += 1
                    job = ToolJob(run_id=f"b{seq}", actor="bench", call_id=f"b{seq}/0.0", tool="s_echo",
                                  arguments={"n": seq}, tool_digest=digest)
                    started[job.call_id] = time.perf_counter()
                    await js.publish(job.subject, job.encode(), headers=job.headers())
                    sent += 1
                for m in await fetch_batch(results, in_flight, 5.0):
                    await m.ack()
                    outcome = ToolOutcome.decode(m.data)
                    assert outcome.result.error is None, outcome.result.error
                    lat.append(time.perf_counter() - started.pop(outcome.call_id))
            return lat, time.perf_counter() - t_all

        async def with_workers(k: int) -> tuple[list[float], float, float]:
            stop = asyncio.Event()
            workers = [Worker(js, build_registry(bundles=[root]), concurrency=parallel) for _ in range(k)]
            tasks = [asyncio.ensure_future(w.run(stop)) for w in workers]  # type: ignore[arg-type]
            await jobs(k * 2, k * 2)  # warm up: every worker's session started
            one_at_a_time, _ = await jobs(calls, 1)
            _, wall = await jobs(calls, parallel)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            return one_at_a_time, wall, calls / wall

        one, _, rate1 = await with_workers(1)
        _, _, rate2 = await with_workers(2)
        await close(nc)

    d, f = statistics.median(plain) * 1000, statistics.median(one) * 1000
    print(f"one call at a time, median of {calls}: {d:.2f} ms from a plain script's own session, "
          f"{f:.2f} ms as a tool job through NATS and a worker -> {f / d:.1f}x ({f - d:.2f} ms added)")
    print(f"{parallel} jobs in flight: {rate1:.0f} calls/s with 1 worker, {rate2:.0f} calls/s with 2 workers "
          "(each with its own server process)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=16)
    args = ap.parse_args()
    asyncio.run(main(args.calls, args.parallel))
