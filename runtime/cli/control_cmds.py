"""Run control for operators: `sa cancel`, `sa approvals`, `sa approve`, `sa deny` (`RunHandle.cancel`,
`Client.approvals`, `RunHandle.approve` / `deny`).

    sa cancel RUN [--reason R]                    end a run; a tool it is running stops at once
    sa approvals [AGENT] [--json]                 calls waiting for a person: arguments, run, age, deadline
    sa approve RUN CALL [--args JSON] [--note N]  let a call run, optionally with edited arguments
    sa deny RUN CALL --reason R                   refuse it; the model reads the reason as the tool's error

CALL is the call id as `sa approvals` prints it (`1.0`) or in full (`<run>/1.0`). Each command checks its
input against the run's log before it sends anything, and then waits until the host has recorded the
outcome, which it prints. Exit codes: 0 done; 1 bad input or not recorded (unknown run or call, a call
already decided, arguments that fail the tool's schema, a run that already ended: the message says
which, and nothing was sent); 2 no NATS server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, printable, shown

if TYPE_CHECKING:
    from runtime.client import Client

T = TypeVar("T")

NatsOption = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")]


def _run(command: str, url: str, op: Callable[[Client], Awaitable[T]]) -> T:
    """Run `op(client)` on a client of its own; a `ControlError` exits 1 with its message."""
    from runtime.client import ControlError

    try:
        return with_client(url, command, op)
    except ControlError as e:
        typer.echo(f"sa {command}: {e}", err=True)
        raise typer.Exit(1) from None


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def waiting_table(command: str, nats_url: str | None, fetch: Callable[[Client], Awaitable[list[Any]]], *,
                  as_json: bool, empty: str, columns: tuple[str, ...], wide: tuple[str, ...],
                  row: Callable[[Any, float], tuple[Any, ...]]) -> None:
    """What runs wait on a person for (`sa approvals`, `sa questions`): one JSON array, or a table of one
    `row(item, now)` per item whose `wide` columns wrap."""
    items = _run(command, resolve_nats(nats_url, command), fetch)
    now = time.time()
    if as_json:
        print(json.dumps([item.to_json(now) for item in items], indent=2))
        return
    if not items:
        console().print(empty)
        return
    from rich.table import Table

    table = Table(header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold" if col in wide else "ellipsis", no_wrap=col not in wide)
    for item in items:
        table.add_row(*(shown(c) for c in row(item, now)))
    console().print(table)


def _times_out(now: float, due: float | None, then: str, run_deadline: float | None, at_deadline: str) -> str:
    """When a wait times out and what happens then: its own timeout, else the run's deadline, else never."""
    if due is not None:
        return f"in {_ago(due - now)}: {then}"
    if run_deadline is not None:
        return f"in {_ago(run_deadline - now)}: {at_deadline}"
    return "never"


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@app.command()
def cancel(
    run: Annotated[str, typer.Argument(help="The run id.")],
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why (recorded in run.cancelled).")] = "",
    nats_url: NatsOption = None,
) -> None:
    """Cancel a run: it ends at once, a pending approval is closed, a running tool is stopped."""
    from runtime import events as ev

    url = resolve_nats(nats_url, "cancel")
    event = _run("cancel", url, lambda c: c.get(run).cancel(reason))
    if isinstance(event, ev.RunCancelled):
        typer.echo(f"cancelled {run}{' by ' + event.by if event.by else ''}")
        return
    ended = ev.kind_of(event).split(".", 1)[1]
    typer.echo(f"sa cancel: run {run} {ended} before the cancel arrived", err=True)
    raise typer.Exit(1)


@app.command()
def approvals(
    agent: Annotated[str | None, typer.Argument(help="Only this agent (bundle or bundle:instance).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
    nats_url: NatsOption = None,
) -> None:
    """List the tool calls waiting for an operator: tool, arguments, run, age, when they time out."""
    def row(p: Any, now: float) -> tuple[Any, ...]:
        times_out = _times_out(now, p.times_out_at, p.on_timeout, p.run_deadline, "deny (run deadline)")
        return (p.run_id, p.actor, p.call_id.rsplit("/", 1)[-1], p.tool, _short(p.arguments),
                _ago(now - p.requested_at), times_out, p.role or "-")

    waiting_table("approvals", nats_url, lambda c: c.approvals(agent), as_json=as_json,
                  empty="no calls are waiting for approval",
                  columns=("run", "agent", "call", "tool", "arguments", "age", "times out", "role"),
                  wide=("arguments",), row=row)


@app.command()
def approve(
    run: Annotated[str, typer.Argument(help="The run id.")],
    call: Annotated[str, typer.Argument(help="The call id (`1.0`, as `sa approvals` shows it).")],
    args: Annotated[str | None, typer.Option("--args", help="Run the call with these arguments instead "
                                                            "(a JSON object, checked against the tool's "
                                                            "schema).")] = None,
    note: Annotated[str, typer.Option("--note", help="A note recorded with the approval.")] = "",
    nats_url: NatsOption = None,
) -> None:
    """Approve a waiting tool call, optionally with edited arguments."""
    from runtime import events as ev

    arguments = None
    if args is not None:
        try:
            arguments = json.loads(args)
        except ValueError as e:
            typer.echo(f"sa approve: --args is not valid JSON ({e}); give an object such as "
                       "'{\"amount\": 90}'", err=True)
            raise typer.Exit(1) from None
        if not isinstance(arguments, dict):
            typer.echo(f"sa approve: --args must be a JSON object of arguments, got {args}", err=True)
            raise typer.Exit(1)
    url = resolve_nats(nats_url, "approve")
    event = _run("approve", url, lambda c: c.get(run).approve(call, arguments=arguments, note=note))
    if isinstance(event, ev.ApprovalGranted) and event.by != "timeout":
        edited = f" with arguments {_short(event.arguments, 80)}" if event.arguments is not None else ""
        typer.echo(f"approved {event.call_id}{edited} by {event.by}")
        return
    typer.echo(f"sa approve: {event.call_id} was decided otherwise first: {ev.to_json(event)}", err=True)
    raise typer.Exit(1)


@app.command()
def deny(
    run: Annotated[str, typer.Argument(help="The run id.")],
    call: Annotated[str, typer.Argument(help="The call id (`1.0`, as `sa approvals` shows it).")],
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why: the model reads it as the tool's "
                                                               "error.")],
    nats_url: NatsOption = None,
) -> None:
    """Deny a waiting tool call; the model is told the reason."""
    from runtime import events as ev

    url = resolve_nats(nats_url, "deny")
    event = _run("deny", url, lambda c: c.get(run).deny(call, reason))
    if isinstance(event, ev.ApprovalDenied) and event.by != "timeout":
        typer.echo(f"denied {event.call_id} by {event.by}: {printable(event.reason)}")
        return
    typer.echo(f"sa deny: {event.call_id} was decided otherwise first: {ev.to_json(event)}", err=True)
    raise typer.Exit(1)


__all__ = ["approvals", "approve", "cancel", "deny"]
