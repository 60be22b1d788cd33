"""Reading a run back: `sa replay` (`runtime.client.replay` renders and verifies; `runtime.client.diff`
compares).

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
from typing import Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.where import resolve_nats

# ---------------------------------------------------------------------------------------------------------
# sa replay
# ---------------------------------------------------------------------------------------------------------


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
    import anyio

    from runtime import events as ev

    url = resolve_nats(nats_url, "replay")
    if html:
        raise typer.Exit(_replay_html(url, run))
    if diff is not None:
        raise typer.Exit(anyio.run(_diff, url, run, diff, as_json, backend="asyncio"))
    if thread:
        raise typer.Exit(anyio.run(_replay_thread, url, run, as_json, backend="asyncio"))
    try:
        runlog, index = anyio.run(_read, url, run, backend="asyncio")
    except ValueError as e:
        typer.echo(f"sa replay: {e}", err=True)
        raise typer.Exit(2) from None
    if not runlog.events:
        typer.echo(f"sa replay: no events for run {run!r} (see `sa runs`)", err=True)
        raise typer.Exit(2)
    code = 0
    if as_json:
        for e in runlog.events:  # type: ignore[misc]  # `e` was the except clause's name above
            print(ev.to_json(e))
    else:
        from rich.console import Console

        from runtime.client.replay import timeline

        Console().print(timeline(runlog.events, title=f"run {run} · {runlog.actor}"))
    if verify:
        from runtime.bundle import BundleError, load_bundle
        from runtime.client.replay import verify as verify_log

        path = bundle or (Path(index.bundle) if index is not None and index.bundle else None)
        if path is None:
            typer.echo("sa replay --verify: the run's bundle is unknown; pass --bundle PATH", err=True)
            raise typer.Exit(2)
        try:
            loaded = load_bundle(path)
        except BundleError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        started = runlog.events[0]
        if isinstance(started, ev.RunStarted) and started.bundle_digest and \
                started.bundle_digest != loaded.digest:
            typer.echo(f"warning: the run was made with bundle version {started.bundle_digest}, {path} is "
                       f"{loaded.digest}", err=True)
        config = loaded.kernel_config()
        try:
            conv = anyio.run(_conversation, url, config, runlog.events, backend="asyncio")
        except LookupError as e:
            typer.echo(f"sa replay --verify: {e}", err=True)
            raise typer.Exit(2) from None
        report = verify_log(config, runlog.events, conv)
        if as_json:
            print(json.dumps({"verified": report.ok, "checked": report.checked, "inputs": report.inputs,
                              "problems": report.problems}))
        elif report.ok:
            typer.echo(f"verified: the kernel reproduces all {report.checked} recorded effects "
                       f"({report.inputs} inputs folded)")
        else:
            typer.echo("NOT verified:\n  " + "\n  ".join(report.problems))
        code = 0 if report.ok else 1
    raise typer.Exit(code)


def _replay_html(url: str, run: str) -> int:
    """`sa replay RUN --html`: print the run's one-file HTML (`runtime.ui.export`); 2 if there is no run."""
    import anyio

    from runtime import nats as bus
    from runtime.ui.export import NoSuchRun, export_run

    async def render() -> str:
        nc = await bus.connect(url, name="sa-replay", max_reconnect_attempts=3)
        try:
            return await export_run(bus.jetstream_for(nc), run)
        finally:
            await bus.close(nc)

    try:
        page = anyio.run(render, backend="asyncio")
    except (ValueError, NoSuchRun) as e:
        typer.echo(f"sa replay: {e}", err=True)
        return 2
    sys.stdout.write(page)
    sys.stdout.flush()
    return 0


async def _conversation(url: str, config: Any, events: list[Any]) -> Any:
    """The conversation a run in a thread continues (None for any other run), read from the earlier runs'
    logs: `--verify` folds the run with it."""
    from runtime import nats as bus
    from runtime.log import RunLog
    from runtime.log.threads import conversation_for

    nc = await bus.connect(url, name="sa-replay", max_reconnect_attempts=3)
    try:
        return await conversation_for(RunLog(bus.jetstream_for(nc)), config, events)
    finally:
        await bus.close(nc)


async def _replay_thread(url: str, run: str, as_json: bool) -> int:
    from rich.console import Console

    from runtime import events as ev
    from runtime import nats as bus
    from runtime.client.replay import timeline
    from runtime.log import RunLog
    from runtime.log.threads import Threads

    nc = await bus.connect(url, name="sa-replay", max_reconnect_attempts=3)
    try:
        js = bus.jetstream_for(nc)
        runs = RunLog(js)
        first = await runs.read(run)
        started = first.events[0] if first.events else None
        if not isinstance(started, ev.RunStarted):
            typer.echo(f"sa replay: no events for run {run!r} (see `sa runs`)", err=True)
            return 2
        if started.thread is None:
            typer.echo(f"sa replay --thread: run {run} is in no thread (it was sent without --thread)",
                       err=True)
            return 2
        record, _ = await Threads(js).get(first.actor, started.thread)
        ids = record.runs if record is not None else [run]
        console = Console()
        for i, run_id in enumerate(ids, 1):
            history = first if run_id == run else await runs.read(run_id)
            if as_json:
                for e in history.events:
                    print(ev.to_json(e))
            else:
                console.print(timeline(history.events, title=f"thread {started.thread!r} · run {i} of "
                                                             f"{len(ids)}: {run_id} · {first.actor}"))
        return 0
    finally:
        await bus.close(nc)


async def _diff(url: str, a: str, b: str, as_json: bool) -> int:
    from rich.console import Console

    from runtime import nats as bus
    from runtime.client.diff import diverge, fact, render
    from runtime.log import RunLog

    nc = await bus.connect(url, name="sa-replay", max_reconnect_attempts=3)
    try:
        runs = RunLog(bus.jetstream_for(nc))
        try:
            logs = [await runs.read(a), await runs.read(b)]
        except ValueError as e:
            typer.echo(f"sa replay: {e}", err=True)
            return 2
    finally:
        await bus.close(nc)
    for log in logs:
        if not log.events:
            typer.echo(f"sa replay --diff: no events for run {log.run_id!r} (see `sa runs`)", err=True)
            return 2
    d = diverge(a, logs[0].events, b, logs[1].events)
    if as_json:
        print(json.dumps({"a": a, "b": b, "common": d.common, "identical": d.identical,
                          "a_rest": [fact(e) for e in d.a_rest], "b_rest": [fact(e) for e in d.b_rest]},
                         default=str))
    else:
        Console().print(render(d))
    return 0


async def _read(url: str, run: str) -> tuple[Any, Any]:
    from nats.js.errors import KeyNotFoundError, NotFoundError

    from runtime import nats as bus
    from runtime.log import RunLog

    nc = await bus.connect(url, name="sa-replay", max_reconnect_attempts=3)
    try:
        js = bus.jetstream_for(nc)
        runlog = await RunLog(js).read(run)
        try:
            entry = await (await bus.runs_kv(js)).get(run)
            index = bus.RunIndex.decode(entry.value) if entry.value else None
        except (KeyNotFoundError, NotFoundError):
            index = None
        return runlog, index
    finally:
        await bus.close(nc)
