"""What the long-running processes share (`sa up` in `up_cmds`, `sa host` and `sa worker` in `fleet_cmds`):
the retention options, start-up logging, a host's metrics and the queue poller that feeds them, loading
the agents, what a ready host serves in one phrase, and stopping on a signal.

Why a module of its own: `sa up` is a host plus everything around it, so it serves agents the way `sa host`
does; one copy of each of these keeps the two from drifting (a retention default, a log line) while each
command keeps only what it alone does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.observe_cmds import start_metrics
from runtime.cli.signals import until_signal
from runtime.observe.logs import LogFormat

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


def retention(events_max_age: str | None, events_max_bytes: str | None, payloads_max_age: str | None,
              payloads_max_bytes: str | None) -> Any:
    """The bounds the options (or their environment variables) ask for; exit 2 on a bad value."""
    from runtime.nats.retention import Retention

    try:
        return Retention.parse(events_max_age=events_max_age, events_max_bytes=events_max_bytes,
                               payloads_max_age=payloads_max_age, payloads_max_bytes=payloads_max_bytes)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


async def apply_retention(url: str, bounds: Any, partitions: int) -> Any:
    """Create the topology if there is none, then put EVENTS and the payload store under `bounds`."""
    from runtime import nats as bus
    from runtime.nats.retention import ensure_retention

    nc = await bus.connect(url, name="sa-retention")
    try:
        js = bus.jetstream_for(nc)
        await bus.attach_topology(js, partitions=partitions, retention=bounds)
        return await ensure_retention(js, bounds)
    finally:
        await bus.close(nc)


def setup_logging(verbose: bool, log_format: LogFormat = LogFormat.text) -> None:
    """Warnings only until the host is ready (`started`), so start-up is one line per process: a host
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


def host_metrics(port: int | None, addr: str = "127.0.0.1") -> Any:
    """A host's metrics, served on `addr`:`port` (`port` None: no metrics, and nothing added to the host's
    events)."""
    if port is None:
        return None
    from runtime.observe.metrics import HostMetrics

    metrics = HostMetrics()
    start_metrics(port, metrics, addr)
    return metrics


async def poll_queues(url: str, metrics: Any, stop: Any) -> None:
    """Queue depths and dead letters for the metrics, on a connection of its own (off the work's)."""
    from runtime import nats as bus

    nc = await bus.connect(url, name="sa-metrics")
    try:
        await metrics.queues.poll(bus.jetstream_for(nc), stop)
    finally:
        await bus.close(nc)


def started() -> None:
    """The host is ready: from now on its partition changes (takeovers, hand-overs) are logged."""
    _host_log(info=True)


def _host_log(*, info: bool) -> None:
    import logging

    logging.getLogger("runtime.host").setLevel(logging.INFO if info else logging.WARNING)


def served_partitions(h: Any) -> str:
    """What a ready host serves, in one phrase: "partitions 0-15 (16 of 16)"."""
    from runtime.client.status import partition_ranges

    return f"partitions {partition_ranges(h.partitions)} ({len(h.partitions)} of {h.total_partitions})"


def load_agents(bundles: list[Path], model_url: str | None) -> Any:
    """The agents of `bundles` as a host serves them; exit 2 saying why one cannot be loaded."""
    from runtime.bundle import BundleError
    from runtime.host import load_agents as load

    try:
        return load(bundles, local_model_url=model_url)
    except (BundleError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def run_refusing_unsynced(main: Any) -> None:
    """`anyio.run(main)`; a host that refused storage not proven synced (`SA_REQUIRE_SYNC`) exits 1 with
    the reason, not a traceback."""
    import anyio

    from runtime.nats.durability import UnsyncedStorage

    try:
        anyio.run(main, backend="asyncio")
    except* UnsyncedStorage as group:
        refused: BaseException = group
        while isinstance(refused, BaseExceptionGroup):  # nested task groups nest their groups
            refused = refused.exceptions[0]
        typer.echo(f"error: {refused}", err=True)
        raise typer.Exit(1) from None


async def stop_on_signal(stop: Any, verbose: bool = True) -> None:
    """Set `stop` at SIGINT / SIGTERM. Unless `verbose`, a stopping host's hand-over of each partition is
    not logged: the process's own "stopped" line says it."""
    await until_signal(stop, lambda: _host_log(info=verbose))


__all__ = ["VERBOSE_HELP", "EventsMaxAge", "EventsMaxBytes", "PayloadsMaxAge", "PayloadsMaxBytes",
           "apply_retention", "host_metrics", "load_agents", "poll_queues", "retention", "served_partitions",
           "setup_logging", "started", "stop_on_signal"]
