"""A tool turn under network latency: how many sequential NATS round trips are on its critical path.

    .venv/bin/python bench/latency.py [--runs 15] [--rounds 2] [--rtts 0,1,5,20]

One nats-server on loopback (no cluster: a client could learn a cluster's other servers and go around the
proxy); in front of it `testbed.latency.LatencyProxy` in its own process, adding RTT/2 each way; one
`sa host` and one `sa worker` that reach NATS only through the proxy (the host's lease thread too). The
scripted model server answers at once, on loopback, without the proxy, from this process: it records when
each request arrived and when it answered. This process publishes the tasks and reads the logs directly.

The workload is `bench/runtime.py`'s `fan: 4x1 add`: 4 turns each calling the sandboxed `add` tool, then a
turn calling `submit`; `--runs` runs one after the other (nothing overlaps), for each RTT, in `--rounds`
rounds (the RTTs alternate within a round; each gets a fresh host and worker). A tool turn is the time from
one `model.requested` to the next (both stamped by the host); the model call is `model.responded`'s
`latency_ms` (the HTTP call as the client timed it); the overhead is the turn minus the model call.

Printed per RTT: the medians of the turn, the model call and the overhead, and the split of the turn: the
median gap between consecutive points of its timeline (the events, with the server's arrival and answer put
after `model.requested`; host, worker and server share this machine's clock). Then the slope of each against
the RTT, fitted over the proxied RTTs: the overhead's slope is the number of sequential round trips on a
tool turn's critical path, a segment's slope its share of them (an RTT/2 leg counts 0.5). The slope is what
to read: noise moves the medians by a fraction of a millisecond, the RTT moves them by many.
Numbers only; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from runtime import events as ev  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.topology import ensure_topology  # noqa: E402
from runtime.testing import ScriptedModelServer  # noqa: E402

TASK = "fan: 4x1 add"  # 4 turns of one `add` call, then submit


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rb = _load("runtime")  # the bundle, its responder, `start_host`, `Endings`
wb = _load("worker")  # `start_workers`, `stop`


class TimedResponder:
    """`bench/runtime.py`'s responder, recording when each request arrived and was answered, keyed by the
    task's text and the tool responses the conversation holds (its turn)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], tuple[float, float]] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        arrived = time.time()
        messages = body["messages"]
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        task = str(messages[first]["content"])  # `TASK #tag`: the tag tells the runs apart
        untagged = [*messages[:first], {**messages[first], "content": task.split(" #")[0]},
                    *messages[first + 1:]]
        reply: str = rb.responder({**body, "messages": untagged})
        done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
        with self.lock:
            self.seen[(task, done)] = (arrived, time.time())
        return reply


def start_proxy(target: str, rtt_ms: float, tmp: Path, tag: str) -> tuple[subprocess.Popen[bytes], str]:
    """The latency proxy in its own process (its timers then never wait on this process's work)."""
    port_file = tmp / f"proxy-{tag}.port"  # one per round: an earlier proxy's port is a dead one
    proc = subprocess.Popen([sys.executable, "-m", "testbed.latency", "--target", target,
                             "--rtt-ms", str(rtt_ms), "--port-file", str(port_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)  # testbed/
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError("the latency proxy did not start")
        time.sleep(0.02)
    return proc, f"nats://127.0.0.1:{port_file.read_text()}"


def timeline(events: list[ev.Event], task: str, seen: dict[tuple[str, int], tuple[float, float]]
             ) -> list[list[tuple[str, float]]]:
    """Each tool turn as (label, unix time) points, `model.requested` to the next one (a script run carried
    by its outcome counts as its `script.*` events, at the sandbox's own times: `events.expand`)."""
    turns: list[list[tuple[str, float]]] = []
    current: list[tuple[str, float]] = []
    for e in ev.expand_all(events):
        kind = ev.kind_of(e)
        if isinstance(e, ev.ModelRequested):
            if current:
                turns.append([*current, (kind, e.ts)])
            current = [(kind, e.ts)]
            times = seen.get((task, len(turns)))
            if times is not None:
                current += [("server: arrival", times[0]), ("server: answer", times[1])]
        elif current:
            current.append((kind, e.ts))
    return turns


class Measure:
    """Every tool turn's figures at one RTT, pooled over the rounds."""

    def __init__(self) -> None:
        self.turn: list[float] = []
        self.model: list[float] = []
        self.gaps: dict[str, list[float]] = {}

    def add(self, events: list[ev.Event], task: str,
            seen: dict[tuple[str, int], tuple[float, float]]) -> None:
        responded = [e for e in events if isinstance(e, ev.ModelResponded)]
        for k, points in enumerate(timeline(events, task, seen)):
            wall = (points[-1][1] - points[0][1]) * 1000
            self.turn.append(wall)
            self.model.append(responded[k].latency_ms)
            for (a, ta), (b, tb) in itertools.pairwise(points):
                self.gaps.setdefault(f"{a} -> {b}", []).append((tb - ta) * 1000)

    @property
    def overhead(self) -> list[float]:
        return [t - m for t, m in zip(self.turn, self.model, strict=True)]


async def one_round(js: Any, nats_url: str, path: Path, tmp: Path, rtt: float, runs: int,
                    responder: TimedResponder, measure: Measure, tag: str) -> None:
    """A fresh host and worker talking to NATS through a proxy of `rtt` ms (none at 0), `runs` runs."""
    proxy = None
    url = nats_url
    if rtt > 0:
        proxy, url = start_proxy(nats_url.removeprefix("nats://"), rtt, tmp, tag)
    host = workers = None
    endings = await rb.Endings(js._nc).open()
    try:
        host = rb.start_host(url, path, tmp / f"host-{tag}.log")
        workers = wb.start_workers(url, path.parent, 1, 16, tmp)
        from runtime.commands import publish_task
        from runtime.log import RunLog

        for i in range(runs + 2):  # the first two warm the host, the worker and the sandbox pool
            task = f"{TASK} #{tag}-{i}"
            run = await publish_task(js, f"bench:l{tag}-{i}", task)
            end = await endings.wait(run)
            assert ev.kind_of(end) == "run.completed", end
            if i >= 2:
                measure.add((await RunLog(js).read(run)).events, task, responder.seen)
    finally:
        await endings.close()
        if workers is not None:
            wb.stop(workers)
        if host is not None:
            host.terminate()
            host.wait(20)
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys against xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def report(measures: dict[float, Measure], runs: int, rounds: int) -> None:
    rtts = sorted(measures)
    fitted = [r for r in rtts if r > 0]
    print(f"cores: {os.cpu_count()}   {rounds} rounds x {runs} sequential runs of `{TASK}` per RTT; "
          "host and worker reach NATS through the proxy; medians in ms")
    head = f"{'':<52}" + "".join(f"{'RTT ' + format(r, 'g') + ' ms':>12}" for r in rtts)
    print(head + f"{'slope (RTTs)':>14}")

    def row(label: str, values: dict[float, list[float]]) -> None:
        meds = {r: statistics.median(v) for r, v in values.items() if v}
        cells = "".join(f"{meds[r]:>12.2f}" if r in meds else f"{'-':>12}" for r in rtts)
        ok = [r for r in fitted if r in meds]
        fit = f"{slope(ok, [meds[r] for r in ok]):>14.2f}" if len(ok) >= 2 else f"{'-':>14}"
        print(f"{label:<52}{cells}{fit}")

    row("tool turn (model.requested -> next)", {r: m.turn for r, m in measures.items()})
    row("model call (latency_ms)", {r: m.model for r, m in measures.items()})
    row("overhead (turn - model call)", {r: m.overhead for r, m in measures.items()})
    print(f"{'turns measured':<52}" + "".join(f"{len(measures[r].turn):>12}" for r in rtts))
    print("\nthe split of a tool turn (median gap between consecutive points; slope = round trips in it)")
    labels = list(dict.fromkeys(k for r in rtts for k in measures[r].gaps))
    for label in labels:
        row("  " + label, {r: measures[r].gaps.get(label, []) for r in rtts})


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="sequential runs per RTT per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the RTTs alternating in each")
    ap.add_argument("--rtts", default="0,1,5,20", help="injected round trips, ms (0: no proxy)")
    args = ap.parse_args()
    rtts = [float(x) for x in args.rtts.split(",")]
    responder = TimedResponder()
    measures = {r: Measure() for r in rtts}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server, \
            ScriptedModelServer(responder=responder, record=False) as model:
        path = rb.bundle(Path(tmp), model.base_url)
        nc = await connect(server.url, name="bench-latency")
        js = nc.jetstream()
        await ensure_topology(js, partitions=4)
        try:
            for n in range(args.rounds):
                for rtt in rtts:
                    await one_round(js, server.url, path, Path(tmp), rtt, args.runs, responder, measures[rtt],
                                    f"{n}-{rtt:g}")
                    print(f"round {n + 1}/{args.rounds}, RTT {rtt:g} ms: done", file=sys.stderr, flush=True)
                if n + 1 < args.rounds:  # a long run on a loaded box still leaves figures if stopped
                    report(measures, args.runs, n + 1)
                    print(flush=True)
        finally:
            await close(nc)
    report(measures, args.runs, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
