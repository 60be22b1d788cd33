"""`sa audit`: re-read every run's log (or one agent's, or one run's) and prove it whole.

    sa audit                      every run in EVENTS and in the runs index
    sa audit --agent calc         the runs of one agent (bundle or bundle:instance)
    sa audit RUN                  one run
    sa audit --json               the findings as JSON (for a cron job and an alert)
    sa audit --every 1h --metrics-port 9464 [--log-format json]
                                  a pass every hour until SIGTERM: metrics, an error log line per finding

What is checked: `runtime.client.audit` (gaps and forks in a run's seq, events that do not decode or do
not re-fold, tool outcomes for calls no earlier event named, runs the index lists with no log). Exit codes:
0 every log audited is whole (with `--every`: stopped by a signal); 1 a finding (each printed with its run and
the stream sequence where it is); 2 bad usage (no server, a bad duration or port).

With `--every` the command is a long-running process like `sa otel`: each pass's findings are log lines at
error level (run id, agent and fault as fields with `--log-format json`), its totals one line at info level,
a long pass's progress a line every `PROGRESS_EVERY` runs, and `--metrics-port` serves
`runtime.observe.metrics.AuditMetrics`, which `deploy/prometheus/alerts.yaml` alerts on.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.observe_cmds import LogFormatOption, MetricsAddrOption, MetricsPortOption, json_logs
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, shown
from runtime.observe.logs import LogFormat

if TYPE_CHECKING:
    from runtime.client import Client
    from runtime.client.audit import Audit, RunAudit

PROGRESS_EVERY = 1000  # a scheduled pass logs how far it is every this many runs

logger = logging.getLogger("runtime.client.audit")


@app.command()
def audit(
    run: Annotated[str | None, typer.Argument(help="Only this run.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs (bundle or "
                                                              "bundle:instance).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    every: Annotated[str | None, typer.Option(
        "--every", show_default=False,
        help="Audit again every DURATION ('1h', '15m') until SIGTERM, with metrics (--metrics-port) and an "
             "error log line per finding; ended runs proved whole and unchanged are not read again "
             "except on every --full-every-th pass [default: one pass, then exit].")] = None,
    full_every: Annotated[int, typer.Option(
        "--full-every", min=1, help="With --every: read every log again on every Nth pass.")] = 24,
    metrics_port: MetricsPortOption = None,
    metrics_addr: MetricsAddrOption = "127.0.0.1",
    log_format: LogFormatOption = LogFormat.text,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Prove every run's log whole: no gap or fork in its events, each decodes and re-folds, each tool
    outcome answers a call; exit 1 on any finding (or, with --every, keep auditing on a schedule)."""
    url = resolve_nats(nats_url, "audit")
    if every is None:
        if metrics_port is not None:
            typer.echo("error: --metrics-port serves a scheduled audit's metrics: add --every 1h", err=True)
            raise typer.Exit(2)
        raise typer.Exit(with_client(url, "audit", lambda c: _audit(c, run, agent, as_json)))
    from runtime.nats.retention import parse_age

    try:
        period = parse_age(every, field="--every")
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if period <= 0 or run is not None or as_json:
        typer.echo("error: --every audits every run (or --agent's) on a schedule, with a period above 0; "
                   "it takes no RUN and no --json (its findings are log lines and metrics)", err=True)
        raise typer.Exit(2)
    _scheduled(url, agent, period, full_every, metrics_port, metrics_addr, log_format)


async def _audit(client: Client, run: str | None, agent: str | None, as_json: bool) -> int:
    from rich.table import Table

    from runtime.client.audit import audit as audit_runs

    report = await audit_runs(client.js, actor=agent, run_id=run, log=client.log)
    findings = report.findings
    if as_json:
        print(json.dumps({"runs": len(report.runs), "whole": sum(r.whole for r in report.runs),
                          "findings": [{"run_id": r.run_id, "actor": r.actor, "fault": f.fault,
                                        "detail": f.detail, "stream_seq": f.stream_seq}
                                       for r, f in findings]}, indent=2))
        return 1 if findings else 0
    if not findings:
        console().print(f"{len(report.runs)} run(s) audited: every log is whole")
        return 0
    table = Table(header_style="bold")
    for column in ("run", "agent", "fault", "stream seq", "detail"):
        table.add_column(column)
    for r, f in findings:
        table.add_row(*(shown(c) for c in (r.run_id, r.actor, f.fault,
                                           f.stream_seq if f.stream_seq is not None else "", f.detail)))
    console().print(table)
    broken = sum(not r.whole for r in report.runs)
    console().print(f"{len(report.runs)} run(s) audited: {broken} with {len(findings)} finding(s)")
    return 1


def _scheduled(url: str, agent: str | None, period: float, full_every: int, metrics_port: int | None,
               metrics_addr: str, log_format: LogFormat) -> None:
    """`sa audit --every`: passes until SIGINT / SIGTERM, then exit 0."""
    import anyio

    from runtime.cli.observe_cmds import announce, start_metrics
    from runtime.observe.metrics import AuditMetrics

    if not json_logs(log_format, logging.INFO):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = AuditMetrics()
    start_metrics(metrics_port, metrics, metrics_addr)

    async def main() -> int:
        from runtime.cli.signals import until_signal
        from runtime.client import Client
        from runtime.client.audit import audit_every, log_findings

        client = await Client.connect(url, name="sa-audit")
        started = time.monotonic()

        def on_run(_r: RunAudit, done: int, total: int) -> None:
            if done % PROGRESS_EVERY == 0:
                logger.info("audit pass: %d of %d run(s) read", done, total)

        def on_report(report: Audit) -> None:
            nonlocal started
            seconds = time.monotonic() - started
            log_findings(report)
            metrics.record(report, seconds, time.time())
            broken = sum(not r.whole for r in report.runs)
            logger.info("audit pass: %d run(s) read, %d ended and unchanged, %d with %d finding(s) (%.1f s)",
                        len(report.runs), report.unchanged, broken, len(report.findings), seconds)

        def on_error(e: Exception) -> None:
            metrics.errors.inc()
            logger.error("audit pass could not finish: %s: %s", type(e).__name__, e)

        def on_pass() -> None:
            nonlocal started
            started = time.monotonic()

        stop = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_signal, stop)
                logger.info("sa audit: a pass every %s s until SIGTERM", period)
                passes = await audit_every(client.js, period, stop, on_report=on_report, on_error=on_error,
                                           on_pass=on_pass, actor=agent, log=client.log, on_run=on_run,
                                           full_every=full_every)
                tg.cancel_scope.cancel()
        finally:
            await client.close()
        return passes

    passes = anyio.run(main, backend="asyncio")
    announce(f"sa audit: stopped after {passes} pass(es)", log_format)


__all__ = ["PROGRESS_EVERY", "audit"]
