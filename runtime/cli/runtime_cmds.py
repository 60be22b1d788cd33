"""Commands registered on the `sa` app (see runtime/cli/__init__.py): the NATS runtime.

    sa up [BUNDLES...] [--workers N]      embedded NATS (unless NATS_URL), the local model if a bundle uses
                                          it, a host and N workers; Ctrl-C stops everything
    sa send AGENT "task" [--follow]       publish a task, print its run id, optionally follow it live
    sa runs [AGENT]                       the runs index
    sa status [--json]                    hosts and their partitions, workers, queue depths, runs in flight
    sa replay RUN [--json] [--verify]     a run's timeline; --verify re-folds it with the kernel
    sa host [BUNDLES...]                  an agent host on an existing NATS
    sa worker [--tools GLOB] [--bundle B] a tool worker on an existing NATS

Finding the server: `--nats`, else `NATS_URL`, else the state file `sa up` writes while it runs
(`<user data dir>/structured-agents/up.json`, e.g. ~/.local/share/structured-agents/up.json on Linux;
it holds the NATS URL, the local model URL, the bundles and the pid, and is removed when `sa up` stops).
Exit codes: 0 success; 1 the run failed or was cancelled (`send --follow`) or did not verify (`replay
--verify`); 2 bad usage (no server, unknown run, invalid bundle).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.app import app


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1,
                                             help="Jobs run at once by this process.")] = 8,
    tools: Annotated[list[str], typer.Option("--tools", "-t",
                                             help="Glob of .pym tool scripts to serve (repeatable).")] = [],  # noqa: B006
    bundle: Annotated[list[str], typer.Option("--bundle", "-b",
                                              help="bundle.yaml (or its folder) whose tools to serve "
                                                   "(repeatable).")] = [],  # noqa: B006
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                 help="NATS server URL(s), comma-separated.")] = None,
) -> None:
    """Run sandboxed tool jobs from the shared `workers` consumer until Ctrl-C / SIGTERM.

    Start as many as you like, on any machine that reaches NATS: jobs spread across them, and a job a
    killed worker held is redelivered to another one.
    """
    import logging
    import signal

    import anyio

    from runtime.bundle import BundleError
    from runtime.worker import build_registry, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not nats_url:
        typer.echo("sa worker: no NATS server; set NATS_URL or pass --nats nats://host:4222", err=True)
        raise typer.Exit(2)
    if not tools and not bundle:
        typer.echo("sa worker: nothing to serve; pass --tools 'agents/*.pym' and/or --bundle PATH", err=True)
        raise typer.Exit(2)
    try:
        registry = build_registry(bundles=bundle, tool_globs=tools)
    except (BundleError, FileNotFoundError, ValueError) as e:
        typer.echo(f"sa worker: {e}", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        stop = anyio.Event()

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        def ready(w: object) -> None:
            names = ", ".join(sorted(registry.tools))
            typer.echo(f"sa worker {getattr(w, 'name', '')}: serving {names} (concurrency {concurrency})",
                       err=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            stats = await serve(nats_url, registry, concurrency=concurrency, stop=stop, on_ready=ready)
            tg.cancel_scope.cancel()
        typer.echo(f"sa worker: stopped after {stats.completed} job(s) ({stats.failed} failed)", err=True)

    anyio.run(main, backend="asyncio")


# ---------------------------------------------------------------------------------------------------------
# where things are
# ---------------------------------------------------------------------------------------------------------


def state_file() -> Path:
    """Where `sa up` records its NATS and model URLs while it runs."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "up.json"


def _read_state() -> dict[str, Any]:
    path = state_file()
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    pid = state.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return {}  # a stale file from an `sa up` that was killed
        except PermissionError:
            pass
    return state


def resolve_nats(explicit: str | None, command: str) -> str:
    """`--nats`/NATS_URL, else the running `sa up`; exit 2 with what to do if there is neither."""
    url = explicit or _read_state().get("nats_url")
    if not url:
        typer.echo(f"sa {command}: no NATS server: start one with `sa up`, or set NATS_URL "
                   "(or pass --nats nats://host:4222)", err=True)
        raise typer.Exit(2)
    return str(url)


def _bundle_paths(bundles: list[Path]) -> list[Path]:
    if bundles:
        return bundles
    default = Path("bundles/demo")
    if (default / "bundle.yaml").is_file():
        return [default]
    typer.echo("no bundle given (and no bundles/demo here): pass bundle.yaml files or folders", err=True)
    raise typer.Exit(2)


def _setup_logging(verbose: bool) -> None:
    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s",
                        handlers=[RichHandler(show_path=False, rich_tracebacks=False)])
    logging.getLogger("runtime.host").setLevel(logging.INFO)


def _load_agents(bundles: list[Path], model_url: str | None) -> Any:
    from runtime.bundle import BundleError
    from runtime.host import load_agents

    try:
        return load_agents(bundles, local_model_url=model_url)
    except (BundleError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


async def _until_signal(stop: Any) -> None:
    import signal

    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop.set()
            return


# ---------------------------------------------------------------------------------------------------------
# sa host
# ---------------------------------------------------------------------------------------------------------


@app.command()
def host(
    bundles: Annotated[list[Path], typer.Argument(help="bundle.yaml files or their folders")] = [],  # noqa: B006
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                 help="NATS server URL(s), comma-separated.")] = None,
    model_url: Annotated[str | None, typer.Option("--model-url", envvar="SA_LOCAL_MODEL_URL",
                                                  help="The local model server, for bundles whose model "
                                                       "is `local`.")] = None,
    task_ack_wait: Annotated[float, typer.Option(help="Seconds before a task or tool result a host held "
                                                      "un-acked is delivered again.")] = 30.0,
    partitions: Annotated[int, typer.Option(min=1, help="Task partitions, used only when the streams are "
                                                        "first created (then fixed: read from TASKS).")] = 16,
    lease_ttl: Annotated[float, typer.Option(min=2, help="Seconds a partition lease lives without renewal "
                                                         "(renewed every TTL/3): a dead host's partitions "
                                                         "are taken over within TTL + TTL/3.")] = 6.0,
    max_runs: Annotated[int, typer.Option(min=1, help="Back-pressure: runs driven plus tasks waiting in "
                                                      "mailboxes; at the bound this host stops pulling "
                                                      "tasks.")] = 4096,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run an agent host: every bundle is an agent at agents.<name>.tasks; unfinished runs are resumed.

    Start one or many, on any machine that reaches NATS: hosts share the task partitions by expiring
    leases (a fair share each), and take over the partitions, and unfinished runs, of a host that dies.
    """
    import anyio

    from runtime.host import HostConfig, serve
    from runtime.host.leases import LeaseConfig

    url = resolve_nats(nats_url, "host")
    model_url = model_url or _read_state().get("model_url")
    paths = _bundle_paths(bundles)
    _setup_logging(verbose)
    agents = _load_agents(paths, model_url)

    async def main() -> None:
        stop = anyio.Event()

        def ready(h: Any) -> None:
            typer.echo(f"sa host: serving {', '.join(sorted(agents))} on {len(h.partitions)} of "
                       f"{h.total_partitions} partition(s) {h.partitions} as {h.id}; resumed "
                       f"{h.stats.runs_recovered} run(s)", err=True)

        config = HostConfig(task_ack_wait=task_ack_wait, lease=LeaseConfig(ttl=lease_ttl), max_runs=max_runs)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_signal, stop)
            stats = await serve(url, agents, stop=stop, on_ready=ready, config=config, partitions=partitions)
            tg.cancel_scope.cancel()
        ended = ", ".join(f"{v} {k}" for k, v in sorted(stats.runs_ended.items())) or "none ended"
        typer.echo(f"sa host: stopped ({stats.runs_started} run(s) started; {ended})", err=True)

    anyio.run(main, backend="asyncio")


# ---------------------------------------------------------------------------------------------------------
# sa up
# ---------------------------------------------------------------------------------------------------------


@app.command()
def up(
    bundles: Annotated[list[Path], typer.Argument(help="bundle.yaml files or folders (default: "
                                                       "bundles/demo)")] = [],  # noqa: B006
    workers: Annotated[int, typer.Option("--workers", "-w", min=0, help="Tool worker processes.")] = 1,
    concurrency: Annotated[int, typer.Option(help="Jobs per worker process.")] = 8,
    store: Annotated[Path | None, typer.Option(help="JetStream store folder (default: the user data "
                                                    "dir, kept across restarts).")] = None,
    partitions: Annotated[int, typer.Option(help="Task partitions (fixed when the streams are first "
                                                 "created).")] = 16,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Start everything on this machine: NATS, the local model (if needed), a host and N workers."""
    import anyio

    from runtime.nats.connection import servers_from_env
    from runtime.nats.server import EmbeddedNats, default_store_dir

    paths = _bundle_paths(bundles)
    _setup_logging(verbose)
    from runtime.bundle import BundleError, load_bundle

    try:
        loaded = [load_bundle(p) for p in paths]
    except BundleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    from rich.console import Console

    console = Console(stderr=True)
    server = None
    model = None
    procs: list[subprocess.Popen[bytes]] = []
    env_url = servers_from_env()
    try:
        if env_url:
            url = ",".join(env_url)
            console.print(f"[bold]nats[/]     {url} (NATS_URL)")
        else:
            server = EmbeddedNats(store or default_store_dir()).start()
            url = server.url
            console.print(f"[bold]nats[/]     {url}  (embedded, store {server.store_dir})")
        model_url = None
        if any(b.uses_local_model for b in loaded):
            model_url = _start_local_model(console)
            model = model_url[1]
            model_url = model_url[0]
            console.print(f"[bold]model[/]    {model_url}/v1  (local SmolLM2)")
        for _ in range(workers):
            cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker",
                   "--concurrency", str(concurrency)]
            for p in paths:
                cmd += ["--bundle", str(p)]
            procs.append(subprocess.Popen(cmd, env={**os.environ, "NATS_URL": url}, stdin=subprocess.DEVNULL))
        pids = ", ".join(str(p.pid) for p in procs) or "-"
        console.print(f"[bold]workers[/]  {workers} process(es): {pids}")
        state_file().parent.mkdir(parents=True, exist_ok=True)
        state_file().write_text(json.dumps({"nats_url": url, "model_url": model_url, "pid": os.getpid(),
                                            "bundles": [str(p.resolve()) for p in paths]}, indent=2))
        console.print(f"[bold]state[/]    {state_file()}")
        agents = _load_agents(paths, model_url)

        async def main() -> None:
            from runtime.host import serve

            stop = anyio.Event()

            def ready(h: Any) -> None:
                names = ", ".join(f"agents.{n}.tasks" for n in sorted(agents))
                console.print(f"[bold]host[/]     serving {names}; resumed {h.stats.runs_recovered} run(s)")
                console.print(f"[green]ready[/]: sa send {sorted(agents)[0]} \"...\" --follow   "
                              "(Ctrl-C stops everything)")

            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_signal, stop)
                await serve(url, agents, stop=stop, on_ready=ready, partitions=partitions)
                tg.cancel_scope.cancel()

        anyio.run(main, backend="asyncio")
    finally:
        console.print("stopping…")
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if model is not None:
            model.stop()
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            if _read_state().get("pid") in (os.getpid(), None):
                state_file().unlink()
        console.print("stopped")


def _start_local_model(console: Any) -> tuple[str, Any]:
    """Start the embedded model server as a child process (first start converts the weights: minutes)."""
    from runtime.modelserver import start_model_server

    with console.status("starting the local model server (the first start converts the SmolLM2 weights; "
                        "this can take a few minutes)…"):
        handle = start_model_server(timeout=900.0)
    return handle.base_url, handle


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
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Publish a task to agents.<agent>.tasks and print its run id (then follow it with --follow)."""
    import anyio

    url = resolve_nats(nats_url, "send")
    code = anyio.run(_send, url, agent, task, follow, instance, task_id, timeout, as_json, backend="asyncio")
    raise typer.Exit(code)


async def _send(url: str, agent: str, task: str, follow: bool, instance: str | None, task_id: str | None,
                timeout: float | None, as_json: bool) -> int:
    from rich.console import Console

    from runtime import events as ev
    from runtime.host.commands import publish_task
    from runtime.nats.connection import close, connect
    from runtime.replay import watch

    console = Console()
    nc = await connect(url, name="sa-send", max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        try:
            run_id = await publish_task(js, agent, task, task_id=task_id, instance=instance,
                                        timeout_s=timeout)
        except ValueError as e:
            typer.echo(f"sa send: {e}", err=True)
            return 2
        if as_json:
            print(json.dumps({"run_id": run_id}), flush=True)
        else:
            console.print(f"run [bold]{run_id}[/]")
        if not follow:
            return 0
        last = await watch(js, run_id, console, as_json=as_json)
        ok = isinstance(last, ev.RunCompleted)
        return 0 if ok else 1
    finally:
        await close(nc)


# ---------------------------------------------------------------------------------------------------------
# sa runs, sa replay
# ---------------------------------------------------------------------------------------------------------


@app.command()
def runs(
    agent: Annotated[str | None, typer.Argument(help="Only this agent (bundle or bundle:instance).")] = None,
    limit: Annotated[int, typer.Option(help="The most recent N runs.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """List runs from the runs index, newest first."""
    import anyio

    url = resolve_nats(nats_url, "runs")
    rows = anyio.run(_list_runs, url, backend="asyncio")
    if agent:
        rows = [r for r in rows if r[1].agent == agent or r[1].agent.split(":")[0] == agent]
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
    colors = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for run_id, ix in rows:
        when = datetime.datetime.fromtimestamp(ix.updated).strftime("%Y-%m-%d %H:%M:%S") if ix.updated else ""
        table.add_row(run_id, ix.agent, f"[{colors.get(ix.status, '')}]{ix.status}[/]", when,
                      ix.task_id or "", str(ix.last_seq))
    Console().print(table if rows else "no runs yet")


async def _list_runs(url: str) -> list[tuple[str, Any]]:
    from runtime.nats.connection import close, connect
    from runtime.nats.kv import kv_entries, runs_kv
    from runtime.nats.records import RunIndex

    nc = await connect(url, name="sa-runs", max_reconnect_attempts=3)
    try:
        kv = await runs_kv(nc.jetstream())
        return [(key, RunIndex.decode(entry.value))
                for key, entry in (await kv_entries(kv)).items() if entry.value]
    finally:
        await close(nc)


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="The status as one JSON object.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """The fleet: hosts and their partitions, workers, queue depths, runs in flight."""
    import anyio

    url = resolve_nats(nats_url, "status")
    try:
        report = anyio.run(_status, url, backend="asyncio")
    except Exception as e:  # no topology yet, or NATS unreachable
        typer.echo(f"sa status: {type(e).__name__}: {e} (is anything running? `sa up` creates the streams)",
                   err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
        return
    from rich.console import Console

    from runtime.status import render

    Console().print(render(report))


async def _status(url: str) -> dict[str, Any]:
    from runtime.nats.connection import close, connect
    from runtime.status import gather

    nc = await connect(url, name="sa-status", max_reconnect_attempts=3)
    try:
        return await gather(nc.jetstream())
    finally:
        await close(nc)


@app.command()
def replay(
    run: Annotated[str, typer.Argument(help="The run id (as printed by sa send / sa runs).")],
    as_json: Annotated[bool, typer.Option("--json", help="The events as JSON lines.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Re-fold with the kernel and check that decide "
                                                          "reproduces every recorded effect.")] = False,
    bundle: Annotated[Path | None, typer.Option("--bundle", help="The run's bundle for --verify (default: "
                                                                 "the one the runs index names).")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Show a run's timeline: model requests, tool calls, script start/complete/error, durations, tokens."""
    import anyio

    from runtime import events as ev

    url = resolve_nats(nats_url, "replay")
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
        for e in runlog.events:
            print(ev.to_json(e))
    else:
        from rich.console import Console

        from runtime.replay import timeline

        Console().print(timeline(runlog.events, title=f"run {run} · {runlog.actor}"))
    if verify:
        from runtime.bundle import BundleError, load_bundle
        from runtime.replay import verify as verify_log

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
        report = verify_log(loaded.kernel_config(), runlog.events)
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


async def _read(url: str, run: str) -> tuple[Any, Any]:
    from nats.js.errors import KeyNotFoundError, NotFoundError

    from runtime.log import RunLog
    from runtime.nats.connection import close, connect
    from runtime.nats.kv import runs_kv
    from runtime.nats.records import RunIndex

    nc = await connect(url, name="sa-replay", max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        runlog = await RunLog(js).read(run)
        try:
            entry = await (await runs_kv(js)).get(run)
            index = RunIndex.decode(entry.value) if entry.value else None
        except (KeyNotFoundError, NotFoundError):
            index = None
        return runlog, index
    finally:
        await close(nc)
