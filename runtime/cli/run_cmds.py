"""Working with runs: `sa send`, `sa runs` (`sa threads`: `thread_cmds`; `sa replay`: `replay_cmds`).

    sa send AGENT "task" [--follow] [--thread T]
                                          publish a task, print its run id, optionally follow it live
                                          (the model's output as it is generated); in a thread, the run
                                          continues that conversation
    sa send AGENT --file F | -            the task is the text of file F (`-`: standard input)
    sa runs [AGENT]                       the runs index (tab-separated when piped: full run ids)
    sa runs purge --before DATE [--agent A] [--dry-run] [--json]
                                          delete finished runs (events, payloads, index entries)

Every read and write goes through `runtime.client` (`runtime.cli.connect`). Finding the server:
`runtime.cli.where`. Exit codes of `sa send`: 0 stored (and with `--follow`: completed); 1 the task was not
stored (no host has created the TASKS stream yet, unless `--wait` outlasts that; the server refused it;
too big for what these credentials may store), or the run failed or was cancelled (`--follow`); 2 bad usage
(no server, no task text, a bad name); 3 the task was stored (its run id is printed) but these credentials
may not read runs, so it cannot be followed: follow it with an operator's (`sa replay RUN`).

`sa send` never creates a stream (the hosts own the topology) and never drops a task silently: it prints
the run id only once JetStream confirmed the task is stored, and it retries under one task id, so a
retried publish is stored once. An input too big for one NATS message travels through the payload object
store (`Client.start`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from runtime.cli.app import PLAIN, app
from runtime.cli.connect import client_for, with_client
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, printable, shown

if TYPE_CHECKING:
    from runtime.client import Client, RunInfo

STORED_NOT_FOLLOWED = 3  # `sa send --follow`: the task is stored, but these credentials may not read runs

# ---------------------------------------------------------------------------------------------------------
# sa send
# ---------------------------------------------------------------------------------------------------------


@app.command()
def send(
    agent: Annotated[str, typer.Argument(help="The agent (bundle name, or bundle:instance).")],
    task: Annotated[str | None, typer.Argument(help="The task text ('-': read it from standard "
                                                    "input).")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read the task text from this file ('-': "
                                                            "standard input).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the run's events until it ends; "
                                                                 "exit 1 if it fails.")] = False,
    instance: Annotated[str | None, typer.Option("--instance", "-i", help="Run on this instance (its own "
                                                                          "actor).")] = None,
    task_id: Annotated[str | None, typer.Option("--task-id",
                                                help="Idempotency key (default: random).")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="The run's deadline in seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Events as JSON lines (with --follow).")] = False,
    thread: Annotated[str | None, typer.Option("--thread", "-t", help="Continue this conversation of the "
                                                                      "agent (made on first use).")] = None,
    tokens: Annotated[bool, typer.Option("--tokens/--no-tokens", help="With --follow: show the model's "
                                                                      "output as it is generated.")] = True,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for a host to create the "
                                                              "TASKS stream (default: exit 1 at once "
                                                              "if there is none).")] = 0.0,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Publish a task to agents.<agent>.tasks and print its run id (then follow it with --follow)."""
    import anyio

    text = task_text(task, file)
    url = resolve_nats(nats_url, "send")
    options = {"instance": instance, "task_id": task_id, "timeout": timeout, "thread": thread, "wait": wait}
    code = anyio.run(_send, url, agent, text, options, follow, as_json, tokens, backend="asyncio")
    raise typer.Exit(code)


def task_text(task: str | None, file: Path | None) -> str:
    """The task's text: the argument, or the file (`-`: standard input); exit 2 saying what is wrong."""
    if (task is None) == (file is None):
        _usage("give the task as text (sa send AGENT \"...\") or with --file PATH (- for standard input), "
               "one of them")
    source = "-" if task == "-" else (str(file) if file is not None else None)
    if source is None:
        text = task or ""
    else:
        try:
            data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        except OSError as e:
            _usage(f"cannot read the task from {source}: {e.strerror or e}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            where = "standard input" if source == "-" else source
            _usage(f"the task in {where} is not UTF-8 text (byte {e.start}): a task is text")
    if not text.strip():
        _usage("the task is empty")
    return text


async def _warn_if_unserved(client: Any, agent: str) -> None:
    """Say so when no live host serves the task's agent: the task is stored and waits for one (and fails
    `unknown_agent` once none has served it for a while), which looks like a hang otherwise."""
    from runtime.cli.connect import unserved

    hosts = await unserved(client, agent)
    if hosts is not None:
        typer.echo(f"sa send: no live host serves agent {agent.split(':')[0]!r} (served now: {hosts}): the "
                   "task waits in TASKS until a host serving it starts, and fails unknown_agent if none does "
                   "in time", err=True)


def _usage(message: str) -> NoReturn:
    typer.echo(f"sa send: {message}", err=True)
    raise typer.Exit(2)


async def _send(url: str, agent: str, text: str, options: dict[str, Any], follow: bool, as_json: bool,
                tokens: bool) -> int:
    from runtime import events as ev
    from runtime.client import NotSent
    from runtime.client.replay import watch

    def waiting(message: str) -> None:
        typer.echo(f"sa send: {message}", err=True)

    async with client_for(url, "send") as client:
        try:
            handle = await client.start(agent, text, on_waiting=waiting, **options)
        except ValueError as e:
            typer.echo(f"sa send: {e}", err=True)
            return 2
        except NotSent as e:
            hint = " (sa send --wait SECONDS waits for one)" if e.reason == "no_stream" else ""
            typer.echo(f"sa send: {e}{hint}", err=True)
            return 1
        if as_json:
            print(json.dumps({"run_id": handle.run_id}), flush=True)
        else:
            print(f"run {handle.run_id}", flush=True)
        await _warn_if_unserved(client, agent)
        if not follow:
            return 0
        try:
            last = await watch(handle, console(), as_json=as_json, tokens=tokens)
        except Exception as e:
            return _not_followed(e, handle.run_id)
        return 0 if isinstance(last, ev.RunCompleted) else 1


def _not_followed(error: Exception, run_id: str) -> int:
    """The task is stored but following it failed: if the server refused to let these credentials read
    the run, say so and how to follow it (exit 3); anything else is raised."""
    from runtime.nats.connection import explain_refusal

    refusal = explain_refusal(error)
    if refusal is None:
        raise error
    typer.echo(f"sa send: the task is stored: run {run_id}. Following it was refused: these credentials may "
               f"publish tasks but not read runs; follow it with an operator's: sa replay {run_id}  "
               f"({refusal})", err=True)
    return STORED_NOT_FOLLOWED


# ---------------------------------------------------------------------------------------------------------
# sa runs
# ---------------------------------------------------------------------------------------------------------


class _RunsGroup(TyperGroup):
    """`sa runs [AGENT]` lists runs and `sa runs purge ...` purges them: a first word that names a
    subcommand is that subcommand, not an agent."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:
            super().parse_args(ctx, [])  # the listing's own parameters keep their defaults
            ctx._protected_args, ctx.args = args[:1], args[1:]
            return ctx.args
        ctx.allow_interspersed_args = True  # the listing: `sa runs calc --json` as well as `--json calc`
        return super().parse_args(ctx, args)


runs_app = typer.Typer(cls=_RunsGroup, help="List runs from the runs index, newest first; `sa runs purge` "
                                               "deletes finished runs.", **PLAIN)
app.add_typer(runs_app, name="runs")

RUN_COLUMNS = ("run", "agent", "status", "updated", "task id", "last seq")
STATUS_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan",
                "waiting for approval": "magenta",  # `sa approvals` lists what such a run waits for
                "queued": "dim"}  # a task waiting behind its actor's run


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Argument(help="Only this agent (bundle or bundle:instance).")] = None,
    limit: Annotated[int, typer.Option(help="The most recent N runs.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """List runs from the runs index, newest first (tab-separated, ids in full, when not on a terminal)."""
    if ctx.invoked_subcommand is not None:
        return
    url = resolve_nats(nats_url, "runs")

    async def listed(client: Client) -> list[RunInfo]:
        return await client.runs(agent, limit=limit)

    rows = with_client(url, "runs", listed)
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    elif not sys.stdout.isatty():
        print("\t".join(RUN_COLUMNS))
        for r in rows:
            print("\t".join(printable(c) for c in _run_cells(r)))
    else:
        _runs_table(rows)


def _run_cells(r: RunInfo) -> list[str]:
    import datetime

    when = datetime.datetime.fromtimestamp(r.updated).strftime("%Y-%m-%d %H:%M:%S") if r.updated else ""
    # the run's seq, which `sa replay` shows and `sa fork --at` takes (not the stream's sequence)
    return [r.run_id, r.actor, r.status, when, r.task_id or "", "" if r.seq is None else str(r.seq)]


def _runs_table(rows: list[RunInfo]) -> None:
    from rich.table import Table

    if not rows:
        console().print("no runs yet")
        return
    table = Table(header_style="bold")
    for col in RUN_COLUMNS[:4]:
        table.add_column(col, no_wrap=True)
    table.add_column("task id", overflow="ellipsis", max_width=14, no_wrap=True)
    table.add_column("last seq", justify="right")
    for r in rows:
        cells = [shown(c) for c in _run_cells(r)]
        cells[2].stylize(STATUS_STYLE.get(r.status, ""))
        table.add_row(*cells)
    console().print(table)


@runs_app.command("purge")
def purge(
    before: Annotated[str, typer.Option("--before", help="Runs last updated before this: a date or time "
                                                         "('2025-01-31', '2025-01-31T12:00', local time "
                                                         "unless it says otherwise) or an age ('30d', "
                                                         "'12h').")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs (bundle or "
                                                              "bundle:instance).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be deleted; delete "
                                                            "nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Delete finished runs: their events, their big payloads and their index entries.

    A run still in flight (its last event not terminal, its index entry not ended, or an active entry a
    host would resume) is skipped and listed with the reason, never deleted.
    """
    try:
        cutoff = parse_before(before)
    except ValueError as e:
        typer.echo(f"sa runs purge: {e}", err=True)
        raise typer.Exit(2) from None
    url = resolve_nats(nats_url, "runs purge")
    reports = with_client(url, "runs-purge", lambda c: c.purge(cutoff, agent=agent, dry_run=dry_run))
    done = [r for r in reports if r.skipped is None]
    skipped = [r for r in reports if r.skipped is not None]
    events = sum(r.events for r in done)
    objects = sum(len(r.objects) for r in done)
    if as_json:
        import dataclasses

        print(json.dumps({"before": cutoff, "dry_run": dry_run, "deleted": len(done), "skipped": len(skipped),
                          "events": events, "objects": objects,
                          "runs": [dataclasses.asdict(r) for r in reports]}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    for r in done:
        typer.echo(f"{verb} {r.run_id} ({r.actor or '?'}, {r.status or 'no events left'}): {r.events} "
                   f"event(s), {len(r.objects)} payload object(s) ({r.object_bytes:,} bytes)"
                   f"{', index entry' if r.index else ''}")
    for r in skipped:
        typer.echo(f"skipped {r.run_id} ({r.actor or '?'}): {r.skipped}")
    typer.echo(f"{'dry run: ' if dry_run else ''}{verb} {len(done)} run(s): {events} event(s), {objects} "
               f"payload object(s); skipped {len(skipped)} in flight")


def parse_before(text: str, now: float | None = None) -> float:
    """Unix time from an ISO date or time (naive: local time) or an age back from now ('30d', '12h')."""
    import datetime
    import time

    from runtime.nats.retention import parse_age

    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        pass
    try:
        age = parse_age(text, "--before")
    except ValueError:
        raise ValueError(f"--before {text!r}: use a date ('2025-01-31'), a time ('2025-01-31T12:00') or an "
                         "age ('30d', '12h')") from None
    return (time.time() if now is None else now) - age
