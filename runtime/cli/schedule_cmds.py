"""Schedules: `sa schedule add / list / pause / resume / delete` (`runtime.client.schedules`).

    sa schedule add NAME --agent A (--cron '0 */5 * * * *' [--tz Europe/Paris] | --every 30s | --at TIME)
                    --input TEXT [--instance I] [--thread T] [--catch-up none|latest|all] [--grace 60s]
    sa schedule list [--json]            every schedule: agent, when, active or paused, fires waiting
    sa schedule pause NAME · sa schedule resume NAME · sa schedule delete NAME

The cluster keeps the time (the SCHEDULES stream, `runtime.schedules`): each instant of a schedule is a
fire, which a host turns into one run of the agent (a task id derived from the schedule and the fire).
`--catch-up` says what becomes of fires that waited longer than `--grace` for a host (none ran then):
`all` run, only the `latest` runs (the default), or `none`. Exit codes: 0 done; 1 a schedule that cannot
be (the message says what to fix, nothing stored) or an unknown name; 2 no NATS server.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import typer

from runtime.cli.app import PLAIN, app
from runtime.cli.where import resolve_nats

schedule_app = typer.Typer(help="Runs started by the cluster's clock: cron, intervals, one instant.",
                           no_args_is_help=True, **PLAIN)
app.add_typer(schedule_app, name="schedule")

NatsOption = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")]


def _run(command: str, url: str, op: Callable[[Any], Awaitable[Any]]) -> Any:
    """`op(client)` on a client of its own; a schedule that cannot be, or an unknown name, exits 1 with the
    message."""
    from runtime.cli.connect import with_client
    from runtime.schedules import ScheduleError

    try:
        return with_client(url, f"schedule-{command}", op)
    except (ScheduleError, LookupError) as e:
        typer.echo(f"sa schedule {command}: {str(e).strip(chr(39))}", err=True)
        raise typer.Exit(1) from None


def _grace(text: str) -> float:
    from runtime.schedules.spec import ScheduleError, parse_every

    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return float(parse_every(text))
    except ScheduleError:
        typer.echo(f"sa schedule add: --grace {text!r}: a duration such as 30s, 5m or 0", err=True)
        raise typer.Exit(1) from None


@schedule_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The schedule's name (one word: letters, digits, - _ :).")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent its runs go to (bundle, or "
                                                              "bundle:instance).")],
    input: Annotated[str, typer.Option("--input", "-i", help="The task each run is given.")],
    cron: Annotated[str | None, typer.Option("--cron", help="Six fields, seconds first: '0 */5 * * * *'; "
                                                            "or @hourly, @daily, ...")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="The cron's time zone (IANA, e.g. Europe/Paris; "
                                                        "default UTC).")] = None,
    every: Annotated[str | None, typer.Option("--every", help="An interval: 30s, 5m, 1h30m, 2d.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="One instant, ISO 8601 with a zone: "
                                                        "2030-01-01T09:00:00+01:00.")] = None,
    instance: Annotated[str | None, typer.Option("--instance", help="The agent's instance.")] = None,
    thread: Annotated[str | None, typer.Option("--thread", help="Each run continues this "
                                                                "conversation.")] = None,
    catch_up: Annotated[str, typer.Option("--catch-up", help="Fires missed while no host ran: none, "
                                                             "latest or all.")] = "latest",
    grace: Annotated[str, typer.Option("--grace", help="A fire taken later than this after it fired was "
                                                       "missed.")] = "60s",
    replace: Annotated[bool, typer.Option("--replace", help="Replace a schedule of that name.")] = False,
    paused: Annotated[bool, typer.Option("--paused", help="Store it paused (resume starts it).")] = False,
    nats_url: NatsOption = None,
) -> None:
    """Add a schedule: the agent gets the task at each instant, one run per fire."""
    from runtime.cli.connect import unserved

    url = resolve_nats(nats_url, "schedule add")
    seconds = _grace(grace)
    hosts: list[str | None] = []

    async def add_and_look(client: Any) -> Any:
        added = await client.schedules.add(name, agent, input, cron=cron, every=every, at=at, tz=tz,
                                           instance=instance, thread=thread, catch_up=catch_up, grace=seconds,
                                           replace=replace, paused=paused)
        hosts.append(await unserved(client, agent))
        return added

    schedule = _run("add", url, add_and_look)
    state = "paused" if schedule.paused else "active"
    typer.echo(f"schedule {schedule.name}: {schedule.actor} {schedule.when} ({state}, catch-up "
               f"{schedule.catch_up})")
    if hosts and hosts[0] is not None:
        typer.echo(f"sa schedule add: warning: no live host serves agent {agent.split(':')[0]!r} (served "
                   f"now: {hosts[0]}): each fire waits until a host serving it starts; if the name is "
                   f"misspelt, delete the schedule (sa schedule delete {schedule.name}) and add it again",
                   err=True)


@schedule_app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    nats_url: NatsOption = None,
) -> None:
    """Every schedule: its agent, when, active or paused, and fires waiting for a host."""
    import msgspec

    url = resolve_nats(nats_url, "schedule list")
    listed = _run("list", url, lambda c: c.schedules.list())
    if as_json:
        print(json.dumps([{**msgspec.to_builtins(x.schedule), "waiting": x.waiting} for x in listed],
                         indent=2))
        return
    if not listed:
        typer.echo("no schedules (sa schedule add NAME --agent A --every 1h --input TEXT)")
        return
    from rich.table import Table

    from runtime.client.terminal import console, shown

    table = Table(header_style="bold")
    for column in ("schedule", "agent", "when", "state", "catch-up", "waiting"):
        table.add_column(column, no_wrap=True)
    table.add_column("input", overflow="ellipsis", max_width=40, no_wrap=True)
    for x in listed:
        s = x.schedule
        table.add_row(shown(s.name), shown(s.actor), shown(s.when),
                      shown("paused" if s.paused else "active", "yellow" if s.paused else "green"),
                      shown(s.catch_up), shown(str(x.waiting)), shown(s.input))
    console().print(table)


@schedule_app.command("pause")
def pause(name: Annotated[str, typer.Argument(help="The schedule.")], nats_url: NatsOption = None) -> None:
    """Pause a schedule: no fire until it is resumed (fires already made still run)."""
    _run("pause", resolve_nats(nats_url, "schedule pause"), lambda c: c.schedules.pause(name))
    typer.echo(f"schedule {name}: paused")


@schedule_app.command("resume")
def resume(name: Annotated[str, typer.Argument(help="The schedule.")], nats_url: NatsOption = None) -> None:
    """Resume a paused schedule (an interval counts from now)."""
    _run("resume", resolve_nats(nats_url, "schedule resume"), lambda c: c.schedules.resume(name))
    typer.echo(f"schedule {name}: active")


@schedule_app.command("delete")
def delete(name: Annotated[str, typer.Argument(help="The schedule.")], nats_url: NatsOption = None) -> None:
    """Delete a schedule and its fires not yet taken by a host."""
    if not _run("delete", resolve_nats(nats_url, "schedule delete"), lambda c: c.schedules.delete(name)):
        typer.echo(f"sa schedule delete: no schedule {name!r} (see `sa schedule list`)", err=True)
        raise typer.Exit(1)
    typer.echo(f"schedule {name}: deleted")
