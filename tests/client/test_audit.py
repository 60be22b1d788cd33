"""`sa audit` on a real nats-server: runs driven by a real host and worker are whole; then storage loses or
changes what it had acknowledged (a message purged from EVENTS by its sequence, a message that is not an
event, an outcome for a call nobody made, an index entry whose log is gone) and the audit names each run
and each fault, and exits 1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from host_helpers import running_fleet, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.client.audit import audit
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import EVENTS, event_subject

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


async def sa(url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "NATS_URL": url, "XDG_DATA_HOME": "/nonexistent-sa", "COLUMNS": "300"}
    proc = await anyio.run_process([*CLI, *args], env=env, check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_sa_audit_names_each_run_and_fault_storage_left(nats_server, js, tmp_path: Path):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path)) as env:
        runs = [await publish_task(js, "calc", f"compute: {i} * 7") for i in range(4)]
        for run in runs:
            await env.wait_run(run)
    code, out, err = await sa(nats_server.url, "audit", "--json")
    assert code == 0, err
    assert json.loads(out) == {"runs": 4, "whole": 4, "findings": []}

    log = RunLog(js)
    gap, garbage, forged, purged = runs
    lost = (await log.stored(gap))[1]  # its second message (model.requested alone), purged by stream sequence
    await js.delete_msg(EVENTS, lost.stream_seq)
    await js.publish(event_subject("calc", garbage, "tool.completed"), b"\x93not an event")
    history = await log.read(forged)
    outcome = ev.stamp(ev.ToolCompleted(run_id=forged, call_id=f"{forged}/9.0", tool="calculator", output=1),
                       seq=len(history.events), actor="calc")
    await log.append(outcome, expect=history.last_seq)
    for message in await log.stored(purged):
        await js.delete_msg(EVENTS, message.stream_seq)
    ghost = RunIndex(status="completed", actor="calc", partition=0)
    await (await runs_kv(js)).put("r-ghost", ghost.encode())

    report = await audit(js)
    faults = {r.run_id: sorted({f.fault for f in r.findings}) for r in report.runs}
    assert faults == {gap: ["gap"], garbage: ["decode"], forged: ["outcome"], purged: ["no_log"],
                      "r-ghost": ["no_log"]}
    (missing,) = next(r for r in report.runs if r.run_id == gap).findings
    assert missing.detail.startswith("seq 1 missing before") and missing.stream_seq is not None
    assert (await audit(js, run_id=forged)).runs[0].findings[0].detail.startswith(
        f"tool.completed for call {forged}/9.0, which no earlier event named")
    assert {r.run_id for r in (await audit(js, actor="calc")).runs} == set(faults)

    code, out, err = await sa(nats_server.url, "audit")
    assert code == 1, err
    assert gap in out and "gap" in out and garbage in out and "decode" in out and "r-ghost" in out
    assert "5 run(s) audited: 5 with 5 finding(s)" in " ".join(out.split())
    code, out, _ = await sa(nats_server.url, "audit", gap, "--json")
    assert code == 1 and [f["fault"] for f in json.loads(out)["findings"]] == ["gap"]


async def test_a_log_that_lost_its_last_events_is_found_by_the_runs_index(nats_server, js, tmp_path: Path):
    """Losing a run's last events leaves no gap in its seqs: the log just ends early, and folds to a run still
    waiting for a tool outcome. The runs index, written by the host after the events it folded were stored,
    says how far the log reached: the audit names the lost tail."""
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path)) as env:
        runs = [await publish_task(js, "calc", f"compute: {i} + 1") for i in range(2)]
        for run in runs:
            await env.wait_run(run)
    log = RunLog(js)
    cut, whole = runs
    written = (await log.read(cut)).events
    for message in (await log.stored(cut))[-2:]:  # its last two messages, run.completed among them
        await js.delete_msg(EVENTS, message.stream_seq)
    left = (await log.read(cut)).events
    assert 0 < len(left) < len(written) - 1 and left == written[:len(left)]
    report = await audit(js)
    findings = {r.run_id: [(f.fault, f.detail) for f in r.findings] for r in report.runs}
    end, last = left[-1], len(written) - 1
    said = (f"the log ends at seq {end.seq} ({ev.kind_of(end)}), but the runs index says it reached seq "
            f"{last} (completed): seq {end.seq + 1} to {last} lost")
    assert findings == {whole: [], cut: [("tail", said)]}
    code, out, _ = await sa(nats_server.url, "audit", "--json")
    assert code == 1 and [f["fault"] for f in json.loads(out)["findings"]] == ["tail"]
