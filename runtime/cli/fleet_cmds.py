"""The fleet's processes and what they are doing: `sa up`, `sa host`, `sa worker`, `sa status`.

    sa up [BUNDLES...] [--workers N]      embedded NATS (unless NATS_URL), the local model if a bundle uses
                                          it, a host and N workers; Ctrl-C stops everything
    sa host [BUNDLES...]                  an agent host on an existing NATS
    sa worker [--tools GLOB] [--bundle B] a tool worker on an existing NATS
              [--externals MOD:FACTORY]  the host functions of the scripts' @externals
              [--secrets FILE]           NAME=value secrets a bundle may grant to tools
    sa status [--json]                    hosts and their partitions, workers, queue depths, runs in flight

Finding the server and the bundles (a bundle folder, its bundle.yaml, or a folder of bundle folders):
`runtime.cli.where`. Start-up prints one line per process; a host's per-partition log lines start once it
is ready (all of them with --verbose). Exit codes: 0 success; 2 bad usage (no server, invalid bundle) or,
for `sa status`, nothing to read (no streams yet, NATS unreachable).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.observe_cmds import LogFormatOption, MetricsPortOption, announce, start_metrics
from runtime.cli.signals import until_signal
from runtime.cli.where import bundle_paths, expand_bundles, read_state, resolve_nats, state_file
from runtime.observe.logs import LogFormat

if TYPE_CHECKING:
    from rich.console import Console

    from runtime.modelserver.launch import ServerProcess
    from runtime.nats.server import EmbeddedNats

VERBOSE_HELP = "Log at INFO from the start (every partition taken, every run resumed)."

# Retention (`runtime.nats.retention`): applied to the existing streams when a host starts. Unset: a stream
# the runtime already bounded keeps its bounds, one never bounded gets the default.
EventsMaxAge = Annotated[str | None, typer.Option(
    "--events-max-age", envvar="SA_EVENTS_MAX_AGE", show_default=False,
    help="How long EVENTS keeps an event: '90d', '12h', 0 for no bound [default: 90d, or what the stream "
         "has]. An event older than this is deleted even if its run is still going; delete finished runs "
         "with `sa runs purge`.")]
EventsMaxBytes = Annotated[str | None, typer.Option(
    "--events-max-bytes", envvar="SA_EVENTS_MAX_BYTES", show_default=False,
    help="EVENTS size bound, '50gb'; the oldest events go first, whatever their run [default: none].")]
PayloadsMaxAge = Annotated[str | None, typer.Option(
    "--payloads-max-age", envvar="SA_PAYLOADS_MAX_AGE", show_default=False,
    help="How long the payloads object store keeps a big payload [default: 90d, or what it has].")]
PayloadsMaxBytes = Annotated[str | None, typer.Option(
    "--payloads-max-bytes", envvar="SA_PAYLOADS_MAX_BYTES", show_default=False,
    help="Payloads object store size bound; when full a new big payload is refused [default: none].")]

# ---------------------------------------------------------------------------------------------------------
# sa up
# ---------------------------------------------------------------------------------------------------------


@app.command()
def up(
    bundles: Annotated[list[Path], typer.Argument(help="bundle.yaml files, bundle folders or folders of "
                                                       "them (default: bundles/demo)")] = [],  # noqa: B006
    workers: Annotated[int, typer.Option("--workers", "-w", min=0, help="Tool worker processes.")] = 1,
    concurrency: Annotated[int, typer.Option(help="Jobs per worker process.")] = 8,
    store: Annotated[Path | None, typer.Option(help="JetStream store folder (default: the user data "
                                                    "dir, kept across restarts).")] = None,
    partitions: Annotated[int, typer.Option(help="Task partitions (fixed when the streams are first "
                                                 "created).")] = 16,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)] = False,
    events_max_age: EventsMaxAge = None,
    events_max_bytes: EventsMaxBytes = None,
    payloads_max_age: PayloadsMaxAge = None,
    payloads_max_bytes: PayloadsMaxBytes = None,
    metrics_port: MetricsPortOption = None,
    log_format: LogFormatOption = LogFormat.text,
    secure: Annotated[bool, typer.Option(
        "--secure", help="Start the embedded NATS with authentication: fresh credentials for each role "
                         "(publisher, operator, host, worker, admin) in 0600 files whose paths are printed; "
                         "the host and workers run as their roles.")] = False,
) -> None:
    """Start everything on this machine: NATS, the local model (if needed), a host and N workers.

    Retention: EVENTS and the payload store keep 90 days by default, with no size bound (see the
    --events-*/--payloads-* options); `sa runs purge` deletes finished runs.
    """
    import anyio

    from runtime import nats as bus

    retention = _retention(events_max_age, events_max_bytes, payloads_max_age, payloads_max_bytes)
    paths = bundle_paths(bundles)
    _setup_logging(verbose, log_format)
    metrics = _host_metrics(metrics_port)
    from runtime.bundle import BundleError, load_bundle

    try:
        loaded = [load_bundle(p) for p in paths]
    except BundleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if any(b.uses_local_model for b in loaded):
        from runtime.extras import MissingExtra, require

        try:  # before anything starts: a lean install says how to get the local model, and leaves nothing
            require("model", "sa up with a bundle on the local model")
        except MissingExtra as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)  # one line per process, whatever the width
    server: EmbeddedNats | None = None
    model: ServerProcess | None = None
    procs: list[subprocess.Popen[bytes]] = []
    env_url = bus.servers_from_env()
    if secure and env_url:
        typer.echo("error: --secure starts the embedded NATS with its own credentials, but NATS_URL names a "
                   "server: unset NATS_URL, or secure that server with deploy/nats/auth.conf", err=True)
        raise typer.Exit(2)
    worker_env: dict[str, str] = {}
    try:
        if env_url:
            url = ",".join(env_url)
            console.print(f"[bold]nats[/]     {url} (NATS_URL)")
        else:
            extra: list[str] = []
            if secure:
                worker_env = _secure_setup(console, extra)
            server = bus.EmbeddedNats(store or bus.default_store_dir(), extra_args=extra).start()
            url = server.url
            console.print(f"[bold]nats[/]     {url}  (embedded, store {server.store_dir}"
                          f"{', authentication on' if secure else ''})")
        model_url: str | None = None
        if any(b.uses_local_model for b in loaded):
            model = _start_local_model(console)
            model_url = model.base_url
            console.print(f"[bold]model[/]    {model_url}/v1  (local SmolLM2)")
        for _ in range(workers):
            cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker",
                   "--concurrency", str(concurrency), "--log-format", log_format.value]
            for p in paths:
                cmd += ["--bundle", str(p)]
            procs.append(subprocess.Popen(cmd, env={**os.environ, **worker_env, "NATS_URL": url},
                                          stdin=subprocess.DEVNULL))
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
                if metrics is not None:
                    metrics.watch_host(h)
                names = ", ".join(f"agents.{n}.tasks" for n in sorted(agents))
                console.print(f"[bold]host[/]     serving {names} on {_partitions(h)}; resumed "
                              f"{h.stats.runs_recovered} run(s)", highlight=False)
                console.print(f"[green]ready[/]: sa send {sorted(agents)[0]} \"...\" --follow   "
                              "(Ctrl-C stops everything)")
                _started()

            await _apply_retention(url, retention, partitions)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_signal, stop, verbose)
                if metrics is not None:
                    tg.start_soon(_poll_queues, url, metrics, stop)
                await serve(url, agents, stop=stop, on_ready=ready, partitions=partitions,
                            on_event=metrics.observe if metrics is not None else None)
                tg.cancel_scope.cancel()

        anyio.run(main, backend="asyncio")
    finally:
        console.print("stopping…")
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if model is not None:
            model.stop()
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            if read_state().get("pid") in (os.getpid(), None):
                state_file().unlink()
        console.print("stopped")


def secure_dir() -> Path:
    """Where `sa up --secure` writes the server's users and each role's credentials."""
    return state_file().parent / "secure"


def _secure_setup(console: Console, server_args: list[str]) -> dict[str, str]:
    """Fresh credentials for every role (`runtime.nats.auth.write_secure_dir`); the server is told to use
    them (`server_args`), this process becomes the host, and the workers' environment is returned."""
    from runtime.nats.auth import read_env_file, write_secure_dir

    folder = secure_dir()
    files = write_secure_dir(folder)
    server_args += ["-c", str(folder / "auth.conf")]
    os.environ.update(read_env_file(files["host"]))  # the in-process host (and its lease thread)
    console.print(f"[bold]secure[/]   credentials (0600) in {folder}: "
                  + ", ".join(f"{name} {path.name}" for name, path in files.items()), highlight=False)
    console.print(f"           use one with:  set -a; . {files['operator']}; set +a", highlight=False)
    return read_env_file(files["worker"])


def _start_local_model(console: Console) -> ServerProcess:
    """Start the embedded model server as a child process (first start converts the weights: minutes)."""
    from runtime.modelserver import start_model_server

    with console.status("starting the local model server (the first start converts the SmolLM2 weights; "
                        "this can take a few minutes)…"):
        return start_model_server(timeout=900.0)


# ---------------------------------------------------------------------------------------------------------
# sa host
# ---------------------------------------------------------------------------------------------------------


@app.command()
def host(
    bundles: Annotated[list[Path], typer.Argument(help="bundle.yaml files, bundle folders or folders of "
                                                       "them (default: bundles/demo)")] = [],  # noqa: B006
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
                                                         "(whole seconds; renewed every TTL/4 from a thread "
                                                         "of its own): a dead host's partitions are taken "
                                                         "over about TTL after it dies.")] = 2.0,
    max_runs: Annotated[int, typer.Option(min=1, help="Back-pressure: runs driven plus tasks waiting in "
                                                      "mailboxes; at the bound this host stops pulling "
                                                      "tasks.")] = 256,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)] = False,
    events_max_age: EventsMaxAge = None,
    events_max_bytes: EventsMaxBytes = None,
    payloads_max_age: PayloadsMaxAge = None,
    payloads_max_bytes: PayloadsMaxBytes = None,
    metrics_port: MetricsPortOption = None,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Run an agent host: every bundle is an agent at agents.<name>.tasks; unfinished runs are resumed.

    Start one or many, on any machine that reaches NATS: hosts share the task partitions by expiring
    leases (a fair share each), and take over the partitions, and unfinished runs, of a host that dies.
    Retention: EVENTS and the payload store keep 90 days by default, with no size bound (see the
    --events-*/--payloads-* options); `sa runs purge` deletes finished runs.
    """
    import anyio

    from runtime.host import HostConfig, serve
    from runtime.host.leases import LeaseConfig

    url = resolve_nats(nats_url, "host")
    retention = _retention(events_max_age, events_max_bytes, payloads_max_age, payloads_max_bytes)
    model_url = model_url or read_state().get("model_url")
    paths = bundle_paths(bundles)
    _setup_logging(verbose, log_format)
    agents = _load_agents(paths, model_url)
    metrics = _host_metrics(metrics_port)

    async def main() -> None:
        stop = anyio.Event()

        def ready(h: Any) -> None:
            if metrics is not None:
                metrics.watch_host(h)
            announce(f"sa host: serving {', '.join(sorted(agents))} on {_partitions(h)} as {h.id}; "
                     f"resumed {h.stats.runs_recovered} run(s)", log_format)
            _started()

        config = HostConfig(task_ack_wait=task_ack_wait, lease=LeaseConfig(ttl=lease_ttl), max_runs=max_runs)
        await _apply_retention(url, retention, partitions)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_signal, stop, verbose)
            if metrics is not None:
                tg.start_soon(_poll_queues, url, metrics, stop)
            stats = await serve(url, agents, stop=stop, on_ready=ready, config=config, partitions=partitions,
                                on_event=metrics.observe if metrics is not None else None)
            tg.cancel_scope.cancel()
        ended = ", ".join(f"{v} {k}" for k, v in sorted(stats.runs_ended.items())) or "none ended"
        announce(f"sa host: stopped ({stats.runs_started} run(s) started; {ended})", log_format)

    anyio.run(main, backend="asyncio")


# ---------------------------------------------------------------------------------------------------------
# sa worker
# ---------------------------------------------------------------------------------------------------------


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1,
                                             help="Jobs run at once by this process.")] = 8,
    tools: Annotated[list[str], typer.Option("--tools", "-t",
                                             help="Glob of .pym tool scripts to serve (repeatable).")] = [],  # noqa: B006
    bundle: Annotated[list[str], typer.Option("--bundle", "-b",
                                              help="bundle.yaml, its folder, or a folder of bundle "
                                                   "folders, whose tools to serve (repeatable).")] = [],  # noqa: B006
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                 help="NATS server URL(s), comma-separated.")] = None,
    ack_wait: Annotated[float, typer.Option(min=0.5, help="Seconds after its last heartbeat that a job a "
                                                          "dead worker held is delivered again (set on the "
                                                          "shared consumer; held jobs are heartbeated "
                                                          "every AckWait/4).")] = 3.0,
    externals: Annotated[str | None, typer.Option(
        "--externals", help="An ExternalsFactory `package.module:attr` giving the scripts' @external "
                            "functions (a bundle's own `externals:` comes first).")] = None,
    secrets: Annotated[Path | None, typer.Option(
        "--secrets", help="A file of NAME=value lines: secrets a bundle may grant to tools by name "
                          "(else they are read from the environment).")] = None,
    metrics_port: MetricsPortOption = None,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Run sandboxed tool jobs from the shared `workers` consumer until Ctrl-C / SIGTERM.

    Start as many as you like, on any machine that reaches NATS: jobs spread across them, and a job a
    killed worker held is redelivered to another one.
    """
    import logging

    import anyio

    from runtime.bundle import BundleError
    from runtime.cli.observe_cmds import json_logs
    from runtime.worker import build_registry, serve

    if not json_logs(log_format, logging.INFO):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not nats_url:
        typer.echo("sa worker: no NATS server; set NATS_URL or pass --nats nats://host:4222", err=True)
        raise typer.Exit(2)
    if not tools and not bundle:
        typer.echo("sa worker: nothing to serve; pass --tools 'agents/*.pym' and/or --bundle PATH", err=True)
        raise typer.Exit(2)
    try:
        registry = build_registry(bundles=expand_bundles([Path(b) for b in bundle]), tool_globs=tools)
    except (BundleError, FileNotFoundError, ValueError) as e:
        typer.echo(f"sa worker: {e}", err=True)
        raise typer.Exit(2) from None
    from runtime.externals import ExternalsError, Secrets, load_factory

    factory = None
    try:
        if externals is not None:
            factory = load_factory(externals, root=Path.cwd())
        secret_store = Secrets(secrets)
    except ExternalsError as e:
        typer.echo(f"sa worker: --externals: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        typer.echo(f"sa worker: --secrets: cannot read {secrets}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None

    metrics = None
    if metrics_port is not None:
        from runtime.observe.metrics import WorkerMetrics

        metrics = WorkerMetrics()
        start_metrics(metrics_port, metrics)

    async def main() -> None:
        stop = anyio.Event()

        def ready(w: object) -> None:
            if metrics is not None:
                metrics.watch_worker(w)
            names = ", ".join(sorted(registry.tools))
            announce(f"sa worker {getattr(w, 'name', '')}: serving {names} (concurrency {concurrency})",
                     log_format)

        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_signal, stop)
            if metrics is not None:
                tg.start_soon(_poll_queues, nats_url, metrics, stop)
            on_outcome = metrics.on_outcome if metrics is not None else None
            stats = await serve(nats_url, registry, concurrency=concurrency, stop=stop, on_ready=ready,
                                ack_wait=ack_wait, on_outcome=on_outcome, externals=factory,
                                secrets=secret_store)
            tg.cancel_scope.cancel()
        announce(f"sa worker: stopped after {stats.completed} job(s) ({stats.failed} failed)", log_format)

    anyio.run(main, backend="asyncio")


# ---------------------------------------------------------------------------------------------------------
# sa status
# ---------------------------------------------------------------------------------------------------------


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

    from runtime.client.status import render

    Console().print(render(report))


async def _status(url: str) -> dict[str, Any]:
    from runtime import nats as bus
    from runtime.client.status import gather

    nc = await bus.connect(url, name="sa-status", max_reconnect_attempts=3)
    try:
        return await gather(bus.jetstream_for(nc))
    finally:
        await bus.close(nc)


# ---------------------------------------------------------------------------------------------------------
# shared by the long-running processes
# ---------------------------------------------------------------------------------------------------------


def _retention(events_max_age: str | None, events_max_bytes: str | None, payloads_max_age: str | None,
               payloads_max_bytes: str | None) -> Any:
    """The bounds the options (or their environment variables) ask for; exit 2 on a bad value."""
    from runtime.nats.retention import Retention

    try:
        return Retention.parse(events_max_age=events_max_age, events_max_bytes=events_max_bytes,
                               payloads_max_age=payloads_max_age, payloads_max_bytes=payloads_max_bytes)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


async def _apply_retention(url: str, retention: Any, partitions: int) -> Any:
    """Create the topology if there is none, then put EVENTS and the payload store under `retention`."""
    from runtime import nats as bus
    from runtime.nats.retention import ensure_retention

    nc = await bus.connect(url, name="sa-retention")
    try:
        js = bus.jetstream_for(nc)
        await bus.attach_topology(js, partitions=partitions, retention=retention)
        return await ensure_retention(js, retention)
    finally:
        await bus.close(nc)


def _setup_logging(verbose: bool, log_format: LogFormat = LogFormat.text) -> None:
    """Warnings only until the host is ready (`_started`), so start-up is one line per process: a host
    takes its partitions one by one, and a log line each would bury the line that matters."""
    import logging

    from rich.logging import RichHandler

    from runtime.cli.observe_cmds import json_logs

    if json_logs(log_format, logging.INFO if verbose else logging.WARNING):
        _host_log(info=verbose)
        return

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s",
                        handlers=[RichHandler(show_path=False, rich_tracebacks=False)])
    _host_log(info=verbose)


def _host_metrics(port: int | None) -> Any:
    """A host's metrics, served on `port` (None: no metrics, and nothing added to the host's events)."""
    if port is None:
        return None
    from runtime.observe.metrics import HostMetrics

    metrics = HostMetrics()
    start_metrics(port, metrics)
    return metrics


async def _poll_queues(url: str, metrics: Any, stop: Any) -> None:
    """Queue depths and dead letters for the metrics, on a connection of its own (off the work's)."""
    from runtime import nats as bus

    nc = await bus.connect(url, name="sa-metrics")
    try:
        await metrics.queues.poll(bus.jetstream_for(nc), stop)
    finally:
        await bus.close(nc)


def _started() -> None:
    """The host is ready: from now on its partition changes (takeovers, hand-overs) are logged."""
    _host_log(info=True)


def _host_log(*, info: bool) -> None:
    import logging

    logging.getLogger("runtime.host").setLevel(logging.INFO if info else logging.WARNING)


def _partitions(h: Any) -> str:
    """What a ready host serves, in one phrase: "partitions 0-15 (16 of 16)"."""
    from runtime.client.status import partition_ranges

    return f"partitions {partition_ranges(h.partitions)} ({len(h.partitions)} of {h.total_partitions})"


def _load_agents(bundles: list[Path], model_url: str | None) -> Any:
    from runtime.bundle import BundleError
    from runtime.host import load_agents

    try:
        return load_agents(bundles, local_model_url=model_url)
    except (BundleError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


async def _until_signal(stop: Any, verbose: bool = True) -> None:
    """Set `stop` at SIGINT / SIGTERM. Unless `verbose`, a stopping host's hand-over of each partition is
    not logged: the process's own "stopped" line says it."""
    await until_signal(stop, lambda: _host_log(info=verbose))
