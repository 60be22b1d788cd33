"""`sa backup`: a copy of the run log kept by JetStream elsewhere, and runs restored from it.

    sa backup start [--to URL] [--domain hub] [--replicas 3]    mirrors of EVENTS and the runs index
    sa backup status [--to URL]                                 what each copy holds, how far behind it is
    sa backup restore RUN... [--from URL]                       runs put back into EVENTS from the copy
    sa backup restore --missing [--agent A] [--from URL]        every run the copy holds more of

`--to` / `--from` name the NATS server that keeps the copy (default: the fleet's own, `--nats`): a server of
another cluster or account reached through a leaf node, with `--domain` the fleet's JetStream domain there.
How the copy and the restore work, and what they do not cover: `runtime.log.backup`. Exit codes: 0 done;
1 a run the copy could not restore (each says why; the others are restored); 2 bad usage (no server).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from runtime.cli.app import PLAIN, app
from runtime.cli.where import resolve_nats

backup_app = typer.Typer(help="A copy of the run log (JetStream mirrors) and runs restored from it.",
                         no_args_is_help=True, **PLAIN)
app.add_typer(backup_app, name="backup")

NatsOption = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL", help="The fleet's NATS.")]
CopyOption = Annotated[str | None, typer.Option(
    "--to", "--from", show_default=False,
    help="The NATS server keeping the copy (user:password@ in the URL if it needs them) [default: the "
         "fleet's own].")]


async def _connect(url: str, name: str) -> Any:
    from runtime import nats as bus

    nc = await bus.connect(url, name=name)
    return nc, bus.jetstream_for(nc)


@backup_app.command("start")
def start(
    to: CopyOption = None,
    domain: Annotated[str | None, typer.Option(
        help="The fleet's JetStream domain, as the copy's server reaches it through a leaf node [default: "
             "none: the copy is in the fleet's own JetStream].")] = None,
    replicas: Annotated[int, typer.Option(min=1, max=5, help="Replicas of each copy stream.")] = 1,
    nats_url: NatsOption = None,
) -> None:
    """Make the copy: JetStream mirrors of EVENTS and of the runs index, kept up to date by the servers and
    never following a delete or a purge of the source. Kept as they are if they exist."""
    import anyio

    from runtime.log.backup import COPY_STREAM, INDEX_COPY_STREAM, ensure_copy

    copy_url = to or resolve_nats(nats_url, "backup start")

    async def main() -> list[str]:
        nc, js = await _connect(copy_url, "sa-backup")
        try:
            return await ensure_copy(js, source_domain=domain, replicas=replicas)
        finally:
            await nc.close()

    made = anyio.run(main, backend="asyncio")
    for name in (COPY_STREAM, INDEX_COPY_STREAM):
        typer.echo(f"{name}: {'made' if name in made else 'kept (it exists)'}")


@backup_app.command("status")
def status(to: CopyOption = None, nats_url: NatsOption = None) -> None:
    """What each copy holds and how many of its source's messages it has not yet (its lag)."""
    import anyio
    from nats.js.errors import NotFoundError

    from runtime.log.backup import COPY_STREAM, INDEX_COPY_STREAM, copy_state

    copy_url = to or resolve_nats(nats_url, "backup status")

    async def main() -> int:
        nc, js = await _connect(copy_url, "sa-backup")
        try:
            code = 0
            for name in (COPY_STREAM, INDEX_COPY_STREAM):
                try:
                    state = await copy_state(js, name)
                except NotFoundError:
                    typer.echo(f"{name}: no such copy (make it with `sa backup start`)")
                    code = 1
                    continue
                lag = "unknown" if state.lag is None else str(state.lag)
                typer.echo(f"{name}: {state.messages} message(s), mirror of {state.source or '?'} up to its "
                           f"message {state.last_seq}, lag {lag}")
            return code
        finally:
            await nc.close()

    raise typer.Exit(anyio.run(main, backend="asyncio"))


@backup_app.command("restore")
def restore(
    runs: Annotated[list[str] | None, typer.Argument(help="The runs to put back.",
                                                     show_default=False)] = None,
    missing: Annotated[bool, typer.Option("--missing", help="Every run the copy holds more messages of than "
                                                            "EVENTS does.")] = False,
    agent: Annotated[str | None, typer.Option("--agent",
                                              help="With --missing: only this agent's runs.")] = None,
    source: CopyOption = None,
    nats_url: NatsOption = None,
) -> None:
    """Put runs back into EVENTS from the copy, each whole and in order (its events in EVENTS replaced);
    then `sa audit` finds them whole and `sa replay` shows them."""
    import anyio

    from runtime.log.backup import RestoreRefused, restore_run, runs_to_restore

    if bool(runs) == missing:
        typer.echo("sa backup restore: name the runs, or --missing (not both)", err=True)
        raise typer.Exit(2)
    url = resolve_nats(nats_url, "backup restore")

    async def main() -> int:
        nc, js = await _connect(url, "sa-backup")
        cnc, cjs = (nc, js) if source is None else await _connect(source, "sa-backup-copy")
        try:
            todo = list(runs or []) if not missing else [r for _, r in await runs_to_restore(cjs, js,
                                                                                           actor=agent)]
            if not todo:
                typer.echo("nothing to restore: EVENTS holds every message the copy has")
            code = 0
            for run in todo:
                try:
                    done = await restore_run(cjs, js, run)
                except RestoreRefused as e:
                    typer.echo(f"{run}: not restored: {e}", err=True)
                    code = 1
                    continue
                index = "; its runs index entry too" if done.index_restored else ""
                typer.echo(f"{run} ({done.actor}): restored {done.events} event(s) (EVENTS held "
                           f"{done.had}){index}")
            return code
        finally:
            if cnc is not nc:
                await cnc.close()
            await nc.close()

    raise typer.Exit(anyio.run(main, backend="asyncio"))


__all__ = ["backup_app"]
