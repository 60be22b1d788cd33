"""`sa dlq`: list dead-lettered tool jobs; `sa dlq replay SEQ|--all`: send them back to the workers.

A module of its own (registered in `runtime.cli`) because dead letters are an operator's concern
separate from running agents; see `runtime.worker.dlq` for how jobs get there and what a replay means.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

import typer

from runtime.cli.app import PLAIN, app
from runtime.cli.where import resolve_nats

dlq_app = typer.Typer(help="Dead letters: tool jobs no worker could finish. Without a subcommand: list them.",
                      **PLAIN)
app.add_typer(dlq_app, name="dlq")

NatsOption = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                help="NATS server URL(s), comma-separated.")]


def _servers(explicit: str | None) -> str:
    """`--nats`/NATS_URL, else whatever a running `sa up` advertises; exit 2 with what to do otherwise."""
    return resolve_nats(explicit, "dlq")


async def _with_js(servers: str, fn: Any) -> Any:
    from runtime.nats.connection import close, connect
    from runtime.nats.jetstream import jetstream_for

    nc = await connect(servers, name="sa-dlq", max_reconnect_attempts=2)
    try:
        return await fn(jetstream_for(nc))
    finally:
        await close(nc)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


@dlq_app.callback(invoke_without_command=True)
def dlq(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array (machine-readable).")] = False,
    nats_url: NatsOption = None,
) -> None:
    """List dead letters, oldest first: sequence, when, deliveries, original subject, run/call, reason."""
    if ctx.invoked_subcommand is not None:
        return
    import anyio

    from runtime.client.terminal import printable
    from runtime.worker import dlq as dead

    letters = anyio.run(_with_js, _servers(nats_url), dead.list_dead_letters, backend="asyncio")
    if as_json:
        typer.echo(json.dumps([d.to_dict() for d in letters], indent=2))
        return
    if not letters:
        typer.echo("no dead letters")
    else:
        typer.echo(f"{'SEQ':>6}  {'DEAD AT':<19}  {'DELIV':>5}  {'SUBJECT':<24}  {'CALL':<28}  REASON")
        for d in letters:
            job = d.job
            call = job.call_id if job else "(not a tool job)"
            typer.echo(f"{d.seq:>6}  {_when(d.dead_at):<19}  {d.deliveries:>5}  {d.subject:<24}  "
                       f"{call:<28}  {printable(d.reason)}")
        typer.echo(f"{len(letters)} dead letter(s); `sa dlq replay SEQ` (or --all) sends them back to the "
                   "workers")


@dlq_app.command("replay")
def replay(
    seq: Annotated[list[int] | None, typer.Argument(help="DLQ sequence(s) from `sa dlq`.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
    nats_url: NatsOption = None,
) -> None:
    """Re-publish dead letters to their original subject (fresh Msg-Id) and remove them from the DLQ.

    A `crashed` job's run has already gone on with that failure: the re-run applies its workspace
    writes, but its result does not change the run. Fix what killed the workers first.
    """
    import anyio

    from runtime.worker import dlq as dead

    if not seq and not all_:
        typer.echo("sa dlq replay: name the sequence(s) to replay (see `sa dlq`) or pass --all", err=True)
        raise typer.Exit(2)

    async def go(js: Any) -> tuple[list[dead.DeadLetter], list[str]]:
        wanted = [d.seq for d in await dead.list_dead_letters(js)] if all_ else list(seq or [])
        done: list[dead.DeadLetter] = []
        missing: list[str] = []
        for s in wanted:
            try:
                done.append(await dead.replay(js, s))
            except KeyError as e:
                missing.append(str(e.args[0]))
        return done, missing

    done, missing = anyio.run(_with_js, _servers(nats_url), go, backend="asyncio")
    for d in done:
        job = d.job
        typer.echo(f"replayed {d.seq} -> {d.subject}" + (f" ({job.call_id})" if job else ""))
    for m in missing:
        typer.echo(f"sa dlq replay: {m}", err=True)
    if not done and not missing:
        typer.echo("no dead letters")
    if missing:
        raise typer.Exit(1)
