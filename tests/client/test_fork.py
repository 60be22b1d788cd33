"""Fork: a new run from any past event that re-fires nothing before it, edits at the fork point, diff,
and the bad input that must be refused with nothing written. Real NATS, a real host and worker, real
Monty, the scripted model server (its request count and the worker's job count prove what was re-run)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from host_helpers import Env, calc_responder, kinds, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime import kernel
from runtime.bundle import load_bundle
from runtime.client.diff import diverge
from runtime.client.fork import ForkError, fork, fork_points, plan, ranges
from runtime.client.verify import verify
from runtime.commands import publish_task
from runtime.log import RunHistory, RunLog
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import EVENTS
from runtime.nats.topology import ensure_topology
from runtime.observe.traces import trace_of
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio


def _answered(events: list[ev.Event]) -> tuple[int, int]:
    """(model replies, tool results from a worker) recorded in `events`."""
    replies = sum(isinstance(e, ev.ModelResponded) for e in events)
    results = sum(isinstance(e, ev.ToolCompleted | ev.ToolFailed) for e in events)
    return replies, results


async def test_a_fork_at_every_point_of_a_3_turn_run_reuses_its_prefix_and_verifies(nats_server, js,
                                                                                      tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    config = load_bundle(bundle).kernel_config()
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]) as worker:
            env = Env(nats_server.url, js, host, server, [])
            run_id = await publish_task(js, "calc", "chain: 2")
            await env.wait_run(run_id)
            source = await RunLog(js).read(run_id)
            assert kinds(source.events)[-1] == "run.completed"
            assert sum(isinstance(e, ev.TurnCompleted) for e in source.events) == 3
            total_replies, total_results = _answered(source.events)
            points = fork_points(source.events)
            assert points[0] == 1 and points[-1] == len(source.events) - 1  # all but the ending
            for at in points:
                requests, jobs = server.served, worker.stats.completed
                forked = await fork(js, run_id, at)
                events = await env.wait_run(forked.run_id)
                kept_replies, kept_results = _answered(source.events[:at])
                # the recorded prefix is reused: only what came after it is asked or run again
                assert server.served - requests == total_replies - kept_replies, at
                assert worker.stats.completed - jobs == total_results - kept_results, at
                head = events[0]
                assert isinstance(head, ev.RunForked) and (head.source_run, head.source_seq) == (run_id, at)
                assert head.bundle_digest == source.events[0].bundle_digest  # type: ignore[union-attr]
                assert run_id not in "".join(ev.to_json(e) for e in events[1:])  # every id re-derived
                # a deterministic model and tools: the fork records the very same facts as its source
                d = diverge(run_id, source.events, forked.run_id, events)
                assert d.identical, (at, d.common, kinds(list(d.b_rest)))
                report = verify(config, events)
                assert report.ok, (at, report.problems)
                assert report.final is not None and report.final.output == {"answer": "chained 2"}
            runs = await runs_kv(js)

            async def indexed() -> RunIndex:
                return RunIndex.decode((await runs.get(forked.run_id)).value)

            with anyio.fail_after(20):
                while (ix := await indexed()).status != "completed":  # the host records it after the end
                    await anyio.sleep(0.05)
            assert (ix.forked_from, ix.forked_at) == (run_id, points[-1])


async def test_edits_at_the_fork_point_replace_an_output_a_reply_or_the_system_prompt(nats_server, js,
                                                                                      tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]) as worker:
            env = Env(nats_server.url, js, host, server, [])
            run_id = await publish_task(js, "calc", "compute: 2 + 3")
            source_events = await env.wait_run(run_id)
            assert source_events[-1].output == {"answer": "5"}  # type: ignore[union-attr]
            replied = next(e.seq for e in source_events if isinstance(e, ev.ModelResponded))
            requested = next(e.seq for e in source_events if isinstance(e, ev.ModelRequested))

            # "what if the calculator had said 41": recorded instead of run; the model is asked once more
            requests, jobs = server.served, worker.stats.completed
            forked = await fork(js, run_id, replied + 1,
                                ev.OutputEdit(call_id="1.0", output={"expression": "2 + 3", "value": 41}))
            events = await env.wait_run(forked.run_id)
            assert events[-1].output == {"answer": "41"}  # type: ignore[union-attr]
            assert (server.served - requests, worker.stats.completed - jobs) == (1, 1)  # turn 2; submit only
            edited = events[replied + 1]
            assert isinstance(edited, ev.ToolCompleted) and edited.call_id == f"{forked.run_id}/1.0"
            head = events[0]
            assert isinstance(head, ev.RunForked) and isinstance(head.edit, ev.OutputEdit)
            assert head.edit.call_id == f"{forked.run_id}/1.0" and head.edit.output["value"] == 41
            d = diverge(run_id, source_events, forked.run_id, events)
            assert d.common == replied + 1 and isinstance(d.b_rest[0], ev.ToolCompleted)
            # its trace: its own, naming the source; no span for work it copied (the source exported it)
            spans = trace_of(events)
            root = next(s for s in spans if s.parent_id is None)
            assert root.attributes["sa.forked_from"] == run_id and root.trace_id != trace_of(
                source_events)[0].trace_id
            assert spans and all(s.end_seq >= replied + 1 for s in spans)
            assert {s.name for s in spans} >= {"turn 1", "turn 2"}  # turn 1 ended in the fork

            # another reply to turn 1's request: other arguments; the model is not asked for turn 1
            requests, jobs = server.served, worker.stats.completed
            forked = await fork(js, run_id, requested + 1, ev.ReplyEdit(
                calls=(ev.EditedCall("calculator", {"expression": "40 + 2"}),)))
            events = await env.wait_run(forked.run_id)
            assert events[-1].output == {"answer": "42"}  # type: ignore[union-attr]
            assert (server.served - requests, worker.stats.completed - jobs) == (1, 2)
            reply = events[requested + 1]
            assert isinstance(reply, ev.ModelResponded) and reply.finish_reason == "edited"
            assert [c.id for c in reply.calls] == [f"{forked.run_id}/1.0"]

            # another system prompt: the next request carries it, the bundle's is gone
            forked = await fork(js, run_id, 1, ev.SystemEdit(system_prompt="Be terse. Use tools."))
            events = await env.wait_run(forked.run_id)
            assert events[-1].output == {"answer": "5"}  # type: ignore[union-attr]
            first = server.requests[-2]["messages"][0]
            assert first == {"role": "system", "content": "Be terse. Use tools."} or \
                first["content"].startswith("Be terse. Use tools.")
            assert verify(load_bundle(bundle).kernel_config(), events).ok


async def test_a_fork_goes_on_with_another_bundle_version_on_a_host_that_has_it(nats_server, js,
                                                                                  tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    v1 = write_bundle(tmp_path / "v1")
    v2 = write_bundle(tmp_path / "v2", extra="history_window: 50\n")
    assert load_bundle(v1).digest != load_bundle(v2).digest
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [v1], server) as host, running_worker(nats_server.url, [v1]):
            run_id = await publish_task(js, "calc", "chain: 1")
            source = await Env(nats_server.url, js, host, server, []).wait_run(run_id)
        async with running_host(nats_server.url, [v2], server) as host, running_worker(nats_server.url, [v2]):
            forked = await fork(js, run_id, 2, ev.BundleEdit(digest=load_bundle(v2).digest, path=str(v2)))
            events = await Env(nats_server.url, js, host, server, []).wait_run(forked.run_id)
    assert isinstance(events[-1], ev.RunCompleted) and events[-1].output == source[-1].output  # type: ignore
    head = events[0]
    assert isinstance(head, ev.RunForked) and head.bundle_digest == load_bundle(v2).digest
    assert verify(load_bundle(v2).kernel_config(), events).ok  # the copied prefix counts as inputs


async def _stream_messages(js) -> int:
    return (await js.stream_info(EVENTS)).state.messages


async def test_bad_forks_are_refused_saying_why_and_write_nothing(nats_server, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = tmp_path / "calc" / "bundle.yaml"
    write_bundle(tmp_path, extra="")
    text = bundle.read_text().replace(
        f"  - {Path(__file__).parents[2] / 'agents' / 'calculator.pym'}",
        f"  - path: {Path(__file__).parents[2] / 'agents' / 'calculator.pym'}\n"
        "    output_model: {type: object, properties: {value: {type: number}}, required: [value]}")
    bundle.write_text(text)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "compute: 2 + 3")
            events = await Env(nats_server.url, js, host, server, []).wait_run(run_id)
            replied = next(e.seq for e in events if isinstance(e, ev.ModelResponded))
            before = await _stream_messages(js)
            cases = [
                ("rnosuchrun", 1, None, "no run 'rnosuchrun'"),
                (run_id, len(events) + 3, None, "past the end"),
                (run_id, len(events), None, "keeps its ending has nothing left to do"),
                (run_id, 0, None, "at least the run's first event"),
                (run_id, replied + 1, ev.OutputEdit(call_id="7.3", output=1), "has no call '7.3'"),
                (run_id, replied + 1, ev.OutputEdit(call_id="1.0", output={"value": "many"}),
                 "not valid for the tool"),
                (run_id, 1, ev.OutputEdit(call_id="1.0", output={"value": 1}), "no pending result at seq 1"),
                (run_id, replied + 1, ev.ReplyEdit(content="hi"), "does not follow a model request"),
                (run_id, replied, ev.ReplyEdit(calls=(ev.EditedCall("nope", {}),)), "does not have"),
                (run_id, replied, ev.ReplyEdit(calls=(ev.EditedCall("calculator", {"expr": 1}),)),
                 "invalid arguments"),
            ]
            for run, at, edit, expected in cases:
                with pytest.raises(ForkError, match=expected) as caught:
                    await fork(js, run, at, edit)
                if run == run_id and edit is None:
                    assert "valid seqs: 1-" in str(caught.value)  # it says which seqs are valid
            ended = await fork(js, run_id, len(events) - 1)  # the last point before the ending is valid
            assert await _stream_messages(js) > before
            await Env(nats_server.url, js, host, server, []).wait_run(ended.run_id)
    assert ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"


def test_plan_is_pure_and_refuses_a_log_that_is_not_a_run() -> None:
    started = ev.RunStarted(run_id="ra", seq=0, ts=1.0, actor="calc", input="x")
    requested = ev.ModelRequested(run_id="ra", seq=1, ts=2.0, actor="calc", request_id="ra/1", turn=1)
    out = plan(RunHistory("ra", "calc", [started, requested], [1, 2]), 2, "rb", now=5.0)
    assert [ev.kind_of(e) for e in out] == ["run.forked", "model.requested"]
    assert out[1].request_id == "rb/1" and out[0].ts == 5.0  # type: ignore[union-attr]
    state = kernel.fold(kernel.KernelConfig(), out)
    assert state.deadline is None and state.turn is not None and state.turn.requested
    with pytest.raises(ForkError, match="no events"):
        plan(RunHistory("ra", "calc", [], []), 1, "rb")


async def test_sa_fork_and_replay_diff_on_the_command_line(nats_server, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    sa = [sys.executable, "-c", "from runtime.cli import main; main()"]
    environ = {**os.environ, "NATS_URL": nats_server.url}
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]):
            env = Env(nats_server.url, js, host, server, [])
            run_id = await publish_task(js, "calc", "compute: 2 + 3")
            source = await env.wait_run(run_id)
            replied = next(e.seq for e in source if isinstance(e, ev.ModelResponded))
            done = await anyio.run_process(
                [*sa, "fork", run_id, "--at", str(replied + 1), "--output",
                 '1.0={"expression": "2 + 3", "value": 8}'], env=environ, check=False)
            assert done.returncode == 0, done.stderr.decode()
            new_run = done.stdout.decode().strip()
            assert new_run.startswith("r") and "forked" in done.stderr.decode()
            events = await env.wait_run(new_run)
            assert events[-1].output == {"answer": "8"}  # type: ignore[union-attr]

            diff = await anyio.run_process([*sa, "replay", run_id, "--diff", new_run, "--json"], env=environ)
            report = json.loads(diff.stdout)
            assert report["common"] == replied + 1 and not report["identical"]
            first = report["b_rest"][0]
            assert first["kind"] == "tool.completed" and first["output"]["value"] == 8
            text = (await anyio.run_process([*sa, "replay", run_id, "--diff", new_run], env=environ)).stdout
            assert f"diverge at seq {replied + 1}" in text.decode()

            bad = await anyio.run_process([*sa, "fork", run_id, "--at", "999"], env=environ, check=False)
            assert bad.returncode == 2 and "valid seqs" in bad.stderr.decode()
            both = await anyio.run_process(
                [*sa, "fork", run_id, "--at", "2", "--system", "x", "--reply", '"y"'], env=environ,
                check=False)
            assert both.returncode == 2 and "one edit at a time" in both.stderr.decode()
            notjson = await anyio.run_process([*sa, "fork", run_id, "--at", "2", "--output", "1.0={oops"],
                                              env=environ, check=False)
            assert notjson.returncode == 2 and "not JSON" in notjson.stderr.decode()
