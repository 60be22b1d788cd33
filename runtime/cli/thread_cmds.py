"""Conversations: `sa threads`.

    sa threads [AGENT]            every thread (of AGENT: the bundle and its instances), most recent first
    sa threads AGENT THREAD       one thread's runs in order: status and task of each

A thread is made by its first task (`sa send AGENT TEXT --thread T`); its runs continue one conversation
(`Client.threads`, `Client.thread`). `sa replay RUN --thread` shows the timelines of a thread's runs in
order. Exit codes: 0 success; 2 bad usage (no server, unknown thread).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, shown

if TYPE_CHECKING:
    from runtime.client import Client


@app.command()
def threads(
    agent: Annotated[str | None, typer.Argument(help="Only this agent's threads (bundle or "
                                                     "bundle:instance).")] = None,
    thread: Annotated[str | None, typer.Argument(help="Show this thread's runs in order.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """List conversations (threads) and their runs."""
    url = resolve_nats(nats_url, "threads")
    if thread is None:
        raise typer.Exit(with_client(url, "threads", lambda c: _all(c, agent, as_json)))
    if agent is None:
        typer.echo("sa threads: name the agent of the thread: sa threads AGENT THREAD", err=True)
        raise typer.Exit(2)
    raise typer.Exit(with_client(url, "threads", lambda c: _one(c, agent, thread, as_json)))


async def _all(client: Client, agent: str | None, as_json: bool) -> int:
    """Every thread (of `agent`), most recent first."""
    import datetime

    from rich.table import Table

    records = await client.threads(agent)
    if as_json:
        print(json.dumps([{"actor": r.actor, "thread": r.thread, "runs": r.runs, "updated": r.updated}
                          for r in records], indent=2))
        return 0
    if not records:
        console().print("no threads yet (sa send AGENT TEXT --thread NAME makes one)")
        return 0
    table = Table(header_style="bold")
    for column in ("thread", "agent", "runs", "latest run", "updated"):
        table.add_column(column)
    for r in records:
        when = datetime.datetime.fromtimestamp(r.updated).strftime("%Y-%m-%d %H:%M:%S")
        latest = r.runs[-1] if r.runs else ""
        table.add_row(*(shown(c) for c in (r.thread, r.actor, len(r.runs), latest, when)))
    console().print(table)
    return 0


async def _one(client: Client, agent: str, thread: str, as_json: bool) -> int:
    """One thread's runs in order: status and task of each."""
    from rich.table import Table

    record = await client.thread(agent, thread)
    if record is None:
        typer.echo(f"sa threads: agent {agent!r} has no thread {thread!r} (see `sa threads {agent}`)",
                   err=True)
        return 2
    rows = [await _run_row(client, record.actor, run_id) for run_id in record.runs]
    if as_json:
        print(json.dumps({"actor": record.actor, "thread": record.thread, "runs": rows}, indent=2))
        return 0
    table = Table(title=shown(f"thread {thread!r} · {record.actor}"), header_style="bold")
    for column in ("#", "run", "status", "task"):
        table.add_column(column)
    for i, row in enumerate(rows, 1):
        table.add_row(*(shown(c) for c in (i, row["run_id"], row["status"], row["input"])))
    console().print(table)
    return 0


async def _run_row(client: Client, actor: str, run_id: str) -> dict[str, Any]:
    """One run of a thread: its id, how it stands (the runs index) and its task (its `run.started`)."""
    from runtime import events as ev

    info = await client.run_info(run_id)
    history = await client.get(run_id, actor).history()
    started = history.events[0] if history.events else None
    text = started.input if isinstance(started, ev.RunStarted) else ""
    return {"run_id": run_id, "status": info.status if info is not None else "?",
            "input": " ".join(text.split())[:80]}


__all__ = ["threads"]
