"""What a partition phase whose runs do not end prints beside the stuck runs' last events
(`testbed.netfaults.stuck_report`): the log lines of every process naming each stuck run, and where
the work queues stand. It is the only evidence a CI machine leaves, so it is checked here on a real server,
with a job left in TOOLS and held by nobody."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.nats.subjects import TOOLS, WORKERS_CONSUMER
from runtime.nats.topology import ensure_topology
from testbed.netfaults import stuck_report

pytestmark = pytest.mark.anyio


@dataclass
class _Proc:
    name: str
    log: Path


@dataclass
class _Bed:
    js: Any
    hosts: list[_Proc]
    workers: list[_Proc]


async def test_a_stuck_runs_report_names_its_log_lines_and_the_queues(js, tmp_path):
    await ensure_topology(js, partitions=2)
    await js.publish("tools.step", b"{}")  # a job nobody pulls
    (tmp_path / "h0.log").write_text(
        "[00:00:58] WARNING  runtime.host: run r00000000000000aa: publishing job r00000000000000aa/1.0 failed"
        "                              \n"
        "[00:00:58] WARNING  runtime.host: run r00000000000000bb: something else\n"
        "[00:01:00] WARNING  runtime.host: partition 4 of net not renewed for 1.5 s: fenced\n")
    (tmp_path / "w0.log").write_text("serving step\n")
    bed = _Bed(js, [_Proc("h0", tmp_path / "h0.log")], [_Proc("w0", tmp_path / "w0.log"),
                                                          _Proc("w1", tmp_path / "missing.log")])
    failure = ("1 run(s) not ended after 180.0 s:\n"
               "r00000000000000aa: ['run.started', 'model.requested', 'model.responded', 'tool.called']")
    report = await stuck_report(bed, failure)  # type: ignore[arg-type]
    lines = report.splitlines()
    assert lines[:2] == ["-- h0 on r00000000000000aa:",
                         "[00:00:58] WARNING  runtime.host: run r00000000000000aa: publishing job "
                         "r00000000000000aa/1.0 failed"]  # its line only, trailing padding gone
    assert "r00000000000000bb" not in report and "w0 on" not in report  # no other run, no silent process
    assert f"-- {TOOLS}: 1 message(s), first seq 1, last 1" in lines
    assert "-- RESULTS: 0 message(s), first seq 0, last 0" in lines
    assert any(line.strip().startswith(f"{WORKERS_CONSUMER}: pending 1, ack pending 0") for line in lines)


async def test_waiting_for_runs_to_end_outlasts_a_cluster_that_does_not_answer_yet(js, monkeypatch):
    """Right after a fault heals the cluster may leave requests unanswered for seconds (the `runs` bucket's
    stream info timed out on CI after an EVENTS-leader cut): the wait opens the bucket again, as it reads
    it again, instead of failing the phase for something that is no anomaly of the runtime."""
    import nats.errors

    from runtime.nats.kv import runs_kv
    from runtime.nats.records import RunIndex
    from testbed import netfaults

    bucket = await runs_kv(js)
    for run_id in ("r1", "r2"):
        await bucket.put(run_id, RunIndex(status="completed", actor="net:a", partition=0).encode())
    tries: list[int] = []

    async def unanswered_twice(js_: Any) -> Any:
        tries.append(1)
        if len(tries) <= 2:
            raise nats.errors.TimeoutError
        return await runs_kv(js_)

    monkeypatch.setattr(netfaults, "runs_kv", unanswered_twice)
    await netfaults.wait_ended(js, {"r1", "r2"}, timeout=30.0)
    assert len(tries) == 3  # two unanswered, then opened once and kept
