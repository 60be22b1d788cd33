"""The fleet's processes and what they are doing: `sa host`, `sa worker`, `sa status` (`sa up`: `up_cmds`).

    sa host [BUNDLES...]                  an agent host on an existing NATS
    sa worker [--tools GLOB] [--bundle B] a tool worker on an existing NATS
              [--externals MOD:FACTORY]  the host functions of the scripts' @externals
              [--secrets FILE]           NAME=value secrets a bundle may grant to tools
    sa status [--json]                    hosts and their partitions, workers, queue depths, runs in flight

Finding the server and the bundles (a bundle folder, its bundle.yaml, or a folder of bundle folders):
`runtime.cli.where`; what the long-running processes share: `runtime.cli.serving`. Start-up prints one line
per process; a host's per-partition log lines start once it is ready (all of them with --verbose). Exit
codes: 0 success; 2 bad usage (no server, invalid bundle) or, for `sa status`, nothing to read (no streams
yet, NATS unreachable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli import serving
from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.observe_cmds import (
    LogFormatOption,
    MetricsAddrOption,
    MetricsPortOption,
    announce,
    start_metrics,
)
from runtime.cli.serving import VERBOSE_HELP, EventsMaxAge, EventsMaxBytes, PayloadsMaxAge, PayloadsMaxBytes
from runtime.cli.where import bundle_paths, expand_bundles, resolve_nats
from runtime.client.terminal import console
from runtime.observe.logs import LogFormat
from runtime.running import read_state

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
    regress_slots: Annotated[int, typer.Option(min=0, help="Runs of regressions (`sa regress`) this host "
                                                           "drives at once, below its production runs; 0: "
                                                           "none.")] = 2,
    orphan_check: Annotated[float, typer.Option(min=0, help="Seconds between this host's looks for runs of "
                                                            "its partitions that nothing drives (one a "
                                                            "takeover missed is driven after two looks); 0: "
                                                            "never look.")] = 15.0,
    require_sync: Annotated[bool, typer.Option(
        "--require-sync", envvar="SA_REQUIRE_SYNC",
        help="Refuse to serve unless every NATS server asked (its monitoring /varz: SA_NATS_MONITOR, else "
             "port 8222 of each server) syncs each write to disk before acknowledging it "
             "(sync_interval: always).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)] = False,
    events_max_age: EventsMaxAge = None,
    events_max_bytes: EventsMaxBytes = None,
    payloads_max_age: PayloadsMaxAge = None,
    payloads_max_bytes: PayloadsMaxBytes = None,
    metrics_port: MetricsPortOption = None,
    metrics_addr: MetricsAddrOption = "127.0.0.1",
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
    bounds = serving.retention(events_max_age, events_max_bytes, payloads_max_age, payloads_max_bytes)
    model_url = model_url or read_state().get("model_url")
    paths = bundle_paths(bundles)
    serving.setup_logging(verbose, log_format)
    agents = serving.load_agents(paths, model_url)
    metrics = serving.host_metrics(metrics_port, metrics_addr)

    async def main() -> None:
        stop = anyio.Event()

        def ready(h: Any) -> None:
            if metrics is not None:
                metrics.watch_host(h)
            announce(f"sa host: serving {', '.join(sorted(agents))} on {serving.served_partitions(h)} as "
                     f"{h.id}; resumed {h.stats.runs_recovered} run(s)", log_format)
            serving.started()

        config = HostConfig(task_ack_wait=task_ack_wait, lease=LeaseConfig(ttl=lease_ttl), max_runs=max_runs,
                            orphan_check=orphan_check or None, require_sync=require_sync,
                            regress_slots=regress_slots)
        await serving.apply_retention(url, bounds, partitions)
        async with anyio.create_task_group() as tg:
            tg.start_soon(serving.stop_on_signal, stop, verbose)
            if metrics is not None:
                tg.start_soon(serving.poll_queues, url, metrics, stop)
            stats = await serve(url, agents, stop=stop, on_ready=ready, config=config, partitions=partitions,
                                on_event=metrics.observe if metrics is not None else None)
            tg.cancel_scope.cancel()
        ended = ", ".join(f"{v} {k}" for k, v in sorted(stats.runs_ended.items())) or "none ended"
        announce(f"sa host: stopped ({stats.runs_started} run(s) started; {ended})", log_format)

    serving.run_refusing_unsynced(main)


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
    metrics_addr: MetricsAddrOption = "127.0.0.1",
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
    url = resolve_nats(nats_url, "worker")
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
        start_metrics(metrics_port, metrics, metrics_addr)

    async def main() -> None:
        stop = anyio.Event()

        def ready(w: object) -> None:
            if metrics is not None:
                metrics.watch_worker(w)
            names = ", ".join(sorted(registry.tools))
            announce(f"sa worker {getattr(w, 'name', '')}: serving {names} (concurrency {concurrency})",
                     log_format)

        async with anyio.create_task_group() as tg:
            tg.start_soon(serving.stop_on_signal, stop)
            if metrics is not None:
                tg.start_soon(serving.poll_queues, url, metrics, stop)
            on_outcome = metrics.on_outcome if metrics is not None else None
            stats = await serve(url, registry, concurrency=concurrency, stop=stop, on_ready=ready,
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
    from nats.js.errors import NotFoundError

    from runtime.client.status import render

    url = resolve_nats(nats_url, "status")
    try:
        report = with_client(url, "status", lambda c: c.status())
    except NotFoundError:  # the server answers, but no host has made the topology
        typer.echo(f"sa status: no structured-agents streams on {url}: start a host (`sa host BUNDLE` or "
                   "`sa up`)", err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # NATS unreachable, or it refused these credentials
        typer.echo(f"sa status: cannot read the fleet on {url}: {type(e).__name__}: {e} (is NATS running? "
                   "`sa up` starts one)", err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console().print(render(report))


__all__ = ["host", "status", "worker"]
