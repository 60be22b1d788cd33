"""`sa otel`: export every run's trace to an OpenTelemetry collector, and the options every long-running
command shares for observation (`--metrics-port`, `--log-format`).

    sa otel --endpoint http://otel-collector:4318 [--durable sa-otel] [--log-format json]

Start one or several (they share the durable consumer): see `runtime.observe.exporter`. Exit codes: 0
stopped by a signal; 2 bad usage (no NATS server, an endpoint that is not an http(s) URL).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.where import resolve_nats
from runtime.observe.logs import LogFormat

LogFormatOption = Annotated[LogFormat, typer.Option(
    "--log-format", case_sensitive=False,
    help="text: readable lines; json: one JSON object per line, with run_id, agent, seq and call_id as "
         "fields where known.")]
MetricsPortOption = Annotated[int | None, typer.Option(
    "--metrics-port", min=0, max=65535, show_default=False,
    help="Serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR: --metrics-addr) [default: no "
         "metrics].")]
MetricsAddrOption = Annotated[str, typer.Option(
    "--metrics-addr", help="The address the metrics listen on: loopback by default; 0.0.0.0 in a container "
                           "whose port a Prometheus on another machine scrapes.")]


def announce(text: str, log_format: LogFormat) -> None:
    """A process's start and stop line: plain on stderr, or a JSON log record when logs are JSON (so a log
    shipper reading stderr sees nothing but JSON)."""
    if log_format is LogFormat.json:
        cli_log = logging.getLogger("runtime.cli")
        cli_log.setLevel(logging.INFO)
        cli_log.info(text)
    else:
        typer.echo(text, err=True)


def json_logs(log_format: LogFormat, level: int) -> bool:
    """Set up JSON logging when asked; True if it was (the caller sets up its text logs otherwise)."""
    if log_format is not LogFormat.json:
        return False
    from runtime.observe.logs import setup_json_logging

    setup_json_logging(level)
    return True


@app.command()
def otel(
    endpoint: Annotated[str, typer.Option(help="The collector's OTLP/HTTP address, e.g. "
                                               "http://otel-collector:4318 (/v1/traces is added unless "
                                               "the URL ends with it).")],
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                 help="NATS server URL(s), comma-separated.")] = None,
    durable: Annotated[str, typer.Option(
        help="The durable consumer on EVENTS: exporters with the same name share the work and resume where "
             "it stopped.")] = "sa-otel",
    batch: Annotated[int, typer.Option(min=1, help="Events per fetch; their spans are exported in one "
                                                   "request, then the events acked.")] = 256,
    ack_wait: Annotated[float, typer.Option(min=0.5, help="Seconds before events an exporter fetched and "
                                                          "did not ack (it died) go to another.")] = 30.0,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Export every run's trace (run, turns, model calls, tool calls, script runs) over OTLP/HTTP.

    Reads the EVENTS stream with its own durable consumer, so it costs the hosts nothing; a span is
    sent when its end event arrives, with ids derived from the run and the event seqs, so a restart
    sends nothing a collector cannot de-duplicate.
    """
    import anyio

    from runtime.observe.exporter import DEFAULT_DURABLE, TraceExporter, otlp_exporter

    url = resolve_nats(nats_url, "otel")
    if not json_logs(log_format, logging.INFO):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        sink = otlp_exporter(endpoint)
    except ValueError as e:
        typer.echo(f"sa otel: {e}", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        from runtime import nats as bus
        from runtime.cli.signals import until_signal

        nc = await bus.connect(url, name="sa-otel")
        exporter = TraceExporter(bus.jetstream_for(nc), sink, durable=durable or DEFAULT_DURABLE, batch=batch,
                                 ack_wait=ack_wait)
        stop = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_signal, stop)

                async def ready() -> None:
                    await exporter.ready.wait()
                    logging.getLogger("runtime.observe").info(
                        "sa otel: exporting traces to %s (durable %s)", endpoint, durable)

                tg.start_soon(ready)
                await exporter.run(stop)
                tg.cancel_scope.cancel()
        finally:
            await bus.close(nc)
            exporter.shutdown()
        s = exporter.stats
        announce(f"sa otel: stopped ({s.spans} span(s) from {s.events} event(s))", log_format)

    anyio.run(main, backend="asyncio")


def start_metrics(port: int | None, metrics: Any, addr: str = "127.0.0.1") -> None:
    """Serve `metrics.registry` on `addr`:`port` (nothing when `port` is None); exit 2 if it cannot be
    bound."""
    if port is None:
        return
    from runtime.observe.metrics import serve_metrics

    try:
        serve_metrics(port, metrics.registry, addr)
    except OSError as e:
        typer.echo(f"error: --metrics-port {port} --metrics-addr {addr}: {e} (pick a free port, or an "
                   "address of this machine)", err=True)
        raise typer.Exit(2) from None
