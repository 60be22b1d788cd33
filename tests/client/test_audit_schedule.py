"""The scheduled audit: a pass reads again only the runs that changed since one proved them whole, its
metrics hold a finding until the log is whole again, `sa audit --every` serves them, logs an error line per
finding and stops cleanly on SIGTERM, and the shipped alert rules ask only for metrics the code exposes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest
import yaml
from host_helpers import running_fleet, write_bundle

from runtime import nats as bus
from runtime.client.audit import FAULTS, Audit, Finding, Memo, RunAudit, audit, audit_every
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.subjects import EVENTS
from runtime.observe.metrics import AuditMetrics, metric_names

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"


async def record_runs(url: str, js, tmp_path: Path, n: int) -> list[str]:
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    async with running_fleet(url, js, write_bundle(tmp_path)) as env:
        runs = [await publish_task(js, "calc", f"compute: {i} * 5") for i in range(n)]
        for run in runs:
            await env.wait_run(run)
    return runs


@pytest.mark.anyio
async def test_a_scheduled_pass_reads_again_only_the_runs_that_changed(nats_server, js, tmp_path: Path):
    runs = await record_runs(nats_server.url, js, tmp_path, 3)
    memo = Memo()
    seen: list[tuple[str, int, int]] = []
    first = await audit(js, memo=memo, on_run=lambda r, done, total: seen.append((r.run_id, done, total)))
    assert ({r.run_id for r in first.runs}, first.unchanged, first.findings) == (set(runs), 0, [])
    assert [(done, total) for _, done, total in seen] == [(1, 3), (2, 3), (3, 3)]  # a long pass's progress
    assert {run for run, _, _ in seen} == set(runs)
    log = RunLog(js)
    assert memo.whole == {("calc", run): len(await log.stored(run)) for run in runs}  # every run ended whole

    second = await audit(js, memo=memo)
    assert (second.runs, second.unchanged) == ([], 3)  # nothing read again

    lost = (await log.stored(runs[1]))[1]  # storage loses one message of an ended run proved whole
    await js.delete_msg(EVENTS, lost.stream_seq)
    third = await audit(js, memo=memo)
    assert ([r.run_id for r in third.runs], third.unchanged) == ([runs[1]], 2)
    assert [f.fault for f in third.runs[0].findings] == ["gap"]
    assert ("calc", runs[1]) not in memo.whole  # broken: read again on every pass until restored
    fourth = await audit(js, memo=memo)
    assert [r.run_id for r in fourth.runs] == [runs[1]] and fourth.findings


@pytest.mark.anyio
async def test_audit_every_passes_until_stopped_and_rereads_everything_every_nth_pass(nats_server, js,
                                                                                       tmp_path: Path):
    runs = await record_runs(nats_server.url, js, tmp_path, 2)
    reports: list[Audit] = []
    stop = anyio.Event()

    def on_report(report: Audit) -> None:
        reports.append(report)
        if len(reports) == 4:
            stop.set()

    passes = await audit_every(js, 0.01, stop, on_report=on_report, on_error=pytest.fail, full_every=2)
    assert passes == 4
    assert [(len(r.runs), r.unchanged) for r in reports] == [(2, 0), (0, 2), (2, 0), (0, 2)]
    assert all(not r.findings for r in reports) and {r.run_id for r in reports[0].runs} == set(runs)


def test_the_audit_metrics_hold_a_finding_until_a_pass_finds_the_log_whole():
    metrics = AuditMetrics()
    value = metrics.registry.get_sample_value
    assert [value("sa_audit_findings", {"fault": f}) for f in FAULTS] == [0.0] * len(FAULTS)
    broken = RunAudit("r-1", "calc", 5, [Finding("gap", "seq 2 missing", 9), Finding("gap", "seq 4", 11)])
    metrics.record(Audit(runs=[broken, RunAudit("r-2", "calc", 7)], unchanged=3), 1.5, 1_000.0)
    assert value("sa_audit_findings", {"fault": "gap"}) == 2.0
    assert (value("sa_audit_runs_checked"), value("sa_audit_runs_broken")) == (5.0, 1.0)
    assert value("sa_audit_last_run_timestamp_seconds") == 1_000.0
    assert value("sa_audit_duration_seconds") == 1.5
    metrics.record(Audit(runs=[RunAudit("r-1", "calc", 6)], unchanged=4), 0.5, 2_000.0)  # restored
    assert value("sa_audit_findings", {"fault": "gap"}) == 0.0 and value("sa_audit_runs_broken") == 0.0


def test_the_alert_rules_ask_only_for_metrics_the_code_exposes():
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {"SaAuditFindings", "SaAuditStale"}
    used = {re.sub(r"_(total|bucket|sum|count)$", "", n) for r in rules for n in re.findall(r"\bsa_[a-z_]+",
                                                                                          r["expr"])}
    assert "sa_audit_findings" in used and used <= metric_names(), used - metric_names()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("sa_audit")}


@pytest.mark.anyio
async def test_sa_audit_every_serves_metrics_logs_each_finding_and_stops_on_sigterm(nats_server, js,
                                                                                    tmp_path: Path):
    runs = await record_runs(nats_server.url, js, tmp_path, 2)
    lost = (await RunLog(js).stored(runs[0]))[1]  # model.requested, alone in its message
    await js.delete_msg(EVENTS, lost.stream_seq)
    port = free_port()
    env = {**os.environ, "NATS_URL": nats_server.url, "XDG_DATA_HOME": "/nonexistent-sa"}
    proc = subprocess.Popen([sys.executable, "-c", "from runtime.cli import main; main()", "audit", "--every",
                             "0.2s", "--metrics-port", str(port), "--log-format", "json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with anyio.fail_after(60):
            while True:
                try:
                    metrics = scrape(port)
                except OSError:
                    metrics = {}
                if metrics.get("sa_audit_last_run_timestamp_seconds", 0.0) > 0:
                    break
                await anyio.sleep(0.1)
        assert metrics['sa_audit_findings{fault="gap"}'] == 1.0
        assert metrics["sa_audit_runs_broken"] == 1.0 and metrics["sa_audit_runs_checked"] == 2.0
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    errors = [line for line in lines if line["level"] == "ERROR"]
    assert errors and all((e["run_id"], e["agent"], e["fault"]) == (runs[0], "calc", "gap") for e in errors)
    assert "gap at stream seq" in errors[0]["message"] and "seq 1 missing" in errors[0]["message"]
    assert any("sa audit: stopped after" in line["message"] for line in lines)


@pytest.mark.anyio
async def test_the_operator_role_may_run_the_audit(secured):
    """The shipped `sa-audit` Deployment connects as operator: every read an audit pass makes is one that role
    may make (a refusal would end each pass in `on_error`, and the alert would say the audit is stale)."""
    from nats_fixtures import PASSWORDS

    from runtime import events as ev
    from runtime.nats.credentials import Credentials

    def creds(role: str) -> dict:
        return Credentials(user=role, password=PASSWORDS[role]).connect_options()

    admin = await bus.connect(secured.url, name="test-admin", **creds("admin"))
    refusals: list[str] = []

    async def on_error(err: Exception) -> None:
        refusals.append(str(err))

    operator = await bus.connect(secured.url, name="test-operator", error_cb=on_error,
                                 max_reconnect_attempts=2, **creds("operator"))
    try:
        js = bus.jetstream_for(admin)
        await bus.ensure_topology(js, partitions=1)
        events = [ev.RunStarted(run_id="r-op", actor="calc", input="x"),
                  ev.RunCompleted(run_id="r-op", output=1)]
        await RunLog(js).write_run([ev.stamp(e, seq=i, actor="calc") for i, e in enumerate(events)])
        report = await audit(bus.jetstream_for(operator), memo=Memo())
        assert ([(r.run_id, r.whole) for r in report.runs], refusals) == ([("r-op", True)], [])
    finally:
        await operator.close()
        await admin.close()
