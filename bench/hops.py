"""What one process hop costs on this machine, back to back and after the processes sat idle.

    .venv/bin/python bench/hops.py [--samples 300]

A durable, sandboxed tool turn adds hops the plain loop has none of: the reply's append (host -> nats-server
-> host), the job (host -> nats-server -> worker), the sandbox run (worker -> Monty process -> worker) and the
outcome (worker -> nats-server -> host). At one agent in flight every process sleeps between them, so each
hop pays for waking its target. Printed, p50 of each, with 0 / 3 / 10 ms of idleness before each sample:

- an acked JetStream publish to a file stream (this runtime's `JetStream.publish`, as every append);
- a core NATS message from one connection to another in this process (through nats-server and back);
- a Monty feed of a trivial script in a checked-out session (the synchronous pool, from this thread),
  and the checkout, feed and give-back together.

Figures, not assertions: they say where the floor of a turn's overhead is on the machine that runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GAPS = (0.0, 0.003, 0.010)
CODE = "def add(a, b):\n    return a + b\n{'sum': add(a, b)}\n"
LIMITS = {"max_memory": 64 * 1024 * 1024, "max_feed_duration_secs": 1.0, "max_total_sleep_secs": 1.0}


def p50_us(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e6:7.0f} µs"


async def nats_hops(samples: int) -> dict[float, tuple[list[float], list[float]]]:
    from nats.js.api import StorageType, StreamConfig

    from runtime.nats.connection import close, connect
    from runtime.nats.jetstream import jetstream_for
    from runtime.nats.server import EmbeddedNats

    out: dict[float, tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(store_dir=tmp).start()
        try:
            nc, other = await connect(server.url), await connect(server.url)
            js = jetstream_for(nc)
            await js.add_stream(StreamConfig(name="HOPS", subjects=["hops.>"], storage=StorageType.FILE))
            arrived: asyncio.Queue[float] = asyncio.Queue()

            async def on_msg(msg: object) -> None:
                arrived.put_nowait(time.perf_counter())

            await other.subscribe("core.>", cb=on_msg)
            await other.flush()
            for gap in GAPS:
                acked, core = [], []
                for _ in range(samples):
                    await asyncio.sleep(gap)
                    t = time.perf_counter()
                    await js.publish("hops.x", b"x" * 200)
                    acked.append(time.perf_counter() - t)
                    await asyncio.sleep(gap)
                    t = time.perf_counter()
                    await nc.publish("core.x", b"y")
                    core.append(await arrived.get() - t)
                out[gap] = (acked, core)
            await close(nc)
            await close(other)
        finally:
            server.stop()
    return out


def monty_hops(samples: int) -> dict[float, tuple[list[float], list[float]]]:
    from pydantic_monty import Monty

    out: dict[float, tuple[list[float], list[float]]] = {}
    with Monty(min_processes=1, max_processes=2) as pool:
        for gap in GAPS:
            feeds, whole = [], []
            for i in range(samples):
                time.sleep(gap)
                t0 = time.perf_counter()
                with pool.checkout(script_name="hop.pym", limits=LIMITS) as session:  # type: ignore[arg-type]
                    t1 = time.perf_counter()
                    session.feed_run(CODE, inputs={"a": i, "b": 1}, print_callback=lambda _s, _t: None)
                    feeds.append(time.perf_counter() - t1)
                whole.append(time.perf_counter() - t0)
            out[gap] = (feeds, whole)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    args = ap.parse_args()
    nats = asyncio.run(nats_hops(args.samples))
    monty = monty_hops(args.samples)
    print(f"p50 of {args.samples} samples each, with the idleness before each sample\n")
    print("| idle before | JetStream publish, acked | core NATS, one connection to another | Monty feed | "
          "Monty checkout + feed + give back |")
    print("|---|---|---|---|---|")
    for gap in GAPS:
        (acked, core), (feeds, whole) = nats[gap], monty[gap]
        cells = " | ".join(p50_us(x) for x in (acked, core, feeds, whole))
        print(f"| {gap * 1000:.0f} ms | {cells} |")


if __name__ == "__main__":
    main()
