"""An acked JetStream publish: nats-py's `JetStreamContext.publish` beside the runtime's
(`runtime.nats.jetstream`), alternating in the same run on one connection to one embedded server.

    .venv/bin/python bench/publish.py [--writers 20] [--each 500] [--rounds 3]

Each round: `--writers` tasks each publish `--each` 300-byte messages one after another (each with a
Msg-Id, as the runtime's events and jobs carry), first through nats-py's context, then through the
runtime's. Printed: publishes/s and this process's CPU per publish (the client's cost; the server's is
the same for both), medians over the rounds, and the ratios. Numbers only; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from nats.js.api import StreamConfig  # noqa: E402

from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.jetstream import jetstream_for  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402


async def burst(js: Any, tag: str, writers: int, each: int) -> tuple[float, float]:
    """(publishes/s, client CPU seconds per publish) for one burst."""
    data = b"x" * 300

    async def writer(w: int) -> None:
        for i in range(each):
            await js.publish(f"b.{w}", data, headers={"Nats-Msg-Id": f"{tag}/{w}/{i}"})

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = writers * each
    return n / wall, cpu / n


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=20)
    ap.add_argument("--each", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        nc = await connect(server.url, name="bench-publish")
        contexts = {"nats-py JetStreamContext.publish": nc.jetstream(),
                    "runtime.nats.jetstream (the runtime's)": jetstream_for(nc)}
        await nc.jetstream().add_stream(StreamConfig(name="B", subjects=["b.>"]))
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in contexts}
        for r in range(args.rounds):
            for name, js in contexts.items():
                results[name].append(await burst(js, f"{r}{name[:4]}", args.writers, args.each))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        await close(nc)
    print(f"acked JetStream publishes, {args.writers} writers x {args.each} on one connection, "
          f"{args.rounds} alternating rounds (medians)")
    print(f"{'publish':<42}{'publishes/s':>12}{'client CPU':>14}{'rate ratio':>12}{'CPU ratio':>11}")
    base = "nats-py JetStreamContext.publish"
    base_rate = statistics.median(r for r, _ in results[base])
    base_cpu = statistics.median(c for _, c in results[base])
    for name, rows in results.items():
        rate, cpu = statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows)
        print(f"{name:<42}{rate:>12,.0f}{cpu * 1e6:>11.1f} us{rate / base_rate:>11.2f}x"
              f"{cpu / base_cpu:>10.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
