"""The runtime's own cost: per-step overhead of the agent host with a zero-latency scripted model, and
sandboxed tool calls per second through host + NATS + `sa worker` processes beside Monty-alone runs/s.

    .venv/bin/python bench/runtime.py [--runs 40] [--agents 32] [--chain 10] [--fan 4x8] [--only-observe]
                                      [--only-stream]

Per-step overhead. Agents run `chain: N` tasks: N turns of one calculator call each, then a submit. For
every turn, from `model.requested` of turn k to that of turn k+1 (both stamped by the host), the
overhead is the turn's wall time minus the script's time in the sandbox (`duration_ms`): event appends
with OCC, the job publish, the worker's fetch and outcome publish, the host's consume and the appends of
the outcome, and the HTTP round trip to the zero-latency model. The "runtime only" column also subtracts
the model call as the client timed it (`latency_ms`); the host appends while that call is in flight, so
that column flatters the runtime by what overlaps the call, and the other one charges it the model
client's HTTP cost: the truth is between the two. "model-only run" is the same for a task answered in
one reply (`run.started` -> `run.completed`). Sequential runs measure latency; no run overlaps.

Tool calls/s end to end. `--agents` agents at once through one host and 1 or 2 worker processes; calls/s
= tool calls recorded / wall time. Two workloads: `chain` (one call per model reply, so every call also
pays a model round trip and a turn) and `fan` (`T x C`: T turns of C parallel calls per reply, which
measures the runtime's tool path). Beside them, the same calculator script run directly in this
process with `bench/worker.py`'s Monty-alone loop, in the same run (the ratio is what the runtime costs),
and the host's CPU per call. Numbers only; nothing asserts a time.

What observation costs (`runtime.observe`). The same workload (`--obs-agents` agents of `chain:
--obs-chain`) through a fresh `sa host` with metrics off, then on (`--metrics-port`), alternating for
`--obs-rounds` rounds in the same run: the host's CPU per turn each way and their ratio (the target is
within 3%). Meanwhile an `sa otel` process exports every run's trace to a local OTLP/HTTP sink that
accepts and drops them: its own CPU per exported event, measured from a drained start to a drained end.

What streaming costs (`runtime.streaming`). The same workload (`--obs-agents` agents of `chain:
--obs-chain`) through a fresh `sa host` whose bundle asks the model for a stream and publishes every
fragment on `stream.<actor>.<run>` (the default), then one whose bundle says `conversation: {stream:
false}`, alternating for `--obs-rounds` rounds in the same run: the host's CPU per turn each way and their
ratio. The scripted model sends its SSE replies in 8-character chunks (about two tokens each).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# this file is named like the `runtime` package: take bench/ off the path so the package is what imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from runtime import events as ev  # noqa: E402
from runtime.nats.connection import close, connect  # noqa: E402
from runtime.nats.server import EmbeddedNats  # noqa: E402
from runtime.nats.topology import ensure_topology  # noqa: E402
from runtime.testing import ScriptedModelServer, last_message  # noqa: E402
from runtime.testing import hermes_call as call  # noqa: E402
from testbed.scripts import ADD, SUBMIT  # noqa: E402


def responder(body: dict[str, Any]) -> str:
    """`chain: N` -> N calculator calls, one per turn, then submit; `fan: TxC [add]` -> T turns of C
    parallel calculator (or `add`) calls, then submit; `answer: X` -> a plain text answer."""
    task = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    kind, _, arg = task.partition(":")
    if kind == "answer":
        return arg.strip()
    done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
    shape, _, tool = arg.strip().partition(" ")
    turns, _, width = shape.partition("x")
    if done < int(turns):
        if tool == "add":
            calls = [call("add", {"a": done, "b": i}) for i in range(int(width or 1))]
        else:
            calls = [call("calculator", {"expression": f"{done} * 3 + {i}"}) for i in range(int(width or 1))]
        return "\n".join(calls)
    return call("submit", {"answer": last_message(body)[-20:]})


def bundle(root: Path, model_url: str) -> Path:
    folder = root / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submit.pym").write_text(SUBMIT)
    (folder / "calculator.pym").write_text((ROOT / "agents" / "calculator.pym").read_text())
    (folder / "add.pym").write_text(ADD)
    path = folder / "bundle.yaml"
    path.write_text("name: bench\nsystem_prompt: Compute.\nmodel: {adapter: hermes, base_url: "
                    f"'{model_url}', name: scripted}}\nconstraint: {{strategy: ebnf}}\ntools:\n"
                    "  - submit.pym\n  - calculator.pym\n  - add.pym\n"
                    "termination: {terminal_tool: submit, max_turns: 50}\nmax_concurrent_tools: 16\n"
                    # the peers compared with (bench/peers.py) do not stream; `streaming_cost` turns it on
                    "conversation: {stream: false}\n")
    return path


def start_host(url: str, path: Path, log: Path, *extra: str, env: dict[str, str] | None = None,
               before: str = "") -> subprocess.Popen[bytes]:
    """`sa host` in its own process; `before`: Python it runs first (e.g. `bench/sdk_aiohttp.py`'s hook)."""
    cmd = [sys.executable, "-c", f"{before}from runtime.cli import main; main()", "host", str(path), *extra]
    proc = subprocess.Popen(cmd, env={**os.environ, "NATS_URL": url, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    while b"serving" not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    return proc


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def turn_overheads(events: list[ev.Event]) -> list[tuple[float, float]]:
    """Per tool turn: (wall time between consecutive model requests minus sandbox time, the same minus
    the model call as the client timed it)."""
    out = []
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    for a, b in itertools.pairwise(requested):
        inside = [e for e in ev.expand_all(events) if a.seq < e.seq < b.seq]  # script runs: in outcomes
        model = sum(e.latency_ms for e in inside if isinstance(e, ev.ModelResponded))
        tools = sum(e.duration_ms for e in inside if isinstance(e, ev.ScriptCompleted))
        wall = (b.ts - a.ts) * 1000 - tools
        out.append((wall, wall - model))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), to charge the host its CPU per call."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def monty_alone(path: Path, n: int, concurrency: int) -> float:
    """Runs/s of a bench tool called directly in this process (no NATS, no host), as in bench/worker.py."""
    from runtime.tools import ScriptTool, ToolContext

    tool = ScriptTool.from_path(path)

    def arguments(i: int) -> dict[str, Any]:
        return {"a": i, "b": 1} if tool.name == "add" else {"expression": f"{i} * 3 + 1"}

    await tool.execute(arguments(0), ToolContext())  # warm the pool
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            r = await tool.execute(arguments(i), ToolContext())
            assert r.error is None, r.error

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return n / (time.perf_counter() - t0)


class Endings:
    """Every run's ending as it is appended, from core subscriptions on the ending events: how a client that
    only needs the outcome learns it, with no consumer per run (one per run would load these two cores with
    the watcher's work). Open it before publishing the tasks it waits for."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self._ended: dict[str, ev.Event] = {}
        self._waiting: dict[str, asyncio.Future[ev.Event]] = {}
        self._subs: list[Any] = []

    async def open(self) -> Endings:
        from runtime.log import TERMINAL_KINDS

        for kind in sorted(TERMINAL_KINDS):
            self._subs.append(await self.nc.subscribe(f"events.*.*.{kind}", cb=self._on_end))
        return self

    async def _on_end(self, msg: Any) -> None:
        event = ev.decode_all(msg.data)[-1]  # a group that ends a run ends with its ending
        waiter = self._waiting.pop(event.run_id, None)
        if waiter is not None:
            waiter.set_result(event)
        else:  # it ended before anyone waited for it
            self._ended[event.run_id] = event

    async def wait(self, run: str) -> ev.Event:
        """The ending event of `run` (at once if it already ended)."""
        end = self._ended.pop(run, None)
        if end is None:
            future = self._waiting[run] = asyncio.get_running_loop().create_future()
            end = await future
        return end

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()


async def run_tasks(js: Any, tasks: list[tuple[str, str]], ended: list[float] | None = None
                    ) -> list[list[ev.Event]]:
    """Publish `tasks`, wait until every run has ended (`Endings`: the scripted model server shares this
    process), then read each run's events. `ended` gets the `perf_counter` time the last run ended, for
    rates that must not include reading the events back."""
    from runtime.commands import publish_task
    from runtime.log import RunLog

    endings = await Endings(js._nc).open()
    try:
        runs = [await publish_task(js, agent, text) for agent, text in tasks]
        for run in runs:
            await endings.wait(run)
        if ended is not None:
            ended.append(time.perf_counter())
    finally:
        await endings.close()
    return [(await RunLog(js).read(run)).events for run in runs]


class _Sink:
    """A local OTLP/HTTP endpoint that accepts every export and keeps nothing (the exporter's cost only)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


async def drained(js: Any, durable: str) -> None:
    """Until the exporter's durable consumer has nothing pending and nothing unacked."""
    from runtime.nats.subjects import EVENTS

    while True:
        info = await js.consumer_info(EVENTS, durable)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await anyio.sleep(0.1)


async def observation(js: Any, url: str, path: Path, tmp: Path, worker_bench: Any, args: Any) -> None:
    from runtime.nats.subjects import EVENTS

    sink = _Sink()
    exporter = subprocess.Popen([sys.executable, "-c", "from runtime.cli import main; main()", "otel",
                                 "--nats", url, "--endpoint", sink.url, "--durable", "bench-otel"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "otel.log", "wb"))
    procs = worker_bench.start_workers(url, path.parent, 1, 16, tmp)
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    turns: dict[str, int] = {"off": 0, "on": 0}
    try:
        await drained_when_ready(js, exporter)
        ex_cpu0, events0 = cpu_seconds(exporter.pid), (await js.stream_info(EVENTS)).state.messages
        for r in range(args.obs_rounds):
            for mode in ("off", "on"):
                extra = ("--metrics-port", "0") if mode == "on" else ()
                host = start_host(url, path, tmp / f"host-{mode}-{r}.log", *extra)
                try:
                    await run_tasks(js, [(f"bench:o{mode}{r}-{i}", "chain: 2") for i in range(4)])  # warm
                    c0 = cpu_seconds(host.pid)
                    results = await run_tasks(js, [(f"bench:o{mode}{r}-{i}", f"chain: {args.obs_chain}")
                                                   for i in range(args.obs_agents)])
                    cpu[mode].append(cpu_seconds(host.pid) - c0)
                    turns[mode] += sum(isinstance(e, ev.TurnCompleted) for res in results for e in res)
                finally:
                    host.terminate()
                    host.wait(20)
        await drained(js, "bench-otel")
        ex_cpu = cpu_seconds(exporter.pid) - ex_cpu0
        exported = (await js.stream_info(EVENTS)).state.messages - events0
    finally:
        worker_bench.stop(procs)
        exporter.terminate()
        exporter.wait(20)
        sink.server.shutdown()
    off, on = sum(cpu["off"]) / turns["off"] * 1000, sum(cpu["on"]) / turns["on"] * 1000
    print(f"\nobservation cost ({args.obs_rounds} rounds x {args.obs_agents} agents x chain "
          f"{args.obs_chain}; host CPU per turn, same run)")
    print(f"{'host, metrics off':<44}{off:>9.3f} ms/turn   ({turns['off']} turns)")
    print(f"{'host, metrics on (--metrics-port)':<44}{on:>9.3f} ms/turn   ({turns['on']} turns)")
    print(f"{'on / off':<44}{on / off:>9.3f}x")
    print(f"{'sa otel: its own CPU per exported event':<44}{ex_cpu / exported * 1e6:>9.1f} us/event "
          f"({exported} events, {ex_cpu:.2f} s CPU)")


async def streaming_cost(js: Any, url: str, path: Path, tmp: Path, worker_bench: Any, args: Any) -> None:
    """Host CPU per turn with the model's output streamed (and published) and without, same run."""
    loud = path.with_name("bundle-stream.yaml")
    loud.write_text(path.read_text().replace("conversation: {stream: false}", "conversation: {stream: true}"))
    procs = worker_bench.start_workers(url, path.parent, 1, 16, tmp)
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    turns: dict[str, int] = {"on": 0, "off": 0}
    counted = [0]

    async def count(_msg: Any) -> None:
        counted[0] += 1

    try:
        for r in range(args.obs_rounds):
            for mode in ("on", "off"):
                host = start_host(url, loud if mode == "on" else path, tmp / f"host-stream-{mode}-{r}.log")
                try:
                    await run_tasks(js, [(f"bench:s{mode}{r}-{i}", "chain: 2") for i in range(4)])  # warm
                    sub = await js._nc.subscribe("stream.>", cb=count)
                    c0 = cpu_seconds(host.pid)
                    results = await run_tasks(js, [(f"bench:s{mode}{r}-{i}", f"chain: {args.obs_chain}")
                                                   for i in range(args.obs_agents)])
                    cpu[mode].append(cpu_seconds(host.pid) - c0)
                    await sub.unsubscribe()
                    turns[mode] += sum(isinstance(e, ev.TurnCompleted) for res in results for e in res)
                finally:
                    host.terminate()
                    host.wait(20)
    finally:
        worker_bench.stop(procs)
    on, off = sum(cpu["on"]) / turns["on"] * 1000, sum(cpu["off"]) / turns["off"] * 1000
    print(f"\nstreaming cost ({args.obs_rounds} rounds x {args.obs_agents} agents x chain {args.obs_chain}; "
          "host CPU per turn, same run)")
    print(f"{'host, no stream (conversation.stream: false)':<48}{off:>9.3f} ms/turn   ({turns['off']} turns)")
    print(f"{'host, streaming (SSE in, deltas on NATS)':<48}{on:>9.3f} ms/turn   ({turns['on']} turns, "
          f"{counted[0]} deltas published)")
    print(f"{'streaming / no stream':<48}{on / off:>9.3f}x")


async def in_flight(js: Any, url: str, path: Path, tmp: Path, worker_bench: Any, args: Any) -> None:
    """Turns/s and the host's CPU per turn with N agents in flight, for each way the model call travels
    (`SA_MODEL_HTTP`: the openai SDK over its default httpx2/httpcore2 pool, the SDK over aiohttp's pool
    (`bench/sdk_aiohttp.py`, a variant the runtime no longer ships), then `direct`, the default: aiohttp
    without the SDK's request machinery), alternating in rounds in the
    same run. Workload: the issue's agent turn, one model call plus one trivial `add` tool call in
    the sandbox of a worker process (2 workers); each agent runs `--flight-turns` such turns then submits."""
    levels = [int(n) for n in args.flight.split(",")]
    modes = ("httpx", "aiohttp", "direct")
    ways: dict[str, dict[str, Any]] = {  # `aiohttp`: the SDK (httpx mode) over bench/sdk_aiohttp.py
        "httpx": {"env": {"SA_MODEL_HTTP": "httpx"}},
        "aiohttp": {"env": {"SA_MODEL_HTTP": "httpx"},
                    "before": f"import sys; sys.path.append({str(ROOT / 'bench')!r}); "
                              "import sdk_aiohttp; sdk_aiohttp.install(); "},
        "direct": {"env": {"SA_MODEL_HTTP": "direct"}},
    }
    rate: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    procs = worker_bench.start_workers(url, path.parent, 2, 16, tmp)
    try:
        for r in range(args.flight_rounds):
            for mode in modes:
                host = start_host(url, path, tmp / f"host-{mode}-{r}.log", **ways[mode])
                try:
                    warm = [(f"bench:f{mode}{r}-{i}", "fan: 2x1 add") for i in range(20)]
                    await run_tasks(js, warm)
                    for n in levels:
                        task = f"fan: {args.flight_turns}x1 add"
                        c0, t0, end = cpu_seconds(host.pid), time.perf_counter(), []
                        results = await run_tasks(js, [(f"bench:f{mode}{r}-{n}-{i}", task) for i in range(n)],
                                                  end)
                        wall, used = end[0] - t0, cpu_seconds(host.pid) - c0
                        assert all(ev.kind_of(res[-1]) == "run.completed" for res in results)
                        turns = sum(isinstance(e, ev.ModelResponded) for res in results for e in res)
                        rate.setdefault((mode, n), []).append(turns / wall)
                        cpu.setdefault((mode, n), []).append(used / turns * 1000)
                finally:
                    host.terminate()
                    host.wait(20)
    finally:
        worker_bench.stop(procs)
    print(f"\nthe model call's HTTP transport ({args.flight_rounds} alternating rounds; agents of "
          f"{args.flight_turns} turns of one model call + one `add` call, then a submit; 2 workers; medians)")
    print(f"{'in flight':<12}{'transport':<38}{'turns/s':>9}{'host CPU/turn':>15}{'turns/s ratio':>15}"
          f"{'CPU ratio':>11}")
    for n in levels:
        base_rate, base_cpu = statistics.median(rate[("httpx", n)]), statistics.median(cpu[("httpx", n)])
        for mode, label in (("httpx", "openai SDK, its httpx2/httpcore2 pool"),
                            ("aiohttp", "openai SDK over aiohttp's pool"),
                            ("direct", "direct: aiohttp, SDK headers+errors")):
            rt, cp = statistics.median(rate[(mode, n)]), statistics.median(cpu[(mode, n)])
            print(f"{n:<12}{label:<38}{rt:>9.0f}{cp:>12.2f} ms{rt / base_rate:>14.2f}x"
                  f"{cp / base_cpu:>10.2f}x")


async def drained_when_ready(js: Any, exporter: subprocess.Popen[bytes]) -> None:
    """Until `sa otel` made its consumer and exported the backlog (its start-up is not charged)."""
    from nats.js.errors import NotFoundError

    while True:
        if exporter.poll() is not None:
            raise RuntimeError("sa otel exited")
        try:
            await drained(js, "bench-otel")
            return
        except NotFoundError:
            await anyio.sleep(0.1)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="sequential runs for the step overhead")
    ap.add_argument("--steps", type=int, default=4, help="tool turns per run")
    ap.add_argument("--agents", type=int, default=32, help="concurrent agents for calls/s")
    ap.add_argument("--chain", type=int, default=10, help="tool turns (one call each) per agent, chained")
    ap.add_argument("--fan", default="4x8", help="TxC: turns x parallel calls per agent, fan-out")
    ap.add_argument("--obs-agents", type=int, default=16, help="agents per round of the observation cost")
    ap.add_argument("--obs-chain", type=int, default=10, help="tool turns per agent there")
    ap.add_argument("--obs-rounds", type=int, default=3, help="metrics off/on rounds, alternating")
    ap.add_argument("--only-observe", action="store_true", help="only the observation cost")
    ap.add_argument("--only-stream", action="store_true", help="only the streaming cost")
    ap.add_argument("--flight", default="20,100", help="agents in flight for the transport comparison")
    ap.add_argument("--flight-turns", type=int, default=10, help="tool turns per agent there")
    ap.add_argument("--flight-rounds", type=int, default=2, help="httpx/aiohttp rounds, alternating")
    ap.add_argument("--only-flight", action="store_true", help="only the model-call transport comparison")
    args = ap.parse_args()

    import importlib.util

    spec = importlib.util.spec_from_file_location("worker_bench", ROOT / "bench" / "worker.py")
    assert spec is not None and spec.loader is not None
    worker_bench = importlib.util.module_from_spec(spec)  # bench/worker.py: Monty-alone, worker processes
    spec.loader.exec_module(worker_bench)

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server, \
            ScriptedModelServer(responder=responder, record=False) as model:
        path = bundle(Path(tmp), model.base_url)
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js, partitions=4)
        if args.only_observe or args.only_flight:
            run = observation if args.only_observe else in_flight
            await run(js, server.url, path, Path(tmp), worker_bench, args)
            await close(nc)
            return
        if args.only_stream:
            await streaming_cost(js, server.url, path, Path(tmp), worker_bench, args)
            await close(nc)
            return
        host = start_host(server.url, path, Path(tmp) / "host.log")
        print(f"cores: {os.cpu_count()}   scripted model: zero latency over HTTP (this process)   "
              "host: an `sa host` process")
        try:
            procs = worker_bench.start_workers(server.url, path.parent, 1, 16, Path(tmp))
            try:
                await run_tasks(js, [("bench", "chain: 2")] * 4)  # warm up
                turns: list[tuple[float, float]] = []
                answers: list[tuple[float, float]] = []
                for i in range(args.runs):
                    (events,) = await run_tasks(js, [(f"bench:s{i}", f"chain: {args.steps}")])
                    assert ev.kind_of(events[-1]) == "run.completed", events[-1]
                    turns += turn_overheads(events)
                    (events,) = await run_tasks(js, [(f"bench:s{i}", f"answer: {i}")])
                    latency = sum(e.latency_ms for e in events if isinstance(e, ev.ModelResponded))
                    wall = (events[-1].ts - events[0].ts) * 1000
                    answers.append((wall, wall - latency))
                print(f"\nper-step overhead ({args.runs} sequential runs; ms; sandbox time subtracted; "
                      "see the module docstring for the two columns)")
                print(f"{'step':<44}{'incl. model HTTP':>18}{'runtime only':>16}{'n':>6}")
                print(f"{'':<44}{'p50':>9}{'p99':>9}{'p50':>8}{'p99':>8}")
                for label, rows in (("tool turn (host -> NATS -> worker -> host)", turns),
                                    ("model-only run (run.started -> completed)", answers)):
                    full, only = [r[0] for r in rows], [r[1] for r in rows]
                    print(f"{label:<44}{statistics.median(full):>9.2f}{pct(full, 99):>9.2f}"
                          f"{statistics.median(only):>8.2f}{pct(only, 99):>8.2f}{len(rows):>6}")
            finally:
                worker_bench.stop(procs)

            alone = {name: await monty_alone(path.parent / f"{name}.pym", 1000, 16)
                     for name in ("calculator", "add")}
            turns_n, _, width = args.fan.partition("x")
            workloads = (("chain", f"chain: {args.chain}", f"calculator, {args.chain} turns x 1 call"),
                         ("fan", f"fan: {args.fan}", f"calculator, {turns_n} turns x {width} calls"),
                         ("fan-add", f"fan: {args.fan} add", f"add, {turns_n} turns x {width} calls"))
            print(f"\ntool calls/s end to end ({args.agents} agents at once; Monty alone measured in this "
                  "run)")
            print(f"{'setup':<50}{'calls/s':>9}{'vs Monty':>10}{'runs/s':>8}{'host CPU/call':>15}")
            for name, rate in alone.items():
                label = f"Monty alone: {name} (in-process, 16 at a time)"
                print(f"{label:<50}{rate:>9.0f}{1.0:>9.2f}x")
            for k in (1, 2):
                procs = worker_bench.start_workers(server.url, path.parent, k, 16, Path(tmp))
                try:
                    await run_tasks(js, [(f"bench:w{k}-{i}", "fan: 1x4") for i in range(8)])  # warm pools
                    for name, task, shape in workloads:
                        cpu0, t0, end = cpu_seconds(host.pid), time.perf_counter(), []
                        results = await run_tasks(js, [(f"bench:{name}{k}-{i}", task)
                                                       for i in range(args.agents)], end)
                        wall, cpu = end[0] - t0, cpu_seconds(host.pid) - cpu0
                        calls = sum(isinstance(e, ev.ToolCalled) for r in results for e in r)
                        assert all(ev.kind_of(r[-1]) == "run.completed" for r in results)
                        rate = calls / wall
                        label = f"{name} ({shape}), {k} worker{'s' if k > 1 else ''}"
                        base = alone["add" if name == "fan-add" else "calculator"]
                        print(f"{label:<50}{rate:>9.0f}{rate / base:>9.2f}x{len(results) / wall:>8.1f}"
                              f"{cpu / calls * 1000:>12.2f} ms")
                finally:
                    worker_bench.stop(procs)
        finally:
            host.terminate()
            host.wait(20)
        await in_flight(js, server.url, path, Path(tmp), worker_bench, args)
        await observation(js, server.url, path, Path(tmp), worker_bench, args)
        await streaming_cost(js, server.url, path, Path(tmp), worker_bench, args)
        await close(nc)


if __name__ == "__main__":
    asyncio.run(main())
