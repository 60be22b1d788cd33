"""Conversations: `sa threads`.

    sa threads [AGENT]            every thread (of AGENT: the bundle and its instances), most recent first
    sa threads AGENT THREAD       one thread's runs in order: status and task of each

A thread is made by its first task (`sa send AGENT TEXT --thread T`); its runs continue one conversation
(`runtime.log.threads`). `sa replay RUN --thread` shows the timelines of a thread's runs in order. Exit codes:
0 success; 2 bad usage (no server, unknown thread).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.where import resolve_nats


@app.command()
def threads(
    agent: Annotated[str | None, typer.Argument(help="Only this agent's threads (bundle or "
                                                     "bundle:instance).")] = None,
    thread: Annotated[str | None, typer.Argument(help="Show this thread's runs in order.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """List conversations (threads) and their runs."""
    import anyio

    url = resolve_nats(nats_url, "threads")
    raise typer.Exit(anyio.run(_threads, url, agent, thread, as_json, backend="asyncio"))


async def _threads(url: str, agent: str | None, thread: str | None, as_json: bool) -> int:
    import datetime

    from rich.console import Console
    from rich.table import Table

    from runtime import nats as bus
    from runtime.log.threads import Threads

    nc = await bus.connect(url, name="sa-threads", max_reconnect_attempts=3)
    try:
        js = bus.jetstream_for(nc)
        store = Threads(js)
        if thread is None:
            records = await store.all(agent)
            if as_json:
                print(json.dumps([{"actor": r.actor, "thread": r.thread, "runs": r.runs, "updated": r.updated}
                                  for r in records], indent=2))
                return 0
            table = Table(header_style="bold")
            for column in ("thread", "agent", "runs", "latest run", "updated"):
                table.add_column(column)
            for r in records:
                when = datetime.datetime.fromtimestamp(r.updated).strftime("%Y-%m-%d %H:%M:%S")
                table.add_row(r.thread, r.actor, str(len(r.runs)), r.runs[-1] if r.runs else "", when)
            Console().print(table if records else
                            "no threads yet (sa send AGENT TEXT --thread NAME makes one)")
            return 0
        if agent is None:
            typer.echo("sa threads: name the agent of the thread: sa threads AGENT THREAD", err=True)
            return 2
        record, _ = await store.get(agent, thread)
        if record is None:
            typer.echo(f"sa threads: agent {agent!r} has no thread {thread!r} (see `sa threads {agent}`)",
                       err=True)
            return 2
        rows = [await _run_row(js, run_id) for run_id in record.runs]
        if as_json:
            print(json.dumps({"actor": record.actor, "thread": record.thread, "runs": rows}, indent=2))
            return 0
        table = Table(title=f"thread {thread!r} · {record.actor}", header_style="bold")
        for column in ("#", "run", "status", "task"):
            table.add_column(column)
        for i, row in enumerate(rows, 1):
            table.add_row(str(i), row["run_id"], row["status"], row["input"])
        Console().print(table)
        return 0
    finally:
        await bus.close(nc)


async def _run_row(js: Any, run_id: str) -> dict[str, Any]:
    """One run of a thread: its id, how it stands (the runs index) and its task (its `run.started`)."""
    from nats.js.errors import KeyNotFoundError, NotFoundError

    from runtime import events as ev
    from runtime import nats as bus
    from runtime.log import RunLog

    try:
        entry = await (await bus.runs_kv(js)).get(run_id)
        status = bus.RunIndex.decode(entry.value).status if entry.value else "?"
    except (KeyNotFoundError, NotFoundError):
        status = "?"
    history = await RunLog(js).read(run_id)
    started = history.events[0] if history.events else None
    text = started.input if isinstance(started, ev.RunStarted) else ""
    return {"run_id": run_id, "status": status, "input": " ".join(text.split())[:80]}


__all__ = ["threads"]
