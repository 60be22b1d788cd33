"""`sa audit`: re-read every run's log (or one agent's, or one run's) and prove it whole.

    sa audit                      every run in EVENTS and in the runs index
    sa audit --agent calc         the runs of one agent (bundle or bundle:instance)
    sa audit RUN                  one run
    sa audit --json               the findings as JSON (for a scheduled job and an alert)

What is checked: `runtime.client.audit` (gaps and forks in a run's seq, events that do not decode or do
not re-fold, tool outcomes for calls no earlier event named, runs the index lists with no log). Exit codes:
0 every log audited is whole; 1 a finding (each printed with its run and the stream sequence where it is);
2 bad usage (no server).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.app import app
from runtime.cli.connect import with_client
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, shown

if TYPE_CHECKING:
    from runtime.client import Client


@app.command()
def audit(
    run: Annotated[str | None, typer.Argument(help="Only this run.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs (bundle or "
                                                              "bundle:instance).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Prove every run's log whole: no gap or fork in its events, each decodes and re-folds, each tool
    outcome answers a call; exit 1 on any finding."""
    url = resolve_nats(nats_url, "audit")
    raise typer.Exit(with_client(url, "audit", lambda c: _audit(c, run, agent, as_json)))


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


__all__ = ["audit"]
