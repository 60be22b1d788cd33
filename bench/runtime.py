"""The runtime's own cost: per-step overhead of the agent host with a zero-latency scripted model, and
sandboxed tool calls per second through host + NATS + `sa worker` processes beside Monty-alone runs/s.

    .venv/bin/python bench/runtime.py [--runs 40] [--agents 32] [--steps 4]

Per-step overhead. Agents run `chain: N` tasks: N turns of one calculator call each, then a submit. For
every turn the host's overhead is the turn's wall time (from `model.requested` of turn k to that of turn
k+1, both stamped by the host) minus the model's own latency (`latency_ms`, measured around the HTTP
call) minus the script's time in the sandbox (`duration_ms`): what is left is the runtime — event appends
with OCC, the job publish, the worker's fetch and outcome publish, the host's consume and the appends
of the outcome. "model step" is the same for a turn without tools (`run.started` -> `run.completed` of
a task answered in one reply, minus model latency). Sequential runs measure latency; no run overlaps.

Tool calls/s end to end. `--agents` agents at once, each with a `chain:` task, through one host and 1
or 2 worker processes; calls/s = tool calls recorded / wall time. Beside it, the same calculator script
run directly in this process with `bench/worker.py`'s Monty-alone loop (the ratio is what the runtime
costs). Numbers only; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
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

from runtime import bus  # noqa: E402
from runtime import events as ev  # noqa: E402
from runtime.testing import ScriptedModelServer, last_message  # noqa: E402

SUBMIT = '''\
"""Finish the task with its answer."""
from grail import Input

answer: str = Input("answer")

{"answer": answer}
'''


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def responder(body: dict[str, Any]) -> str:
    """`chain: N` -> N calculator calls, one per turn, then submit; `answer: X` -> a plain text answer."""
    task = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    if task.startswith("answer:"):
        return task.split(":", 1)[1].strip()
    done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
    if done < int(task.split(":")[1]):
        return call("calculator", {"expression": f"{done} * 3 + 1"})
    return call("submit", {"answer": last_message(body)[-20:]})


def bundle(root: Path, model_url: str) -> Path:
    folder = root / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submit.pym").write_text(SUBMIT)
    (folder / "calculator.pym").write_text((ROOT / "agents" / "calculator.pym").read_text())
    path = folder / "bundle.yaml"
    path.write_text("name: bench\nsystem_prompt: Compute.\nmodel: {adapter: hermes, base_url: "
                    f"'{model_url}', name: scripted}}\nconstraint: {{strategy: ebnf}}\ntools:\n"
                    "  - submit.pym\n  - calculator.pym\n"
                    "termination: {terminal_tool: submit, max_turns: 50}\n")
    return path


def start_host(url: str, path: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "host", str(path)]
    proc = subprocess.Popen(cmd, env={**os.environ, "NATS_URL": url}, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))
    while b"serving" not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    return proc


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def turn_overheads(events: list[ev.Event]) -> list[float]:
    """Per tool turn: wall time between consecutive model requests minus model latency and sandbox time."""
    out = []
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    for a, b in itertools.pairwise(requested):
        inside = [e for e in events if a.seq < e.seq < b.seq]
        model = sum(e.latency_ms for e in inside if isinstance(e, ev.ModelResponded))
        tools = sum(e.duration_ms for e in inside if isinstance(e, ev.ScriptCompleted))
        out.append((b.ts - a.ts) * 1000 - model - tools)
    return out


async def monty_alone(n: int, concurrency: int) -> float:
    """Runs/s of the calculator called directly in this process (no NATS, no host), as in bench/worker.py."""
    from runtime.tools import ScriptTool, ToolContext

    tool = ScriptTool.from_path(ROOT / "agents" / "calculator.pym")
    await tool.execute({"expression": "1 + 1"}, ToolContext())  # warm the pool
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            r = await tool.execute({"expression": f"{i} * 3 + 1"}, ToolContext())
            assert r.error is None, r.error

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return n / (time.perf_counter() - t0)


async def run_tasks(js: Any, tasks: list[tuple[str, str]]) -> list[list[ev.Event]]:
    from runtime.host.commands import publish_task
    from runtime.replay import follow

    runs = [await publish_task(js, agent, text) for agent, text in tasks]
    results: list[list[ev.Event]] = [[] for _ in runs]

    async def wait(i: int) -> None:
        async for e in follow(js, runs[i]):
            results[i].append(e)

    async with anyio.create_task_group() as tg:
        for i in range(len(runs)):
            tg.start_soon(wait, i)
    return results


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="sequential runs for the step overhead")
    ap.add_argument("--steps", type=int, default=4, help="tool turns per run")
    ap.add_argument("--agents", type=int, default=32, help="concurrent agents for calls/s")
    ap.add_argument("--chain", type=int, default=10, help="tool turns per agent for calls/s")
    args = ap.parse_args()

    import importlib.util

    spec = importlib.util.spec_from_file_location("worker_bench", ROOT / "bench" / "worker.py")
    assert spec is not None and spec.loader is not None
    worker_bench = importlib.util.module_from_spec(spec)  # bench/worker.py: Monty-alone, worker processes
    spec.loader.exec_module(worker_bench)

    with tempfile.TemporaryDirectory() as tmp, bus.EmbeddedNats(Path(tmp) / "nats") as server, \
            ScriptedModelServer(responder=responder, record=False) as model:
        path = bundle(Path(tmp), model.base_url)
        nc = await bus.connect(server.url)
        js = nc.jetstream()
        await bus.ensure_topology(js, partitions=4)
        host = start_host(server.url, path, Path(tmp) / "host.log")
        print(f"cores: {os.cpu_count()}   scripted model: zero latency over HTTP (this process)   "
              "host: an `sa host` process")
        try:
            procs = worker_bench.start_workers(server.url, path.parent, 1, 16, Path(tmp))
            try:
                await run_tasks(js, [("bench", "chain: 2")] * 4)  # warm up
                turns: list[float] = []
                answers: list[float] = []
                for i in range(args.runs):
                    (events,) = await run_tasks(js, [(f"bench:s{i}", f"chain: {args.steps}")])
                    assert ev.kind_of(events[-1]) == "run.completed", events[-1]
                    turns += turn_overheads(events)
                    (events,) = await run_tasks(js, [(f"bench:s{i}", f"answer: {i}")])
                    latency = sum(e.latency_ms for e in events if isinstance(e, ev.ModelResponded))
                    answers.append((events[-1].ts - events[0].ts) * 1000 - latency)
                print(f"\nper-step overhead ({args.runs} sequential runs; ms, runtime only: model "
                      "latency and sandbox time subtracted)")
                print(f"{'step':<44}{'p50':>8}{'p99':>8}{'n':>6}")
                print(f"{'tool turn (host -> NATS -> worker -> host)':<44}{statistics.median(turns):>8.2f}"
                      f"{pct(turns, 99):>8.2f}{len(turns):>6}")
                print(f"{'model-only run (3 appends around 1 call)':<44}{statistics.median(answers):>8.2f}"
                      f"{pct(answers, 99):>8.2f}{len(answers):>6}")
            finally:
                worker_bench.stop(procs)

            alone = await monty_alone(1000, 16)
            print(f"\ntool calls/s end to end ({args.agents} agents at once, {args.chain} tool turns each)")
            print(f"{'setup':<40}{'calls/s':>10}{'vs Monty alone':>16}{'runs/s':>9}")
            print(f"{'Monty alone (in-process, 16 at a time)':<40}{alone:>10.0f}{1.0:>15.2f}x")
            for k in (1, 2):
                procs = worker_bench.start_workers(server.url, path.parent, k, 16, Path(tmp))
                try:
                    await run_tasks(js, [(f"bench:w{i}", "chain: 1") for i in range(8)])  # warm pools
                    t0 = time.perf_counter()
                    results = await run_tasks(js, [(f"bench:c{k}-{i}", f"chain: {args.chain}")
                                                   for i in range(args.agents)])
                    wall = time.perf_counter() - t0
                finally:
                    worker_bench.stop(procs)
                calls = sum(isinstance(e, ev.ToolCalled) for r in results for e in r)
                assert all(ev.kind_of(r[-1]) == "run.completed" for r in results)
                rate = calls / wall
                label = f"host + {k} worker process{'es' if k > 1 else ''}"
                print(f"{label:<40}{rate:>10.0f}{rate / alone:>15.2f}x{len(results) / wall:>9.1f}")
        finally:
            host.terminate()
            host.wait(20)
        await bus.close(nc)


if __name__ == "__main__":
    asyncio.run(main())
