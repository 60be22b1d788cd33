"""Run control on a real nats-server with an in-process host and a real Monty worker, driven through the
`sa` command line as an operator would: a cancel that stops the sandboxed tool, approvals listed,
approved with edited arguments, denied with a reason the model reads, and every kind of bad input
refused with exit 1 and nothing appended."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from control_helpers import control_bundle, control_model, sa, tool_messages
from host_helpers import kinds, running_host, running_worker, wait_until

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_task
from runtime.host import Host
from runtime.log import RunLog
from runtime.testing import ScriptedModelServer
from runtime.worker import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


@dataclass
class Fleet:
    url: str
    js: object
    host: Host
    worker: Worker
    server: ScriptedModelServer

    async def events(self, run_id: str) -> list[ev.Event]:
        return (await RunLog(self.js).read(run_id)).events  # type: ignore[arg-type]

    async def until(self, run_id: str, kind: str, timeout: float = 30.0) -> list[ev.Event]:
        """The run's events once one of kind `kind` is among them."""
        with anyio.fail_after(timeout):
            while True:
                events = await self.events(run_id)
                if kind in kinds(events):
                    return events
                await anyio.sleep(0.05)

    async def ended(self, run_id: str, timeout: float = 30.0) -> list[ev.Event]:
        with anyio.fail_after(timeout):
            async for e in RunLog(self.js).follow(run_id):  # type: ignore[arg-type]
                if ev.kind_of(e) in ("run.completed", "run.failed", "run.cancelled"):
                    break
        return await self.events(run_id)


@asynccontextmanager
async def fleet(url: str, js: object, root: Path, *, concurrency: int = 1) -> AsyncIterator[Fleet]:
    with ScriptedModelServer(responder=control_model) as server:
        bundle = control_bundle(root, server.base_url)
        async with running_host(url, [bundle], server) as host, \
                running_worker(url, [bundle], concurrency=concurrency) as worker:
            yield Fleet(url, js, host, worker, server)


async def test_a_cancel_stops_the_busy_tool_in_the_sandbox_and_the_worker_takes_the_next_job(
        nats_server, topo, tmp_path):
    async with fleet(nats_server.url, topo, tmp_path, concurrency=1) as f:
        spinning = await publish_task(topo, "ctl", "spin forever", task_id="spin-1")
        await wait_until(lambda: spinning in f.worker.running_runs, timeout=30)  # the sandbox loops now
        done = await sa(f.url, "cancel", spinning, "--reason", "runaway loop")
        assert done.code == 0 and f"cancelled {spinning}" in done.out, done.err
        # nothing is left running when the command closes its connection (it once left its log follow)
        assert "Task exception was never retrieved" not in done.err and "Traceback" not in done.err, done.err
        after = await publish_task(topo, "ctl", "pay: 5 to acme", task_id="after-1")  # a tool job too
        second = await f.ended(after)
        with anyio.fail_after(20):  # the stopped job's report reaches the log after run.cancelled
            while "tool.failed" not in kinds(events := await f.events(spinning)):
                await anyio.sleep(0.05)
        again = await sa(f.url, "cancel", spinning)
    assert kinds(events)[-2:] == ["run.cancelled", "tool.failed"]
    cancelled, failed = events[-2], events[-1]
    assert isinstance(cancelled, ev.RunCancelled) and cancelled.reason == "runaway loop" and cancelled.by
    assert isinstance(failed, ev.ToolFailed) and failed.error.kind == "cancelled"
    # the sandbox run it stopped rides in the outcome: it started, and failed with the call's error
    assert failed.script is not None and failed.script.failed and failed.script.error is None
    assert kinds(ev.expand(failed)) == ["script.started", "script.failed", "tool.failed"]
    assert ev.expand(failed)[1].error == failed.error  # type: ignore[union-attr]
    assert "spin stopped while it ran: the run was cancelled by" in failed.error.message
    assert f.worker.stats.cancelled == 1 and f.worker.running_runs == frozenset()
    assert kinds(second)[-1] == "run.completed"  # the one worker slot was free again: the loop stopped
    assert again.code == 1 and "already cancelled: nothing to cancel" in again.err


async def test_approvals_listed_approved_with_edited_arguments_and_denied_with_a_reason(nats_server, topo,
                                                                                       tmp_path):
    async with fleet(nats_server.url, topo, tmp_path, concurrency=2) as f:
        # each on its own instance: an actor runs one task at a time, and these wait for a person
        small = await publish_task(topo, "ctl:small", "pay: 50 to acme", task_id="small")
        big = await publish_task(topo, "ctl:big", "pay: 500 to acme", task_id="big")
        bob = await publish_task(topo, "ctl:bob", "pay: 700 to bob", task_id="bob")
        assert kinds(await f.ended(small))[-1] == "run.completed"  # under the condition: no approval
        for run in (big, bob):
            await f.until(run, "approval.requested")
        with anyio.fail_after(20):  # the host marks the runs in the index once it waits
            while {r["run_id"] for r in (await sa(f.url, "runs", "--json")).json()
                   if r["status"] == "waiting for approval"} != {big, bob}:
                await anyio.sleep(0.2)
        listed = (await sa(f.url, "approvals", "ctl", "--json")).json()
        table = await sa(f.url, "approvals")
        edited = await sa(f.url, "approve", big, "1.0", "--args", '{"amount": 90, "to": "acme"}',
                          "--note", "capped at 90")
        denied = await sa(f.url, "deny", bob, "1.0", "--reason", "bob is not a customer")
        big_events, bob_events = await f.ended(big), await f.ended(bob)
        twice = await sa(f.url, "approve", big, "1.0")
        none_left = (await sa(f.url, "approvals", "--json")).json()

    by_run = {p["run_id"]: p for p in listed}
    assert set(by_run) == {big, bob}
    assert by_run[big]["arguments"] == {"amount": 500, "to": "acme"} and by_run[big]["tool"] == "transfer"
    assert by_run[big]["role"] == "finance" and by_run[big]["condition"] == "amount > 100"
    assert by_run[big]["age_s"] >= 0 and by_run[big]["call_id"] == f"{big}/1.0"
    assert table.code == 0 and big in table.out and "transfer" in table.out and "finance" in table.out

    assert edited.code == 0 and "approved" in edited.out and '"amount":90' in edited.out, edited.err
    granted = next(e for e in big_events if isinstance(e, ev.ApprovalGranted))
    assert granted.arguments == {"amount": 90, "to": "acme"} and granted.note == "capped at 90" and granted.by
    called = next(e for e in big_events if isinstance(e, ev.ToolCalled))
    assert called.call.arguments == {"amount": 90, "to": "acme"}  # the kernel ran the edited call
    assert kinds(big_events)[-1] == "run.completed" and '"sent": 90' in big_events[-1].output["answer"]

    assert denied.code == 0 and "bob is not a customer" in denied.out, denied.err
    assert not any(isinstance(e, ev.ToolCalled) and e.call.name == "transfer" for e in bob_events)
    told = [b for b in f.server.requests if any("bob is not a customer" in t for t in tool_messages(b))]
    assert told, "the model's next request carries the denial"
    assert "approval for transfer was denied: bob is not a customer" in tool_messages(told[0])[-1]

    assert twice.code == 1 and "already completed" in twice.err
    assert none_left == []


async def test_a_run_waiting_for_approval_is_parked_and_its_agent_takes_the_next_task(nats_server, topo,
                                                                                     tmp_path):
    """An approval with no timeout parks its run as a question does: the driver lets it go, the same actor
    runs its next task meanwhile, the run is listed as waiting, and the verdict folds it back."""
    async with fleet(nats_server.url, topo, tmp_path) as f:
        held = await publish_task(topo, "ctl", "pay: 500 to acme", task_id="held")
        await f.until(held, "approval.requested")
        later = await publish_task(topo, "ctl", "compute: 6 * 7", task_id="later")  # same actor, behind it
        later_events = await f.ended(later)
        with anyio.fail_after(20):
            while held in f.host.drivers:  # parked: nothing of it stays on the host
                await anyio.sleep(0.05)
        listed = (await sa(f.url, "approvals", "ctl", "--json")).json()
        status = {r["run_id"]: r["status"] for r in (await sa(f.url, "runs", "--json")).json()}
        approved = await sa(f.url, "approve", held, "1.0")
        held_events = await f.ended(held)

    assert kinds(later_events)[-1] == "run.completed"
    assert [p["run_id"] for p in listed] == [held] and status[held] == "waiting for approval"
    assert approved.code == 0, approved.err
    assert kinds(held_events)[-1] == "run.completed" and '"sent": 500' in held_events[-1].output["answer"]
    started_later = next(e for e in later_events if isinstance(e, ev.RunStarted))
    granted = next(e for e in held_events if isinstance(e, ev.ApprovalGranted))
    assert started_later.ts < granted.ts  # the later task did not wait for the person


async def test_a_task_behind_a_busy_run_is_listed_as_queued(nats_server, topo, tmp_path):
    """A task that waits in its actor's mailbox behind a long run is in `sa runs` as `queued` (it appeared in
    no listing), and runs once the run before it ends."""
    async with fleet(nats_server.url, topo, tmp_path) as f:
        busy = await publish_task(topo, "ctl", "spin forever", task_id="busy")
        await wait_until(lambda: busy in f.worker.running_runs, timeout=30)
        behind = await publish_task(topo, "ctl", "compute: 2", task_id="behind")
        with anyio.fail_after(20):
            while {r["run_id"]: r["status"] for r in (await sa(f.url, "runs", "--json")).json()
                   }.get(behind) != "queued":
                await anyio.sleep(0.2)
        assert (await sa(f.url, "cancel", busy)).code == 0
        behind_events = await f.ended(behind)
        status = {r["run_id"]: r["status"] for r in (await sa(f.url, "runs", "--json")).json()}
    assert kinds(behind_events)[-1] == "run.completed" and status[behind] == "completed"


async def test_bad_input_is_refused_with_exit_1_and_nothing_appended(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, topo, tmp_path, concurrency=1) as f:
        run = await publish_task(topo, "ctl", "pay: 900 to acme", task_id="bad-input")
        before = await f.until(run, "approval.requested")
        unknown_run = await sa(f.url, "approve", "rnope", "1.0")
        unknown_call = await sa(f.url, "approve", run, "7.3")
        bad_args = await sa(f.url, "approve", run, "1.0", "--args", '{"amount": "lots", "to": "acme"}')
        not_json = await sa(f.url, "approve", run, "1.0", "--args", "{amount: 5}")
        no_reason = await sa(f.url, "deny", run, "1.0", "--reason", " ")
        cancel_unknown = await sa(f.url, "cancel", "rnope")
        bad_token = await sa(f.url, "cancel", "r.x")
        await anyio.sleep(0.5)  # anything wrongly sent would have reached the host by now
        unchanged = await f.events(run)
        closed = await sa(f.url, "cancel", run, "--reason", "wrong customer")
        after = await f.ended(run)
        done = await publish_task(topo, "ctl", "compute: 1", task_id="done")
        await f.ended(done)
        completed = await sa(f.url, "cancel", done)
        decided = await sa(f.url, "deny", run, "1.0", "--reason", "late")

    for result, says in ((unknown_run, "unknown run 'rnope'"), (unknown_call, f"no call {run}/7.3 waiting"),
                         (bad_args, "do not fit transfer's schema"), (not_json, "--args is not valid JSON"),
                         (no_reason, "a denial needs a reason"), (cancel_unknown, "unknown run 'rnope'"),
                         (bad_token, "contains '.'")):
        assert result.code == 1 and says in result.err, (says, result)
    assert "amount" in bad_args.err and "lots" in bad_args.err
    assert kinds(unchanged) == kinds(before)  # nothing appended by any of them
    assert closed.code == 0
    assert kinds(after)[-2:] == ["approval.denied", "run.cancelled"]  # the cancel closed the approval
    assert after[-2].reason == "the run was cancelled" and after[-2].by == after[-1].by
    assert completed.code == 1 and "already completed" in completed.err
    assert decided.code == 1 and "already cancelled" in decided.err
