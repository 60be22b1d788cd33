"""Traces derived from the log, exported over OTLP/HTTP to a real receiver (`otlp_receiver`) decoding the
protobuf bodies: the span tree and timing of a 3-turn run, a publisher's traceparent as the run's parent,
ids equal however often and by whichever exporter they are derived, and an exporter killed mid-export
(SIGKILL, while the receiver holds its request) and restarted: no span missing, none twice once
de-duplicated by id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from host_helpers import Env, running_fleet, wait_until, write_bundle
from otlp_receiver import ReceivedSpan, Receiver

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.observe.exporter import TraceExporter, otlp_exporter, traces_url
from runtime.observe.traces import render_tree, span_id_for, trace_id_for, trace_of

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SA = [sys.executable, "-c", "from runtime.cli import main; main()"]


@pytest.fixture
async def fleet(nats_server, js, tmp_path: Path) -> AsyncIterator[Env]:
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path)) as env:
        yield env


def ns(ts: float) -> int:
    return round(ts * 1e9)


async def export_until(js, receiver: Receiver, expected: set[str], durable: str) -> None:
    """Run an in-process exporter until the receiver holds every span id of `expected`."""
    exporter = TraceExporter(js, otlp_exporter(receiver.url), durable=durable, batch=64)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(exporter.run, stop)
        await wait_until(lambda: expected <= set(receiver.unique()), 60, "every span exported")
        stop.set()
    exporter.shutdown()


async def test_a_three_turn_run_is_one_trace_with_its_span_tree_and_real_times(fleet: Env):
    js = fleet.js
    run_id = await publish_task(js, "calc", "chain: 2", task_id="three-turns",
                                headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    events = await fleet.wait_run(run_id)
    assert isinstance(events[-1], ev.RunCompleted)
    assert events[0].metadata["traceparent"] == f"00-{TRACE}-{PARENT}-01"  # the host copied the header

    with Receiver() as receiver:
        expected = {f"{s.span_id:016x}" for s in trace_of(events)}
        await export_until(js, receiver, expected, "otel-a")
        spans = receiver.unique()
    assert set(spans) == expected and len(expected) == 13
    assert {s.trace_id for s in spans.values()} == {TRACE}  # one trace: the publisher's
    assert {s.service for s in spans.values()} == {"structured-agents"}
    by_id = {sid: s for sid, s in spans.items()}
    (root,) = [s for s in spans.values() if s.parent_id == PARENT]
    assert root.name == "invoke_agent calc" and root.span_id == f"{span_id_for(run_id, 0):016x}"
    assert root.attributes["gen_ai.agent.name"] == "calc" and root.attributes["sa.status"] == "completed"
    assert (root.start_ns, root.end_ns) == (ns(events[0].ts), ns(events[-1].ts))

    def children(span: ReceivedSpan) -> list[ReceivedSpan]:
        return sorted((s for s in spans.values() if s.parent_id == span.span_id), key=lambda s: s.start_ns)

    turns = children(root)
    assert [t.name for t in turns] == ["turn 1", "turn 2", "turn 3"]
    completed = {e.turn: e for e in events if isinstance(e, ev.TurnCompleted)}
    first_request = {}
    for e in events:
        if isinstance(e, ev.ModelRequested):
            first_request.setdefault(e.turn, e)
    for number, turn in enumerate(turns, 1):
        assert (turn.start_ns, turn.end_ns) == (ns(first_request[number].ts), ns(completed[number].ts))
        chat, tool = children(turn)
        assert chat.name == "chat scripted" and chat.kind == 3  # SPAN_KIND_CLIENT
        assert chat.attributes["gen_ai.request.model"] == "scripted"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.end_ns <= tool.start_ns  # the call was made after the reply that asked for it
        expected_tool = "submit" if number == 3 else "calculator"
        assert tool.name == f"execute_tool {expected_tool}"
        assert tool.attributes["gen_ai.tool.name"] == expected_tool
        (script,) = children(tool)
        assert script.name == f"script {expected_tool}" and script.attributes["sa.sandbox_ms"] > 0
        for parent, child in ((root, turn), (turn, chat), (turn, tool), (tool, script)):
            assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, child.name
    responded = [e for e in events if isinstance(e, ev.ModelResponded)]
    tokens = sum(e.usage.prompt_tokens for e in responded), sum(e.usage.completion_tokens for e in responded)
    usage = root.attributes["gen_ai.usage.input_tokens"], root.attributes["gen_ai.usage.output_tokens"]
    assert usage == tokens
    assert all(s.status_code == 0 for s in by_id.values())  # UNSET: nothing failed
    tree = render_tree(trace_of(events))
    assert tree.splitlines()[0].startswith("invoke_agent calc") and tree.count("script ") == 3


async def test_ids_are_the_same_from_every_export_and_without_a_traceparent_from_the_run_id(fleet: Env):
    js = fleet.js
    run_id = await publish_task(js, "calc", "compute: 2 + 3", task_id="twice")
    events = await fleet.wait_run(run_id)
    expected = {f"{s.span_id:016x}" for s in trace_of(events)}
    with Receiver() as first, Receiver() as second:
        await export_until(js, first, expected, "otel-one")
        await export_until(js, second, expected, "otel-two")  # another durable: every event again
        a, b = first.unique(), second.unique()
    assert set(a) == set(b) == expected
    for sid in expected:
        assert (a[sid].trace_id, a[sid].parent_id, a[sid].start_ns, a[sid].end_ns, a[sid].name) == \
               (b[sid].trace_id, b[sid].parent_id, b[sid].start_ns, b[sid].end_ns, b[sid].name)
    assert {s.trace_id for s in a.values()} == {f"{trace_id_for(run_id):032x}"}
    assert next(s for s in a.values() if not s.parent_id).name == "invoke_agent calc"


def sa_otel(url: str, endpoint: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([*SA, "otel", "--nats", url, "--endpoint",
                             endpoint, "--durable", "otel-crash", "--batch", "8", "--ack-wait", "1", *extra],
                            env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def test_an_exporter_killed_mid_export_and_restarted_sends_every_span_and_no_other(fleet: Env,
                                                                                         nats_server):
    js = fleet.js
    runs = [await publish_task(js, "calc", f"chain: {1 + i % 2}", task_id=f"crash-{i}") for i in range(4)]
    expected: set[str] = set()
    for run_id in runs:
        expected |= {f"{s.span_id:016x}" for s in trace_of(await fleet.wait_run(run_id))}
    with Receiver(hold_after=1) as receiver:
        first = sa_otel(nats_server.url, receiver.url)
        try:
            await wait_until(receiver.held.is_set, 60, "a second export in flight")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        before = receiver.unique()
        assert before and not expected <= set(before)  # killed mid-stream: some sent, not all
        in_flight = [s.span_id for s in receiver.spans]
        receiver.release()
        second = sa_otel(nats_server.url, receiver.url, "--log-format", "json")

        def resent_and_complete() -> bool:
            """Every span, and the interrupted export's again: the held request's spans already count as
            received, so the rest alone completes the set, while the events behind the held export come
            back only once the server redelivers them (their AckWait after the first delivery, as the
            server's timer notices it: on a loaded box, after the new exporter sent everything else)."""
            ids = [s.span_id for s in receiver.spans]
            return expected <= set(ids) and any(ids.count(sid) > 1 for sid in set(in_flight))

        try:
            await wait_until(resent_and_complete, 60, "every span, and the interrupted export's again")
        finally:
            second.send_signal(signal.SIGTERM)
            _, err = second.communicate(timeout=30)
        assert second.returncode == 0, err.decode()
        ids = [s.span_id for s in receiver.spans]
        final = receiver.unique()
    assert set(final) == expected  # none missing, none foreign
    resent = [sid for sid in set(in_flight) if ids.count(sid) > 1]
    assert resent  # the spans of the export the kill interrupted came again, with the same ids ...
    for sid in resent:  # ... and the same content
        copies = [s for s in receiver.spans if s.span_id == sid]
        assert len({(c.trace_id, c.parent_id, c.start_ns, c.end_ns, c.name) for c in copies}) == 1
    assert any('"logger": "runtime.observe"' in line for line in err.decode().splitlines())


def test_the_endpoint_gets_the_traces_path_and_a_bad_one_is_refused():
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"
    with pytest.raises(ValueError, match="not an http"):
        traces_url("collector:4318")
    out = subprocess.run([*SA, "otel", "--nats", "nats://127.0.0.1:9",
                          "--endpoint", "grpc://x"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not an http(s) URL" in out.stderr


async def test_a_run_read_after_a_gap_gives_the_same_spans_as_one_followed_in_order(fleet: Env):
    js = fleet.js
    run_id = await publish_task(js, "calc", "chain: 1", task_id="gap")
    events = await fleet.wait_run(run_id)
    exporter = TraceExporter(js, otlp_exporter("http://127.0.0.1:9"))
    # the first events went to another exporter: this one starts at seq 3, reads the log once, and ends
    # exactly the spans whose end event it handles
    late = [s for e in events[3:] for s in await exporter.ended_by(e)]
    assert exporter.stats.log_reads == 1
    assert late == [s for s in trace_of(events) if s.end_seq >= 3] and len(late) > 3
    assert [s for e in events[:3] for s in await exporter.ended_by(e)] == \
        [s for s in trace_of(events) if s.end_seq < 3]  # redelivered from seq 0 after the run ended
    assert exporter.stats.log_reads == 1  # the run was forgotten at its end; from seq 0 there is no gap
    history = await RunLog(js).read(run_id)
    assert trace_of(history.events) == trace_of(events)


async def test_exporters_sharing_one_durable_split_the_events_and_send_every_span(fleet: Env):
    js = fleet.js
    runs = [await publish_task(js, "calc", "chain: 1", task_id=f"shared-{i}") for i in range(3)]
    expected: set[str] = set()
    total = 0
    for run_id in runs:
        events = await fleet.wait_run(run_id)
        total += len(events)
        expected |= {f"{s.span_id:016x}" for s in trace_of(events)}
    with Receiver() as receiver:
        exporters = [TraceExporter(js, otlp_exporter(receiver.url), durable="otel-shared", batch=4)
                     for _ in range(2)]
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            for exporter in exporters:
                tg.start_soon(exporter.run, stop)
            await wait_until(lambda: expected <= set(receiver.unique()), 60, "every span exported")
            stop.set()
        final = receiver.unique()
    assert set(final) == expected
    assert sum(e.stats.events for e in exporters) >= total  # every event handled (and acked) by one of them


def _stamped(events: list[ev.Event]) -> list[ev.Event]:
    return [ev.stamp(e, seq=i, ts=100.0 + i, actor="calc") for i, e in enumerate(events)]


def test_a_run_that_fails_mid_turn_ends_its_open_spans_as_errors_and_a_refused_call_is_an_instant_span():
    from runtime.types import ToolCall, ToolError

    run = "r-fail"
    calls = (ToolCall(f"{run}/1.0", "calculator", {}), ToolCall(f"{run}/1.1", "shell", {}))
    events = _stamped([
        ev.RunStarted(run_id=run, input="x", metadata={"traceparent": "00-bad-header-01"}),
        ev.ModelRequested(run_id=run, request_id=f"{run}/m1", turn=1),
        ev.ModelResponded(run_id=run, request_id=f"{run}/m1", turn=1, calls=calls),
        ev.ToolFailed(run_id=run, call_id=f"{run}/1.1", tool="shell",
                      error=ToolError("policy", "shell is not allowed")),
        ev.ToolCalled(run_id=run, call=calls[0]),
        ev.RunFailed(run_id=run, reason="deadline", detail="the task's deadline passed"),
    ])
    spans = {s.name: s for s in trace_of(events)}
    assert set(spans) == {"invoke_agent calc", "turn 1", "chat", "execute_tool shell",
                          "execute_tool calculator"}
    root = spans["invoke_agent calc"]
    assert root.parent_id is None and root.trace_id == trace_id_for(run)  # a malformed traceparent is ignored
    assert root.attributes["error.type"] == "deadline" and root.error.startswith("deadline")
    refused = spans["execute_tool shell"]
    assert (refused.start, refused.end, refused.start_seq) == (103.0, 103.0, 3)
    assert refused.attributes["error.type"] == "policy" and refused.parent_id == spans["turn 1"].span_id
    for name in ("turn 1", "execute_tool calculator"):  # open when the run ended: ended there, as errors
        assert spans[name].end == 105.0 and spans[name].end_seq == 5 and "run.failed" in spans[name].error
    assert spans["chat"].error is None and spans["chat"].end_seq == 2
    assert len({s.span_id for s in spans.values()}) == 5
    assert trace_of(events) == trace_of(list(events))  # derived twice: equal, ids included


def test_chat_spans_carry_provider_server_request_parameters_response_id_and_the_thread():
    from runtime.types import ToolCall, Usage

    run = "r-attrs"
    call = ToolCall(f"{run}/1.0", "add", {})
    events = _stamped([
        ev.RunStarted(run_id=run, input="x", thread="support-7"),
        ev.ModelRequested(run_id=run, request_id=f"{run}/m1", turn=1, provider="vllm", server="gpu-3:8000",
                          sampling={"temperature": 0.2, "max_tokens": 256, "seed": 7, "stop": ["x"]},
                          dialect="sglang", unconstrained=True),
        ev.ModelResponded(run_id=run, request_id=f"{run}/m1", turn=1, calls=(call,), usage=Usage(5, 6),
                          response_id="chatcmpl-42", model="qwen"),
        ev.ToolCalled(run_id=run, call=call),
        ev.RunCompleted(run_id=run, output=1),
    ])
    spans = {s.name: s for s in trace_of(events)}
    chat = spans["chat qwen"].attributes
    assert chat["gen_ai.provider.name"] == "vllm"
    assert chat["sa.dialect"] == "sglang" and chat["sa.unconstrained"] is True
    assert (chat["server.address"], chat["server.port"]) == ("gpu-3", 8000)
    assert chat["gen_ai.request.temperature"] == 0.2 and chat["gen_ai.request.max_tokens"] == 256
    assert chat["gen_ai.request.seed"] == 7 and "gen_ai.request.stop" not in chat
    assert chat["gen_ai.response.id"] == "chatcmpl-42"
    assert chat["gen_ai.conversation.id"] == "calc/support-7"
    assert spans["invoke_agent calc"].attributes["gen_ai.conversation.id"] == "calc/support-7"


def test_a_script_span_lasts_as_long_as_the_worker_measured_the_sandbox_run():
    run = "r-script"
    events = _stamped([
        ev.RunStarted(run_id=run, input="x"),
        ev.ModelRequested(run_id=run, request_id=f"{run}/m1", turn=1),
        ev.ScriptStarted(run_id=run, call_id=f"{run}/1.0", tool="add", worker="w1", ts=200.0039),
        ev.ScriptCompleted(run_id=run, call_id=f"{run}/1.0", tool="add", duration_ms=4.5, ts=200.0045),
    ])
    script = next(s for s in trace_of(events) if s.name == "script add")
    assert abs((script.end - script.start) * 1000 - 4.5) < 1e-6  # the worker's 4.5 ms, not the 0.6 ms between
    assert script.end == 200.0045


def test_a_regression_run_is_its_own_trace_named_as_a_regression_of_its_source():
    run, trace, parent = "g-1", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    events = _stamped([
        ev.RunStarted(run_id=run, input="x", metadata={"traceparent": f"00-{trace}-{parent}-01"},
                      regression=ev.RegressionOf(source_run="r-src", set="week48", candidate="abc")),
        ev.RunCompleted(run_id=run, output=1),
    ])
    root = next(s for s in trace_of(events) if s.name == "invoke_agent calc")
    assert root.parent_id is None and root.trace_id == trace_id_for(run)  # not the source's caller's trace
    assert (root.attributes["sa.regression_of"], root.attributes["sa.regression_set"]) == ("r-src", "week48")
