"""The fleet client (`runtime.client`) against a real fleet: a nats-server, an in-process host and a Monty
worker, the scripted model. Every operation goes through `Client` / `RunHandle` alone: start to result,
typed errors for cancelled and failed runs, approvals, fork, replay and verify, idempotent starts, the
live event and token streams, and the blocking facade."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from control_helpers import control_bundle, control_model
from host_helpers import running_host, running_worker

from runtime import Client, RunCancelledError, RunFailedError, SyncClient
from runtime import events as ev
from runtime import nats as bus
from runtime.client import NotSent, OutputEdit
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


@asynccontextmanager
async def fleet(url: str, root: Path) -> AsyncIterator[Path]:
    with ScriptedModelServer(responder=control_model) as server:
        bundle = control_bundle(root, server.base_url)
        async with running_host(url, [bundle], server), running_worker(url, [bundle], concurrency=2):
            yield bundle


async def test_start_result_events_replay_verify_and_idempotent_start(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path) as bundle, await Client.connect(nats_server.url) as client:
        handle = await client.start("ctl", "compute 6*7", task_id="c-1")
        assert await handle.result(timeout=30) == {"answer": "compute 6*7"}
        again = await client.start("ctl", "compute 6*7", task_id="c-1")  # the same task id: the same run
        assert again.run_id == handle.run_id
        events = await handle.replay()
        assert isinstance(events[0], ev.RunStarted)
        assert ev.kind_of(events[-1]) == "run.completed" and len(events) == events[-1].seq + 1
        followed = [e.seq async for e in handle.events(from_seq=2)]  # a finished run: recorded, then done
        assert followed == [e.seq for e in events if e.seq >= 2]
        report = await handle.verify(bundle)
        assert report.ok and report.checked > 0, report.problems
        assert await handle.status() == "completed"
        listed = await client.runs("ctl")
        assert handle.run_id in [r.run_id for r in listed] and listed[0].actor == "ctl"
        output = await client.run("ctl", "compute once more", result_timeout=30)
        assert output == {"answer": "compute once more"}


async def test_cancel_gives_a_typed_error_with_the_reason(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path), await Client.connect(nats_server.url) as client:
        handle = await client.start("ctl", "spin forever")
        async for event in handle.events():
            if isinstance(event, ev.ToolCalled):  # the job is out: a worker runs (or is about to run) it
                break
        ending = await handle.cancel("runaway loop")
        assert isinstance(ending, ev.RunCancelled) and ending.reason == "runaway loop"
        with pytest.raises(RunFailedError) as caught:  # what the README snippet catches: a cancel too
            await handle.result(timeout=30)
        assert isinstance(caught.value, RunCancelledError) and caught.value.run_id == handle.run_id
        assert (caught.value.reason, caught.value.detail) == ("cancelled", "runaway loop")
        assert "cancelled" in str(caught.value) and "runaway loop" in str(caught.value)


def test_except_run_failed_error_catches_every_run_that_did_not_complete():
    """`RunCancelledError` was not a `RunFailedError` and had no `.detail`: the README's `except
    RunFailedError as e: print(e.reason, e.detail)` let a cancel through."""
    from runtime.client.handle import RunError, outcome

    ids = {"run_id": "r1", "seq": 5, "ts": 1.0, "actor": "calc"}
    caught = []
    for ending in (ev.RunFailed(**ids, reason="deadline", detail="past 60 s"),
                   ev.RunCancelled(**ids, reason="runaway loop", by="alice"), ev.RunCancelled(**ids)):
        try:
            outcome("r1", ending)
        except RunFailedError as e:
            caught.append((type(e).__name__, e.reason, e.detail, e.ending is ending))
    assert caught == [("RunFailedError", "deadline", "past 60 s", True),
                      ("RunCancelledError", "cancelled", "runaway loop", True),
                      ("RunCancelledError", "cancelled", "", True)]
    assert RunError is RunFailedError  # the former base's name still catches both
    assert outcome("r1", ev.RunCompleted(**ids, output={"answer": 42})) == {"answer": 42}


async def test_a_failed_run_raises_with_the_kernels_reason(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path), await Client.connect(nats_server.url) as client:
        handle = await client.start("ctl", "spin briefly", timeout=1.0)  # the deadline passes mid-tool
        with pytest.raises(RunFailedError) as caught:
            await handle.result(timeout=60)
        assert caught.value.reason == "deadline" and isinstance(caught.value.ending, ev.RunFailed)


async def test_approvals_approve_with_edits_and_deny(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path), await Client.connect(nats_server.url) as client:
        big = await client.start("ctl", "pay: 500 to acme", instance="a")  # two actors: both wait at once
        other = await client.start("ctl", "pay: 900 to evil", instance="b")
        with anyio.fail_after(30):
            while len(await client.approvals("ctl")) < 2:
                await anyio.sleep(0.05)
        [waiting] = await big.approvals()
        assert waiting.tool == "transfer" and waiting.arguments == {"amount": 500, "to": "acme"}
        granted = await big.approve(waiting.call_id, arguments={"amount": 90, "to": "acme"}, note="capped")
        assert isinstance(granted, ev.ApprovalGranted)
        paid = str(await big.result(timeout=30))
        assert "90" in paid and "500" not in paid
        [other_call] = await other.approvals()
        denied = await other.deny(other_call.call_id, "not this account")
        assert isinstance(denied, ev.ApprovalDenied) and denied.reason == "not this account"
        assert "not this account" in str(await other.result(timeout=30))


async def test_fork_goes_on_from_a_past_event_with_an_edit(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path), await Client.connect(nats_server.url) as client:
        source = await client.start("ctl", "pay: 5 to acme")
        assert '"sent": 5' in str(await source.result(timeout=30))
        events = await source.replay()
        replied = next(e.seq for e in events if isinstance(e, ev.ModelResponded))
        forked = await source.fork(replied + 1, OutputEdit(call_id="1.0", output={"sent": 77, "to": "x"}))
        assert forked.run_id != source.run_id
        assert "77" in str(await forked.result(timeout=30))
        divergence = await client.diff(source.run_id, forked.run_id)
        assert 0 < divergence.common <= replied + 1 and divergence.b_rest


async def test_tokens_stream_while_the_run_goes_and_end_with_it(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path), await Client.connect(nats_server.url) as client:
        handle = await client.start("ctl", "compute streamed")
        with anyio.fail_after(30):
            deltas = [d async for d in handle.tokens()]  # the iterator ends when the run ends
        assert await handle.result(timeout=5) == {"answer": "compute streamed"}
        assert all(d.run_id == handle.run_id for d in deltas)
        replies = {e.request_id: e for e in await handle.replay() if isinstance(e, ev.ModelResponded)}
        for request_id, reply in replies.items():  # a request seen from its first fragment is whole
            mine = [d for d in deltas if d.request_id == request_id]
            if mine and mine[0].n == 0:
                arguments = "".join(d.tool_call.arguments for d in mine if d.tool_call)
                assert "".join(d.text for d in mine) == reply.text or arguments


async def test_start_without_a_host_is_not_sent_and_says_so(nats_server, js):
    async with await Client.connect(nats_server.url) as client:
        # this module's streams may exist from an earlier test: a fresh server has none
        if "TASKS" in [s.config.name for s in await js.streams_info()]:
            pytest.skip("TASKS exists on this server already")
        with pytest.raises(NotSent, match="no host has created the TASKS stream"):
            await client.start("ctl", "anything")


def test_the_blocking_client_runs_a_task_from_a_thread(nats_server, tmp_path):
    async def serve(stop: anyio.Event) -> None:
        nc = await bus.connect(nats_server.url)
        await bus.ensure_topology(bus.jetstream_for(nc), partitions=4, tool_ack_wait=2.0)
        await bus.close(nc)
        async with fleet(nats_server.url, tmp_path):
            await stop.wait()

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, stop)

            def blocking() -> tuple[object, list[str]]:
                with SyncClient.connect(nats_server.url) as client:
                    handle = client.start("ctl", "compute blocking", task_id="sync-1", wait=30)
                    output = handle.result(timeout=30)
                    return output, [type(e).__name__ for e in handle.events()]

            output, names = await anyio.to_thread.run_sync(blocking)
            stop.set()
        assert output == {"answer": "compute blocking"}
        assert names[0] == "RunStarted" and names[-1] == "RunCompleted"

    anyio.run(main, backend="asyncio")
