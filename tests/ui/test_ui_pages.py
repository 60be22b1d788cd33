"""The pure parts behind the inspector's team pages, without NATS or a browser: the waterfall (the trace
export's spans on one axis, open spans and approval waits, where the time went) and the conversation at
a turn (the kernel's fold, the history window's cut, each message's origin, a recorded prompt that
disagrees with the fold)."""

from __future__ import annotations

import json

from kernel_sim import Reply, Sim, schema, script

from runtime import events as ev
from runtime import kernel as k
from runtime.types import ToolCall, ToolResult, Usage
from runtime.ui import conversation as conv
from runtime.ui import waterfall as wf

T0 = 1_700_000_000.0


def _parallel_run() -> list[ev.Event]:
    """A run whose turn 1 makes two tool calls at once (the second slower), then answers."""
    run = "r1"
    calls = (ToolCall(f"{run}/1.0", "calc", {"x": 1}), ToolCall(f"{run}/1.1", "calc", {"x": 2}))
    timed: list[tuple[float, ev.Event]] = [
        (0.0, ev.RunStarted(run_id=run, input="go")),
        (0.1, ev.ModelRequested(run_id=run, request_id=f"{run}/1", turn=1, sampling={"model": "m"})),
        (1.1, ev.ModelResponded(run_id=run, request_id=f"{run}/1", turn=1, calls=calls, usage=Usage(100, 20),
                                latency_ms=1000.0, model="m")),
        (1.2, ev.ToolCalled(run_id=run, call=calls[0])),
        (1.2, ev.ToolCalled(run_id=run, call=calls[1])),
        (1.3, ev.ScriptStarted(run_id=run, call_id=calls[0].id, tool="calc", worker="w1")),
        (1.5, ev.ScriptCompleted(run_id=run, call_id=calls[0].id, tool="calc", duration_ms=200.0)),
        (1.6, ev.ToolCompleted(run_id=run, call_id=calls[0].id, tool="calc", output=1, duration_ms=400.0)),
        (2.2, ev.ToolCompleted(run_id=run, call_id=calls[1].id, tool="calc", output=2, duration_ms=1000.0)),
        (2.3, ev.TurnCompleted(run_id=run, turn=1, calls_ok=2)),
        (2.4, ev.ModelRequested(run_id=run, request_id=f"{run}/2", turn=2)),
        (3.4, ev.ModelResponded(run_id=run, request_id=f"{run}/2", turn=2, content="3", usage=Usage(150, 5),
                                latency_ms=1000.0)),
        (3.5, ev.TurnCompleted(run_id=run, turn=2)),
        (3.6, ev.RunCompleted(run_id=run, output="3")),
    ]
    return [ev.stamp(e, seq=i, ts=T0 + t, actor="calc") for i, (t, e) in enumerate(timed)]


def test_waterfall_is_the_trace_on_one_axis_with_where_the_time_went():
    view = wf.waterfall(_parallel_run())
    spans = view["spans"]
    assert [(s["kind"], s["depth"]) for s in spans] == [
        ("run", 0), ("turn", 1), ("model", 2), ("tool", 2), ("script", 3), ("tool", 2), ("turn", 1),
        ("model", 2)]
    run, turn1, chat = spans[0], spans[1], spans[2]
    assert (run["start_ms"], run["end_ms"]) == (0.0, 3600.0) and view["ended"] and not run["open"]
    assert chat["tokens"] == {"input": 100, "output": 20} and chat["name"] == "chat m"
    assert chat["parent"] == turn1["id"] and turn1["parent"] == run["id"]
    tools = [s for s in spans if s["kind"] == "tool"]
    # the two calls side by side in time
    assert [(t["start_ms"], t["end_ms"]) for t in tools] == [(1200.0, 1600.0), (1200.0, 2200.0)]
    assert spans[4]["attributes"]["sa.worker"] == "w1" and spans[4]["start_ms"] == 1300.0
    # parallel calls count once; the rest of the wall time is the host's, between the bars
    assert view["breakdown"] == {"wall_ms": 3600.0, "model_ms": 2000.0, "tool_ms": 1000.0, "script_ms": 200.0,
                                 "approval_ms": 0.0, "other_ms": 600.0}
    json.dumps(view)


def test_waterfall_of_a_running_run_draws_open_spans_to_now_and_approval_waits():
    events = _parallel_run()[:5]  # both calls dispatched, nothing back yet
    approval = ev.stamp(ev.ApprovalRequested(run_id="r1", call=ToolCall("r1/1.2", "pay", {}), role="finance"),
                        seq=5, ts=T0 + 1.3, actor="calc")
    view = wf.waterfall([*events, approval], now=T0 + 5.0)
    assert not view["ended"] and view["end_ms"] == 5000.0
    open_ = {s["kind"]: s for s in view["spans"] if s["open"]}
    assert set(open_) == {"run", "turn", "tool", "approval"}
    assert open_["approval"]["start_ms"] == 1300.0 and open_["approval"]["end_ms"] == 5000.0
    assert open_["approval"]["attributes"]["sa.role"] == "finance"
    assert open_["approval"]["parent"] == open_["turn"]["id"]
    assert view["breakdown"]["approval_ms"] == 3700.0


def test_union_counts_overlaps_once():
    assert wf.union_ms([(0, 1), (0.5, 2), (3, 4)]) == 3000.0
    assert wf.union_ms([]) == 0.0


def _windowed(system: str = "be brief") -> Sim:
    """Four turns of calc calls under a history window of 2 messages, then an answer."""
    config = k.KernelConfig(system_prompt=system, tools=(schema("calc", x="integer"),), history_window=2)
    model = script(*(Reply(calls=(("calc", {"x": i}),)) for i in range(4)), Reply(content="done"))
    return Sim(config).start("count to four").run(model, lambda c: ToolResult(output={"x": c.arguments["x"]}))


def test_the_prompt_at_a_turn_is_the_folds_with_the_windows_cut():
    sim = _windowed()
    traced = conv.fold_traced(k.KernelConfig(system_prompt="be brief"), sim.events,
                              system=conv.Origin("run1", 1, "the system prompt"))
    assert traced.mismatches == []
    assert [t["turn"] for t in conv.turns_of(traced)] == [1, 2, 3, 4, 5]
    view = conv.prompt_view(traced, 3)
    roles = [(m["role"], m["sent"]) for m in view["messages"]]
    # system + task pinned; turns 1's exchange left out by the window; turn 2's exchange sent
    assert roles == [("system", True), ("user", True), ("assistant", False), ("tool", False),
                     ("assistant", True), ("tool", True)]
    assert view["left_out"] == 2 and view["request"]["context_start"] == 4
    assert view["messages"][1]["content"] == "count to four"
    assert view["messages"][1]["origin"]["seq"] == 0 and view["messages"][1]["origin"]["note"] == "the task"
    tool = view["messages"][5]
    assert tool["call"] == "2.0" and json.loads(tool["content"]) == {"x": 1}
    outcome = sim.events[tool["origin"]["seq"]]
    assert isinstance(outcome, ev.ToolCompleted) and outcome.call_id == "run1/2.0"
    assert view["reply"]["role"] == "assistant"
    assert view["reply"]["tool_calls"][0]["arguments"] == '{\n  "x": 2\n}'
    assert view["answer"]["completion_tokens"] == 5
    whole = conv.prompt_view(traced, None)
    assert len(whole["messages"]) == len(traced.state.messages) and all(m["sent"] for m in whole["messages"])


def test_a_wrong_system_prompt_shows_as_a_mismatch_with_the_log():
    sim = _windowed()
    traced = conv.fold_traced(k.KernelConfig(system_prompt="something else"), sim.events)
    assert traced.mismatches == [sim.events[1].seq]  # the first request recorded "be brief"
    assert conv.recorded_system(sim.events)[0] == "be brief"


def test_long_text_is_cut_and_a_stub_is_fetched_on_demand():
    message = k.Message("tool", "x" * 5000, tool_call_id="r/1.0", name="calc")
    view = conv.message_view(3, message, conv.Origin("r", 7))
    assert view["cut"] and len(view["content"]) == conv.CUT and view["length"] == 5000
    stub = conv.message_view(3, message, conv.Origin("r", 7, stub=300_000))
    assert stub["content"] == "" and stub["origin"]["stub"] == 300_000
    assert conv.message_view(3, message, conv.Origin("r", 7), cut=None)["content"] == "x" * 5000


def test_a_fork_with_another_system_prompt_is_no_mismatch_and_says_whose_turns_it_kept():
    sim = _windowed()
    at = next(e.seq for e in sim.events if isinstance(e, ev.ModelRequested) and e.turn == 3)
    first = sim.events[0]
    forked = ev.stamp(ev.RunForked(run_id="run1", input=first.input, source_run="src", source_seq=at,
                                   system_prompt="be verbose"), seq=0, ts=first.ts, actor=first.actor)
    traced = conv.fold_traced(k.KernelConfig(system_prompt="ignored"), [forked, *sim.events[1:]])
    assert traced.mismatches == [] and traced.kept == ("src", at)
    assert traced.state.messages[0].content == "be verbose"
    assert conv.prompt_view(traced, 2)["kept_from"] == {"run_id": "src", "seq": at}
    assert conv.prompt_view(traced, 3)["kept_from"] is None  # the fork's own request
