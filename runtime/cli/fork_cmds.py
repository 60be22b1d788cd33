"""`sa fork`: a new run from any past event of a run, re-firing nothing before it (`Client.fork`).

    sa fork RUN --at SEQ                              the same run again from seq SEQ
    sa fork RUN --at SEQ --output CALL_ID=JSON        ... as if call CALL_ID (e.g. 2.0) had returned JSON
    sa fork RUN --at SEQ --reply JSON                 ... as if the model had replied this (text or calls)
    sa fork RUN --at SEQ --bundle PATH                ... going on with another version of the bundle
    sa fork RUN --at SEQ --system TEXT                ... going on with another system prompt
    sa fork ... --follow                              then follow the fork live until it ends

Prints the new run id (alone on stdout, so `$(sa fork ...)` works; `--json` for a JSON object). Exit
codes: 0 forked (and with --follow: completed); 1 the fork failed or was cancelled (--follow); 2 the fork
cannot be made as asked (the message says why and which seqs are valid; nothing was written).

`--reply` takes `{"content": "...", "calls": [{"name": "add", "arguments": {"a": 1}}]}`, a list of calls,
or a JSON string (a plain answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.connect import client_for
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console


@app.command()
def fork(
    run: Annotated[str, typer.Argument(help="The run to fork (as printed by sa send / sa runs).")],
    at: Annotated[int, typer.Option("--at", help="Keep the run's events before this seq (see sa replay RUN; "
                                                 "an invalid seq is refused with the valid ones).")],
    output: Annotated[str | None, typer.Option("--output", metavar="CALL_ID=JSON",
                                               help="Record this output for call CALL_ID instead of "
                                                    "running the tool.")] = None,
    reply: Annotated[str | None, typer.Option("--reply", metavar="JSON",
                                              help="Record this reply to the pending model request.")] = None,
    bundle: Annotated[Path | None, typer.Option("--bundle", help="Go on with this version of the run's "
                                                                 "bundle.")] = None,
    system: Annotated[str | None, typer.Option("--system", help="Go on with this system prompt.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow the fork live until it ends; exit 1 "
                                                                 "if it fails.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object (and events as JSON lines "
                                                         "with --follow).")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Fork RUN at seq SEQ: a new run that reuses every recorded model reply and tool result before it."""
    import anyio

    given = [name for name, value in (("--output", output), ("--reply", reply), ("--bundle", bundle),
                                      ("--system", system)) if value is not None]
    if len(given) > 1:
        _usage(f"give one edit at a time, not {' and '.join(given)}")
    try:
        edit = parse_edit(output=output, reply=reply, bundle=bundle, system=system)
    except ValueError as e:
        _usage(str(e))
    url = resolve_nats(nats_url, "fork")
    raise typer.Exit(anyio.run(_fork, url, run, at, edit, follow, as_json, backend="asyncio"))


def _usage(message: str) -> None:
    typer.echo(f"sa fork: {message}", err=True)
    raise typer.Exit(2)


def parse_edit(*, output: str | None = None, reply: str | None = None, bundle: Path | None = None,
               system: str | None = None) -> Any:
    """The `ForkEdit` the options describe (None for a plain fork); ValueError saying what is wrong."""
    from runtime.client import BundleEdit, OutputEdit, SystemEdit

    if output is not None:
        call_id, sep, value = output.partition("=")
        if not sep or not call_id.strip():
            raise ValueError(f"--output takes CALL_ID=JSON (for example 2.0='{{\"sum\": 5}}'), "
                             f"not {output!r}")
        return OutputEdit(call_id=call_id.strip(), output=_json(value, "--output"))
    if reply is not None:
        return _reply(_json(reply, "--reply"))
    if bundle is not None:
        from runtime.bundle import BundleError, load_bundle

        try:
            loaded = load_bundle(bundle)
        except BundleError as e:
            raise ValueError(f"--bundle: {e}") from None
        return BundleEdit(digest=loaded.digest, path=str(loaded.path))
    if system is not None:
        return SystemEdit(system_prompt=system)
    return None


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{option}: not JSON ({e.msg} at column {e.colno}): {text[:80]!r}; quote a string "
                         "as '\"text\"'") from None


def _reply(value: Any) -> Any:
    import msgspec

    from runtime.client import ReplyEdit

    if isinstance(value, str):
        return ReplyEdit(content=value)
    if isinstance(value, list):
        value = {"calls": value}
    if not isinstance(value, dict):
        raise ValueError("--reply takes a JSON object {\"content\": ..., \"calls\": [{\"name\": ..., "
                         "\"arguments\": {...}}]}, a list of calls, or a string")
    try:
        return msgspec.convert({k: v for k, v in value.items() if k != "kind"}, ReplyEdit)
    except msgspec.ValidationError as e:
        raise ValueError(f"--reply: {e} (calls look like {{\"name\": \"add\", \"arguments\": "
                         "{\"a\": 1}})") from None


async def _fork(url: str, run: str, at: int, edit: Any, follow: bool, as_json: bool) -> int:
    from runtime import events as ev
    from runtime.client import ForkError
    from runtime.client.replay import watch

    async with client_for(url, "fork") as client:
        try:
            forked = await client.fork(run, at, edit)
        except (ForkError, ValueError) as e:  # ValueError: a run id that is not a subject token
            typer.echo(f"sa fork: {e}", err=True)
            return 2
        if as_json:
            print(json.dumps({"run_id": forked.run_id, "source_run": forked.source_run,
                              "at_seq": forked.at_seq, "actor": forked.actor, "events": forked.events}),
                  flush=True)
        else:
            print(forked.run_id, flush=True)
            typer.echo(f"forked {run} at seq {at} into {forked.run_id} ({forked.events} event(s) written, "
                       f"partition {forked.partition}); see: sa replay {forked.run_id}", err=True)
        if not follow:
            return 0
        last = await watch(client.get(forked.run_id, forked.actor), console(stderr=not as_json),
                           as_json=as_json)
        return 0 if isinstance(last, ev.RunCompleted) else 1
