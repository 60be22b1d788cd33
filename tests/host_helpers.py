"""Shared pieces of the runtime tests: a calculator bundle, a deterministic scripted model, and an
in-process host + worker on a real nats-server (`running_fleet`: model, host and worker in one; imported
by tests/test_host*.py, test_replay*.py and others)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from runtime import events as ev
from runtime import nats as bus
from runtime.host import Host, HostConfig, load_agents
from runtime.host.leases import LeaseConfig
from runtime.log import RunLog
from runtime.model.client import ModelClient
from runtime.testing import Reply, Responder, ScriptedModelServer, hermes_call, last_message
from runtime.worker import Worker, build_registry
from testbed.scripts import APPEND_LINE

AGENTS = Path(__file__).parents[1] / "agents"

SUBMIT = '''\
"""Finish the task with its answer."""
from grail import Input

answer: str = Input("answer", description="the final answer")

{"answer": answer}
'''

NOTE = APPEND_LINE  # as `note.pym`: a line appended to /data/log.txt


def write_bundle(root: Path, name: str = "calc", *, tools: tuple[str, ...] = ("calculator",),
                 extra: str = "", base_url: str = "http://127.0.0.1:9/v1",
                 terminal: str | None = "submit") -> Path:
    """A bundle using the hermes adapter with `agents/calculator.pym` (and/or a workspace `note` tool)
    plus a `submit` tool, its terminal tool unless `terminal` says otherwise (None: a run ends on a reply in
    text, as a bundle without a terminal tool does); returns the bundle file."""
    folder = root / name
    (folder / "tools").mkdir(parents=True, exist_ok=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    entries = ["  - tools/submit.pym"]
    if "calculator" in tools:
        entries.append(f"  - {AGENTS / 'calculator.pym'}")
    if "note" in tools:
        (folder / "tools" / "note.pym").write_text(NOTE)
        entries.append("  - tools/note.pym")
    ending = f"terminal_tool: {terminal}, " if terminal else ""
    text = (f"name: {name}\nsystem_prompt: You compute things with tools.\n"
            f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
            "constraint: {strategy: ebnf}\n"
            "tools:\n" + "\n".join(entries) + "\n"
            f"termination: {{{ending}max_turns: 6}}\n" + extra)
    path = folder / "bundle.yaml"
    path.write_text(text)
    return path



def calc_responder(body: dict[str, Any]) -> str:
    """Deterministic per conversation (safe for many concurrent agents): a task `compute: <expr>` gets a
    calculator call, a `note: <line>` task a note call, and any tool response a submit of what it said."""
    last = last_message(body)
    first = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    if "<tool_response>" in last and not first.startswith("chain:"):
        m = re.search(r'"value": ([^,}\s]+)', last) or re.search(r'"lines": (\d+)', last)
        return hermes_call("submit", {"answer": m.group(1) if m else last[-40:]})
    task = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    if task.startswith("chain:"):  # `chain: N` makes N calculator calls, one per turn, then submits
        done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
        if done < int(task.split(":")[1]):
            return hermes_call("calculator", {"expression": f"{done} + 1"})
        return hermes_call("submit", {"answer": f"chained {done}"})
    if task.startswith("note:"):
        line = task.split(":", 1)[1].strip()
        spin = 0
        if "|spin=" in line:
            line, spin_s = line.split("|spin=")
            spin = int(spin_s)
        return hermes_call("note", {"line": line, "spin": spin})
    expr = task.split(":", 1)[1].strip() if ":" in task else task
    return hermes_call("calculator", {"expression": expr})


@dataclass
class Env:
    url: str
    js: Any
    host: Host | None
    server: ScriptedModelServer
    events: list[ev.Event]

    async def wait_run(self, run_id: str, timeout: float = 60.0) -> list[ev.Event]:
        """Every event of the run up to and including its terminal event."""
        out: list[ev.Event] = []
        with anyio.fail_after(timeout):
            async for e in RunLog(self.js).follow(run_id):
                out.append(e)
        return out


@asynccontextmanager
async def running_host(url: str, bundles: list[Path], server: ScriptedModelServer, *,
                       config: HostConfig | None = None) -> AsyncIterator[Host]:
    nc = await bus.connect(url, name="test-host")
    client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
    agents = load_agents(bundles, client=client)
    seen: list[ev.Event] = []
    host = Host(nc, agents, config=config or HostConfig(task_ack_wait=2.0), on_event=seen.append)
    host.seen = seen  # type: ignore[attr-defined]
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run, stop)
            with anyio.fail_after(30):
                await host.ready.wait()
            yield host
            stop.set()
    finally:
        await client.aclose()
        await bus.close(nc)


@asynccontextmanager
async def running_worker(url: str, bundles: list[Path], concurrency: int = 8) -> AsyncIterator[Worker]:
    nc = await bus.connect(url, name="test-worker")
    worker = Worker(nc.jetstream(), build_registry(bundles=bundles), concurrency=concurrency)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, stop)
            yield worker
            stop.set()
    finally:
        await bus.close(nc)


@asynccontextmanager
async def running_fleet(url: str, js: Any, bundle: Path, *, responder: Responder | None = calc_responder,
                        replies: Iterable[Reply | str] = (), worker: bool = True,
                        config: HostConfig | None = None) -> AsyncIterator[Env]:
    """The usual setup of a host test: a scripted model server (`calc_responder` unless told otherwise),
    one in-process host serving `bundle` and, unless `worker=False`, one tool worker. Yields the `Env`
    (its `host` has `.seen`, every event it appended); everything stops at exit, the worker first."""
    with ScriptedModelServer(replies, responder=responder) as server:
        async with running_host(url, [bundle], server, config=config) as host, AsyncExitStack() as stack:
            if worker:
                await stack.enter_async_context(running_worker(url, [bundle]))
            yield Env(url, js, host, server, [])


def kinds(events: list[ev.Event]) -> list[str]:
    return [ev.kind_of(e) for e in events]


class HostHandle:
    """An in-process host that can stop cleanly or 'crash' (its connection cut, nothing handed back)."""

    def __init__(self, host: Host, nc, scope: anyio.CancelScope, stop: anyio.Event) -> None:
        self.host, self.nc, self.scope, self.stop = host, nc, scope, stop

    async def crash(self) -> None:
        await self.nc.close()  # no renewal, no release, no ack from here on
        self.scope.cancel()


@asynccontextmanager
async def hosts(url: str, bundles: list[Path], server: ScriptedModelServer, n: int, *,
                lease: LeaseConfig | None = None, **config: Any) -> AsyncIterator[list[HostHandle]]:
    """`n` in-process hosts sharing the partitions by lease (each its own connection and model client),
    started one after the other, each ready before the next starts; stopped cleanly at the end."""
    handles: list[HostHandle] = []
    clients: list[ModelClient] = []
    async with anyio.create_task_group() as tg:
        async def serve(i: int, started: anyio.Event) -> None:
            nc = await bus.connect(url, name=f"host-{i}")
            client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
            clients.append(client)
            cfg = HostConfig(**{"task_ack_wait": 2.0, "lease": lease or LeaseConfig(), **config})
            host = Host(nc, load_agents(bundles, client=client), config=cfg)
            stop = anyio.Event()
            with anyio.CancelScope() as scope:
                handles.append(HostHandle(host, nc, scope, stop))
                started.set()
                await host.run(stop)
            await bus.close(nc)

        for i in range(n):
            started = anyio.Event()
            tg.start_soon(serve, i, started)
            await started.wait()
            with anyio.fail_after(30):
                await handles[-1].host.ready.wait()
        try:
            yield handles
        finally:
            for h in handles:
                h.stop.set()
    for client in clients:
        await client.aclose()


async def wait_until(predicate, timeout: float = 20.0, what: str = "") -> float:
    """Seconds until `predicate()` holds (fails the test after `timeout`)."""
    t0 = anyio.current_time()
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
    return anyio.current_time() - t0
