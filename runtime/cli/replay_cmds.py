"""Reading a run back: `sa replay` (`runtime.client` reads; `runtime.client.replay` renders and verifies;
`runtime.client.diff` compares).

    sa replay RUN [--json] [--verify]     a run's timeline; --verify re-folds it with the kernel
    sa replay RUN --thread                every run of RUN's thread, in order
    sa replay RUN --diff OTHER            where two runs (say a fork and its source) diverge
    sa replay RUN --html > run.html       the run as one self-contained HTML file (`runtime.ui.export`)

Exit codes: 0 success; 1 the run did not verify (`--verify`); 2 bad usage (no server, unknown run,
invalid bundle).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, printable

if TYPE_CHECKING:
    from runtime import events as ev
    from runtime.client import Client, RunHandle


@app.command()
def replay(
    run: Annotated[str, typer.Argument(help="The run id (as printed by sa send / sa runs).")],
    as_json: Annotated[bool, typer.Option("--json", help="The events as JSON lines.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Re-fold with the kernel and check that decide "
                                                          "reproduces every recorded effect.")] = False,
    bundle: Annotated[Path | None, typer.Option("--bundle", help="The run's bundle for --verify (default: "
                                                                 "the one the runs index names).")] = None,
    html: Annotated[bool, typer.Option("--html", help="The run as one self-contained HTML file on stdout "
                                                      "(sa replay RUN --html > run.html).")] = False,
    diff: Annotated[str | None, typer.Option("--diff", metavar="OTHER_RUN",
                                             help="Show where OTHER_RUN diverges from RUN and what "
                                                  "differs after that point.")] = None,
    thread: Annotated[bool, typer.Option("--thread",
                                         help="Show every run of RUN's thread, in order.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Show a run's timeline: model requests, tool calls, script start/complete/error, durations, tokens."""
    url = resolve_nats(nats_url, "replay")

    async def chosen(client: Client) -> int:
        if html:
            return await _html(client, run)
        if diff is not None:
            return await _diff(client, run, diff, as_json)
        if thread:
            return await _thread(client, run, as_json)
        return await _replay(client, run, as_json, bundle, verify)

    raise typer.Exit(with_client(url, "replay", chosen))


def _fail(message: str) -> int:
    typer.echo(f"sa replay: {message}", err=True)
    return 2


async def _events(handle: RunHandle) -> list[ev.Event] | None:
    """The run's events (and `handle.actor` set); None, after saying why, for a run id that is not one
    or a run with none."""
    try:
        events = await handle.replay()
    except ValueError as e:  # not a subject token
        _fail(str(e))
        return None
    if not events:
        _fail(f"no events for run {handle.run_id!r} (see `sa runs`)")
        return None
    return events


async def _replay(client: Client, run: str, as_json: bool, bundle: Path | None, verify: bool) -> int:
    from runtime import events as ev
    from runtime.client.replay import timeline

    handle = client.get(run)
    events = await _events(handle)
    if events is None:
        return 2
    if as_json:
        for e in events:
            print(ev.to_json(e))
    else:
        console().print(timeline(events, title=f"run {run} · {handle.actor}"))
    return await _verify(client, handle, events[0], bundle, as_json) if verify else 0


async def _verify(client: Client, handle: RunHandle, started: ev.Event, bundle: Path | None,
                  as_json: bool) -> int:
    """`--verify`: the kernel re-folds the run with its bundle (`RunHandle.verify`); 0 if it reproduces
    every recorded effect, 1 if not, 2 if the bundle is unknown or invalid."""
    from runtime import events as ev
    from runtime.bundle import BundleError, load_bundle

    if bundle is None:
        info = await client.run_info(handle.run_id)
        bundle = Path(info.bundle) if info is not None and info.bundle else None
    if bundle is None:
        typer.echo("sa replay --verify: the run's bundle is unknown; pass --bundle PATH", err=True)
        return 2
    try:
        loaded = load_bundle(bundle)
    except BundleError as e:
        typer.echo(f"error: {e}", err=True)
        return 2
    made_with = started.bundle_digest if isinstance(started, ev.RunStarted) else ""
    if made_with and made_with != loaded.digest:
        typer.echo(f"warning: the run was made with bundle version {made_with}, {bundle} is "
                   f"{loaded.digest}", err=True)
    try:
        report = await handle.verify(loaded)
    except LookupError as e:  # a thread's earlier run is gone
        typer.echo(f"sa replay --verify: {e}", err=True)
        return 2
    if as_json:
        print(json.dumps({"verified": report.ok, "checked": report.checked, "inputs": report.inputs,
                          "problems": report.problems}))
    elif report.ok:
        typer.echo(f"verified: the kernel reproduces all {report.checked} recorded effects "
                   f"({report.inputs} inputs folded)")
    else:
        typer.echo("NOT verified:\n  " + "\n  ".join(printable(p) for p in report.problems))
    return 0 if report.ok else 1


async def _html(client: Client, run: str) -> int:
    """`--html`: the run's one-file HTML (`runtime.ui.export`) on stdout; 2 if there is no run."""
    from runtime.ui.export import NoSuchRun, export_run

    try:
        page = await export_run(client.js, run)
    except (ValueError, NoSuchRun) as e:
        return _fail(str(e))
    sys.stdout.write(page)
    sys.stdout.flush()
    return 0


async def _thread(client: Client, run: str, as_json: bool) -> int:
    """`--thread`: the timelines of every run of RUN's thread, in order."""
    from runtime import events as ev
    from runtime.client.replay import timeline

    handle = client.get(run)
    first = await _events(handle)
    if first is None:
        return 2
    started, actor = first[0], handle.actor or ""
    if not isinstance(started, ev.RunStarted) or started.thread is None:
        typer.echo(f"sa replay --thread: run {run} is in no thread (it was sent without --thread)", err=True)
        return 2
    record = await client.thread(actor, started.thread)
    ids = record.runs if record is not None else [run]
    out = console()
    for i, run_id in enumerate(ids, 1):
        events = first if run_id == run else await client.get(run_id, actor).replay()
        if as_json:
            for e in events:
                print(ev.to_json(e))
        else:
            out.print(timeline(events, title=f"thread {started.thread!r} · run {i} of {len(ids)}: "
                                             f"{run_id} · {actor}"))
    return 0


async def _diff(client: Client, a: str, b: str, as_json: bool) -> int:
    """`--diff`: where run `b` diverges from run `a` (`Client.diff`)."""
    from runtime.client.diff import fact, render

    try:
        d = await client.diff(a, b)
    except (ValueError, LookupError) as e:
        return _fail(str(e))
    if as_json:
        print(json.dumps({"a": a, "b": b, "common": d.common, "b_common": d.b_common,
                          "identical": d.identical,
                          "a_rest": [fact(e) for e in d.a_rest], "b_rest": [fact(e) for e in d.b_rest]},
                         default=str))
    else:
        console().print(render(d))
    return 0


__all__ = ["replay"]
