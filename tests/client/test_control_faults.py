"""Approvals survive a host killed with SIGKILL while they wait: real `sa host` and `sa worker` processes,
a real nats-server, decisions made with the `sa` command line. One run is approved with edited arguments,
one denied with a reason (which the model then reads), one decided by its rule's timeout on the host
that took over; every log still verifies with the kernel."""

from __future__ import annotations

import anyio
import pytest
from control_helpers import control_bundle, control_model, sa, tool_messages
from host_helpers import kinds

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import load_bundle
from runtime.client.verify import verify
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.testing import ScriptedModelServer
from testbed.fleet import SaProcess, start_all

pytestmark = pytest.mark.anyio

REFUND_TIMEOUT_S = 6.0


async def _events(js, run_id: str) -> list[ev.Event]:
    return (await RunLog(js).read(run_id)).events


async def _until(js, run_id: str, kind: str, timeout: float = 60.0) -> list[ev.Event]:
    with anyio.fail_after(timeout):
        while kind not in kinds(events := await _events(js, run_id)):
            await anyio.sleep(0.1)
    return events


async def test_pending_approvals_survive_a_host_kill_9(nats_server, tmp_path):
    url = nats_server.url
    nc = await bus.connect(url, name="control-faults")
    procs: list[SaProcess] = []
    try:
        js = nc.jetstream()
        await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
        with ScriptedModelServer(responder=control_model) as server:
            bundle = control_bundle(tmp_path, server.base_url, refund_timeout=f"{REFUND_TIMEOUT_S:g}s")
            host = SaProcess("host", ["host", str(bundle)], url, tmp_path / "host.log", "sa host: serving")
            worker = SaProcess("worker", ["worker", "--bundle", str(bundle), "--concurrency", "2"], url,
                               tmp_path / "worker.log", "serving")
            procs = [host, worker]
            await anyio.to_thread.run_sync(start_all, procs)

            edit = await publish_task(js, "ctl:edit", "pay: 500 to acme", task_id="edit")
            deny = await publish_task(js, "ctl:deny", "pay: 700 to bob", task_id="deny")
            late = await publish_task(js, "ctl:late", "refund: 30", task_id="late")
            for run in (edit, deny, late):
                await _until(js, run, "approval.requested")
            with anyio.fail_after(30):
                while {r["run_id"] for r in (await sa(url, "runs", "--json")).json()
                       if r["status"] == "waiting for approval"} != {edit, deny, late}:
                    await anyio.sleep(0.2)

            host.kill9()  # every approval is pending; nothing of the host's memory survives
            listed = (await sa(url, "approvals", "ctl", "--json")).json()  # the log and index suffice
            host.start()
            await anyio.to_thread.run_sync(host.wait_ready)
            approved = await sa(url, "approve", edit, "1.0", "--args", '{"amount": 120, "to": "acme"}')
            denied = await sa(url, "deny", deny, "1.0", "--reason", "bob's account is frozen")
            ended = {run: await _until(js, run, "run.completed") for run in (edit, deny, late)}
            requests = list(server.requests)
    finally:
        for p in procs:
            p.stop()
        await bus.close(nc)

    assert {p["run_id"] for p in listed} == {edit, deny, late}
    assert next(p for p in listed if p["run_id"] == late)["on_timeout"] == "approve"
    assert approved.code == 0 and denied.code == 0, (approved, denied)

    granted = next(e for e in ended[edit] if isinstance(e, ev.ApprovalGranted))
    called = next(e for e in ended[edit] if isinstance(e, ev.ToolCalled))
    assert granted.arguments == {"amount": 120, "to": "acme"} == called.call.arguments

    told = [b for b in requests if any("bob's account is frozen" in t for t in tool_messages(b))]
    assert told and "approval for transfer was denied" in tool_messages(told[0])[-1]

    requested = next(e for e in ended[late] if isinstance(e, ev.ApprovalRequested))
    timed_out = next(e for e in ended[late] if isinstance(e, ev.ApprovalGranted))
    assert timed_out.by == "timeout" and timed_out.ts >= requested.ts + REFUND_TIMEOUT_S
    assert kinds(ended[late]).index("approval.granted") < kinds(ended[late]).index("tool.called")

    config = load_bundle(bundle).kernel_config()
    for run in (edit, deny, late):
        report = verify(config, ended[run])
        assert report.ok, (run, report.problems)
