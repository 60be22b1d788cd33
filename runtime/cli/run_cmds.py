"""Working with runs: `sa send`, `sa runs` (`sa threads`: `thread_cmds`; `sa replay`: `replay_cmds`).

    sa send AGENT "task" [--follow] [--thread T]
                                          publish a task, print its run id, optionally follow it live
                                          (the model's output as it is generated); in a thread, the run
                                          continues that conversation
    sa threads [AGENT] [THREAD]           the threads (conversations), or one thread's runs in order
    sa runs [AGENT]                       the runs index
    sa runs purge --before DATE [--agent A] [--dry-run] [--json]
                                          delete finished runs (events, payloads, index entries)

Finding the server: `runtime.cli.where`. Exit codes: 0 success; 1 the task was not stored (`send`: no
host has created the TASKS stream yet, unless `--wait` outlasts that), the run failed or was cancelled
(`send --follow`); 2 bad usage (no server, unknown run, invalid bundle).

`sa send` never creates a stream (the hosts own the topology: a stream made here could have the wrong
partition count) and never drops a task silently: it prints the run id only once JetStream confirmed the
task is stored, and it retries under one task id, so a retried publish is stored once.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from runtime.cli.app import PLAIN, app
from runtime.cli.where import resolve_nats

# ---------------------------------------------------------------------------------------------------------
# sa send
# ---------------------------------------------------------------------------------------------------------


@app.command()
def send(
    agent: Annotated[str, typer.Argument(help="The agent (bundle name, or bundle:instance).")],
    task: Annotated[str, typer.Argument(help="The task text.")],
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

    url = resolve_nats(nats_url, "send")
    code = anyio.run(_send, url, agent, task, follow, instance, task_id, timeout, as_json, wait, thread,
                     tokens, backend="asyncio")
    raise typer.Exit(code)


NO_STREAM = ("no host has created the TASKS stream yet: start `sa host` or `sa up` (or pass --wait SECONDS); "
             "the task was not sent")
RETRY_UNANSWERED_S = 10.0  # how long an existing stream that does not answer (a leader election) is retried


class NotSent(Exception):
    """The task is not stored in TASKS (the message says why and what to do)."""


async def _send(url: str, agent: str, task: str, follow: bool, instance: str | None, task_id: str | None,
                timeout: float | None, as_json: bool, wait: float, thread: str | None = None,
                tokens: bool = True) -> int:
    from rich.console import Console

    from runtime import events as ev
    from runtime import nats as bus
    from runtime.client.replay import watch

    console = Console()
    nc = await bus.connect(url, name="sa-send", max_reconnect_attempts=3)
    try:
        js = bus.jetstream_for(nc)
        try:
            run_id = await publish(js, agent, task, task_id=task_id, instance=instance, timeout_s=timeout,
                                   wait=wait, thread=thread)
        except ValueError as e:
            typer.echo(f"sa send: {e}", err=True)
            return 2
        except NotSent as e:
            typer.echo(f"sa send: {e}", err=True)
            return 1
        if as_json:
            print(json.dumps({"run_id": run_id}), flush=True)
        else:
            console.print(f"run [bold]{run_id}[/]")
        if not follow:
            return 0
        last = await watch(js, run_id, console, as_json=as_json, tokens=tokens)
        ok = isinstance(last, ev.RunCompleted)
        return 0 if ok else 1
    finally:
        await bus.close(nc)


async def publish(js: Any, agent: str, task: str, *, task_id: str | None, instance: str | None,
                  timeout_s: float | None, wait: float, thread: str | None = None) -> str:
    """Publish the task and return its run id once JetStream confirms it is stored; raise `NotSent` if not.

    No TASKS stream: wait up to `wait` seconds for a host to create it (never create it here). A stream
    that exists but does not answer is retried for `RETRY_UNANSWERED_S`. Every attempt carries the same
    task id (`Nats-Msg-Id`), so an attempt that was stored after all is not stored twice.
    """
    import anyio
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import NoStreamResponseError

    from runtime.commands import publish_task

    task_id = task_id or uuid.uuid4().hex
    start = anyio.current_time()
    told = False
    while True:
        try:
            return await publish_task(js, agent, task, task_id=task_id, instance=instance,
                                      timeout_s=timeout_s, thread=thread)
        except (NoStreamResponseError, NatsTimeoutError) as e:
            missing = isinstance(e, NoStreamResponseError) and not await _tasks_stream_exists(js)
            waited = anyio.current_time() - start
            if missing and waited >= wait:
                raise NotSent(NO_STREAM) from None
            if not missing and waited >= max(wait, RETRY_UNANSWERED_S):
                raise NotSent(f"the task was not confirmed stored ({type(e).__name__}: {e}); re-send it with "
                              f"--task-id {task_id} (a task id runs once)") from None
            if missing and not told:
                typer.echo(f"sa send: no host has created the TASKS stream yet; waiting up to {wait:g} s "
                           "for one", err=True)
                told = True
            await anyio.sleep(0.25)


async def _tasks_stream_exists(js: Any) -> bool:
    """False only when the server says TASKS does not exist (any other answer: assume it does)."""
    from nats.js.errors import NotFoundError

    from runtime import nats as bus

    try:
        await js.stream_info(bus.TASKS)
    except NotFoundError:
        return False
    except Exception:  # the server did not answer: the stream may well be there
        return True
    return True


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


def _matches(agent: str | None, ix: Any) -> bool:
    return agent is None or ix.actor == agent or ix.actor.split(":")[0] == agent


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Argument(help="Only this agent (bundle or bundle:instance).")] = None,
    limit: Annotated[int, typer.Option(help="The most recent N runs.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """List runs from the runs index, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    import anyio

    url = resolve_nats(nats_url, "runs")
    rows = anyio.run(_list_runs, url, backend="asyncio")
    rows = [r for r in rows if _matches(agent, r[1])]
    rows = sorted(rows, key=lambda r: r[1].updated, reverse=True)[:limit]
    if as_json:
        import msgspec

        print(json.dumps([{"run_id": k, **msgspec.to_builtins(v)} for k, v in rows], indent=2))
        return
    import datetime

    from rich.console import Console
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("run", "agent", "status", "updated"):
        table.add_column(col, no_wrap=True)
    table.add_column("task id", overflow="ellipsis", max_width=14, no_wrap=True)
    table.add_column("last seq", justify="right")
    colors = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan",
              "waiting for approval": "magenta"}  # `sa approvals` lists what such a run waits for
    # (and "sleeping until <T>": a run parked on a timer, `runtime.host.sleep`)
    for run_id, ix in rows:
        when = datetime.datetime.fromtimestamp(ix.updated).strftime("%Y-%m-%d %H:%M:%S") if ix.updated else ""
        style = colors.get(ix.status) or ("blue" if ix.status.startswith("sleeping") else "default")
        table.add_row(run_id, ix.actor, f"[{style}]{ix.status}[/]", when,
                      ix.task_id or "", str(ix.last_seq))
    Console().print(table if rows else "no runs yet")


async def _list_runs(url: str) -> list[tuple[str, Any]]:
    from runtime import nats as bus

    nc = await bus.connect(url, name="sa-runs", max_reconnect_attempts=3)
    try:
        kv = await bus.runs_kv(bus.jetstream_for(nc))
        return [(key, bus.RunIndex.decode(entry.value))
                for key, entry in (await bus.kv_entries(kv)).items() if entry.value]
    finally:
        await bus.close(nc)


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
    import anyio

    try:
        cutoff = parse_before(before)
    except ValueError as e:
        typer.echo(f"sa runs purge: {e}", err=True)
        raise typer.Exit(2) from None
    url = resolve_nats(nats_url, "runs purge")
    reports = anyio.run(_purge, url, cutoff, agent, dry_run, backend="asyncio")
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


async def _purge(url: str, cutoff: float, agent: str | None, dry_run: bool) -> list[Any]:
    """The runs the index lists as last updated before `cutoff` (of `agent`), oldest first, purged by the
    run log (which skips any still in flight)."""
    from runtime import nats as bus
    from runtime.log import RunLog

    nc = await bus.connect(url, name="sa-runs-purge", max_reconnect_attempts=3)
    try:
        js = bus.jetstream_for(nc)
        kv = await bus.runs_kv(js)
        rows = [(key, bus.RunIndex.decode(entry.value)) for key, entry in (await bus.kv_entries(kv)).items()
                if entry.value]
        chosen = sorted((ix.updated, key) for key, ix in rows if ix.updated < cutoff and _matches(agent, ix))
        return await RunLog(js).purge([key for _, key in chosen], dry_run=dry_run)
    finally:
        await bus.close(nc)
