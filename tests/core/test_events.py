"""The wire schema: round trips, schema evolution, clear decode errors, payload references."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import events as ev
from runtime.types import Message, ToolCall, ToolError, ToolResult, Usage

REQUIRED_KINDS = {
    "run.started", "model.requested", "model.responded", "model.failed", "tool.called", "script.started",
    "script.printed", "script.completed", "script.failed", "tool.redelivered", "tool.completed",
    "tool.failed", "turn.completed", "run.completed", "run.failed", "run.cancelled", "approval.requested",
    "approval.granted", "approval.denied", "run.forked", "model.throttled", "timer.started", "timer.fired",
    "question.asked", "question.answered", "run.taken",
}  # fmt: skip

# ── a strategy for any event or command, derived from the Struct fields ───────────────────────────────

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # JSON has no inf
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
tool_calls = st.builds(ToolCall, st.text(max_size=12), st.text(max_size=12), arguments)
tool_errors = st.builds(
    ToolError,
    st.sampled_from(["policy", "execution", "limit"]),
    st.text(),
    st.none() | st.integers(0, 999),
    st.none() | st.text(max_size=8),
)
messages = st.builds(
    Message, st.sampled_from(["system", "user", "assistant", "tool"]), st.text(),
    st.lists(tool_calls, max_size=2).map(tuple), st.none() | st.text(max_size=8),
    st.none() | st.text(max_size=8),
)  # fmt: skip
BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    str: st.text(),
    int: st.integers(0, 2**40),
    bool: st.booleans(),
    ev.Priority: st.integers(ev.MIN_PRIORITY, ev.MAX_PRIORITY),
    float: st.floats(allow_nan=False, allow_infinity=False),
    Any: json_values,
    dict[str, Any]: st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    ToolCall: tool_calls,
    ToolError: tool_errors,
    Usage: st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**6)),
    tuple[Message, ...]: st.lists(messages, max_size=3).map(tuple),
    tuple[ToolCall, ...]: st.lists(tool_calls, max_size=3).map(tuple),
    tuple[str, ...]: st.lists(st.text(max_size=8), max_size=3).map(tuple),
    ev.PayloadRef: st.builds(
        ev.PayloadRef, st.text(max_size=20), st.integers(0, 2**40), st.text(max_size=16)
    ),
}


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    if tp in BY_TYPE:
        return BY_TYPE[tp]
    args = typing.get_args(tp)
    if args and typing.get_origin(tp) is tuple and args[-1] is Ellipsis:  # tuple[X, ...]
        return st.lists(strategy_for(args[0]), max_size=2).map(tuple)
    if type(None) in args or len(args) > 1:  # X | None, or a union of tagged Structs (a fork's edit)
        return st.one_of(*(st.none() if a is type(None) else strategy_for(a) for a in args))
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return st.deferred(lambda: instances(tp))
    raise AssertionError(f"no strategy for field type {tp!r}: extend BY_TYPE")


def instances(cls: type) -> st.SearchStrategy[Any]:
    fields = {f.name: strategy_for(f.type) for f in msgspec.structs.fields(cls) if f.name != "v"}
    return st.builds(cls, **fields)


any_event = st.one_of(*(instances(cls) for cls in ev.EVENT_TYPES))
any_command = st.one_of(*(instances(cls) for cls in ev.COMMAND_TYPES))


# ── tests ─────────────────────────────────────────────────────────────────────────────────────────────


def test_the_union_has_every_required_kind():
    assert set(ev.EVENT_KINDS) == REQUIRED_KINDS
    assert set(ev.COMMAND_KINDS) == {"task", "cancel", "approve", "deny", "resume", "wake", "answer"}


@settings(max_examples=300, deadline=None)
@given(any_event)
def test_every_event_round_trips_through_msgpack_and_json(event: ev.Event):
    assert ev.decode(ev.encode(event)) == event
    assert ev.from_json(ev.to_json(event)) == event
    assert ev.from_json(ev.to_json(event, indent=2)) == event


@settings(max_examples=100, deadline=None)
@given(st.lists(any_event, min_size=1, max_size=5))
def test_a_group_of_events_is_one_message_that_decodes_to_each_of_them(events: list[ev.Event]):
    group = ev.encode_group([ev.encode(e) for e in events])
    assert ev.is_group(group) and ev.decode_all(group) == events
    assert not ev.is_group(ev.encode(events[0]))  # one event alone stays a message of its own, as always
    assert ev.decode_all(ev.encode(events[0])) == events[:1]


def test_a_broken_group_is_a_clear_error():
    one = ev.encode(ev.TurnCompleted(run_id="r", turn=1))
    with pytest.raises(ev.EventDecodeError, match="empty group"):
        ev.decode_all(ev.encode_group([]))
    with pytest.raises(ev.EventDecodeError, match="unknown event kind"):
        ev.decode_all(ev.encode_group([one, msgspec.msgpack.encode({"kind": "no.such", "run_id": "r"})]))
    with pytest.raises(ev.EventDecodeError, match="not a valid group"):
        ev.decode_all(ev.encode_group([one])[:-3])


@settings(max_examples=100, deadline=None)
@given(any_command)
def test_every_command_round_trips(command: ev.Command):
    assert ev.decode_command(ev.encode_command(command)) == command
    assert ev.command_from_json(ev.to_json(command)) == command


@settings(max_examples=100, deadline=None)
@given(any_event)
def test_the_wire_form_names_the_kind_and_the_schema_version(event: ev.Event):
    raw = msgspec.msgpack.decode(ev.encode(event))
    assert raw["kind"] == ev.kind_of(event) == type(event).__struct_config__.tag
    assert ev.EVENT_KINDS[raw["kind"]] is type(event)
    assert raw["v"] == ev.SCHEMA_VERSION  # always written, even though it is the default
    assert {"run_id", "seq", "ts", "actor"} <= set(raw)


def test_fields_from_a_newer_writer_are_ignored():
    call = {"id": "r/1.0", "name": "search", "arguments": {"q": "x"}, "priority": "high"}
    raw = {"kind": "tool.called", "run_id": "r", "seq": 4, "ts": 2.5, "v": 2, "shard": 7, "call": call}
    event = ev.decode(msgspec.msgpack.encode(raw))
    assert event == ev.ToolCalled(
        run_id="r", seq=4, ts=2.5, v=2, call=ToolCall("r/1.0", "search", {"q": "x"})
    )


def test_an_old_event_without_new_optional_fields_gets_their_defaults():
    raw = {"kind": "model.responded", "run_id": "r", "seq": 2, "ts": 1.0, "request_id": "r/1", "turn": 1}
    event = ev.decode(msgspec.msgpack.encode(raw))
    assert isinstance(event, ev.ModelResponded)
    assert event.calls == () and event.parse_error is None and event.ref is None
    assert event.v == ev.SCHEMA_VERSION


def test_an_unknown_kind_is_a_clear_error():
    data = msgspec.msgpack.encode({"kind": "tool.teleported", "run_id": "r", "seq": 0, "ts": 0.0, "v": 3})
    with pytest.raises(
        ev.EventDecodeError, match=r"unknown event kind 'tool\.teleported'.*schema v3"
    ) as info:
        ev.decode(data)
    assert "tool.completed" in str(info.value)  # lists what this reader knows
    with pytest.raises(ev.EventDecodeError, match="unknown command kind 'restart'"):
        ev.decode_command(msgspec.msgpack.encode({"kind": "restart"}))
    with pytest.raises(ev.EventDecodeError, match="unknown event kind"):
        ev.from_json('{"kind": "nope"}')


def test_an_invalid_event_names_its_kind_and_field():
    data = msgspec.msgpack.encode(
        {"kind": "turn.completed", "run_id": "r", "seq": 1, "ts": 1.0, "turn": "two"}
    )
    with pytest.raises(ev.EventDecodeError, match=r"invalid event 'turn\.completed'.*turn"):
        ev.decode(data)
    with pytest.raises(ev.EventDecodeError, match="not a valid event"):
        ev.decode(b"\xc1garbage")
    with pytest.raises(ev.EventDecodeError, match=r"invalid command 'task'.*input"):
        ev.decode_command(msgspec.msgpack.encode({"kind": "task", "agent": "a"}))


def test_a_task_carries_what_a_publisher_needs():
    task = ev.Task(
        agent="planner", input="summarise", task_id="t-1", timeout_s=30.0, metadata={"user": "ana"}
    )
    assert ev.decode_command(ev.encode_command(task)) == task
    assert ev.decode_command(ev.encode_command(ev.Task(agent="a", input="x"))).instance is None


BIG = "x" * 300_000
BIG_CALL = ToolCall("r/1.0", "write", {"text": BIG})
BIG_ERROR = ToolError("execution", BIG, 3)
BIG_EVENTS: dict[type, dict[str, Any]] = {
    ev.RunStarted: {"input": BIG, "metadata": {"note": BIG}},
    ev.RunForked: {"input": BIG, "metadata": {}, "source_run": "q", "source_seq": 4,
                   "edit": ev.OutputEdit(call_id="r/1.0", output=BIG)},
    ev.ModelRequested: {"request_id": "r/1", "turn": 1, "messages": (Message("tool", BIG),)},
    ev.ModelResponded: {"request_id": "r/1", "turn": 1, "text": BIG, "content": BIG, "calls": (BIG_CALL,)},
    ev.ModelFailed: {"request_id": "r/1", "turn": 1, "error": BIG},
    ev.ToolCalled: {"call": BIG_CALL},
    ev.ToolCompleted: {"call_id": "r/1.0", "tool": "t", "output": {"rows": ["w" * 1000] * 300}},
    ev.ToolFailed: {"call_id": "r/1.0", "tool": "t", "error": BIG_ERROR},
    ev.ScriptPrinted: {"call_id": "r/1.0", "tool": "t", "text": BIG},
    ev.ScriptFailed: {"call_id": "r/1.0", "tool": "t", "error": BIG_ERROR},
    ev.ApprovalRequested: {"call": BIG_CALL},
    ev.ApprovalGranted: {"call_id": "r/1.0", "arguments": {"text": BIG}},
    ev.ApprovalDenied: {"call_id": "r/1.0", "reason": BIG},
    ev.RunCompleted: {"output": ["v" * 1000] * 300},
    ev.RunFailed: {"reason": "x", "detail": BIG},
    ev.RunCancelled: {"reason": BIG},
}


@pytest.mark.parametrize("cls", list(ev.PAYLOAD_FIELDS), ids=lambda c: c.__struct_config__.tag)
def test_a_big_event_travels_as_a_stub_that_still_says_what_happened(cls: type):
    event = cls(run_id="r", seq=3, ts=9.0, actor="a", **BIG_EVENTS[cls])
    blob = ev.payload_bytes(event)
    ref = ev.PayloadRef(object_name="sha256-abc", size=len(blob), digest="abc")
    stub = ev.externalize(event, ref)
    assert len(ev.encode(stub)) < 400 and stub.ref == ref
    assert ev.internalize(ev.decode(ev.encode(stub)), blob) == event
    for call in [getattr(stub, "call", None), *getattr(stub, "calls", ())]:  # calls keep id and name
        if call is not None:
            assert (call.id, call.name, call.arguments) == ("r/1.0", "write", {})
    if len(ev.PAYLOAD_FIELDS[cls]) > 1:  # a payload that does not hold the kind's fields is refused
        with pytest.raises(ev.EventDecodeError, match="does not hold"):
            ev.internalize(stub, msgspec.msgpack.encode({"other": 1}))


def test_a_recorded_version_1_run_is_read_and_folds_as_it_did():
    """tests/data/run-v1.msgpack: a run recorded with schema version 1 (the in-process loop of that
    version, an instance actor `calc:alice`, parallel calls, a script, a terminal tool)."""
    from pathlib import Path

    from runtime import kernel
    from runtime.types import ToolSchema

    raw = msgspec.msgpack.decode((Path(__file__).parents[1] / "data" / "run-v1.msgpack").read_bytes())
    assert all(msgspec.msgpack.decode(b)["v"] == 1 and "agent" in msgspec.msgpack.decode(b) for b in raw)
    events = [ev.decode(b) for b in raw]
    assert {e.actor for e in events} == {"calc:alice"} and {e.v for e in events} == {1}
    names = {c.name for e in events if isinstance(e, ev.ModelResponded) for c in e.calls}
    schemas = tuple(ToolSchema(n, n, {"type": "object"}) for n in sorted(names | {"calculator", "lookup"}))
    state = kernel.fold(kernel.KernelConfig(system_prompt="You are a careful assistant.", tools=schemas,
                                            terminal_tool="submit_result", max_concurrent_tools=2), events)
    assert state.status == "completed" and state.output == {"answer": "5 in Paris"}
    assert state.actor == "calc:alice" and state.turns == 3
    # its script runs are entries of their own: every reader's expansion passes them through unchanged
    assert any(isinstance(e, ev.ScriptStarted) for e in events) and ev.expand_all(events) == events
    # re-written through the log, an upcast event is the current version
    assert ev.stamp(events[0], seq=0).v == ev.SCHEMA_VERSION
    # a version-1 stub's payload was its one big field, encoded alone
    v1_stub = msgspec.msgpack.encode({
        "kind": "tool.completed", "run_id": "r", "seq": 1, "ts": 1.0, "agent": "a", "v": 1,
        "call_id": "r/1.0", "tool": "t", "output": None,
        "ref": {"object_name": "o", "size": 3, "digest": "d"}})
    stub = ev.decode(v1_stub)
    assert stub.actor == "a" and ev.internalize(stub, msgspec.msgpack.encode([1, 2])).output == [1, 2]


def test_a_big_outcome_keeps_its_script_run_in_its_stub():
    """The worker caps what a run printed so its outcome fits one message; the stub keeps the run (what
    started where, what it printed), and its one big field is stored alone, as before the run rode in it."""
    run = ev.ScriptRun(started=1.0, worker="w1", printed=(ev.PrintedLine(1.5, "hi\n"),), ended=2.0,
                       duration_ms=1.0)
    event = ev.ToolCompleted(run_id="r", seq=3, ts=9.0, actor="a", call_id="r/1.0", tool="t",
                             output={"rows": ["w" * 1000] * 300}, script=run)
    blob = ev.payload_bytes(event)
    assert msgspec.msgpack.decode(blob) == event.output
    stub = ev.externalize(event, ev.PayloadRef(object_name="o", size=len(blob), digest="d"))
    assert stub.script == run and len(ev.encode(stub)) < 500
    assert ev.internalize(ev.decode(ev.encode(stub)), blob) == event
    assert [ev.kind_of(e) for e in ev.expand(stub)] == ["script.started", "script.printed",
                                                        "script.completed", "tool.completed"]


def test_tool_outcome_events_expose_a_tool_result():
    done = ev.ToolCompleted(run_id="r", seq=1, ts=1.0, call_id="c", tool="t", output=[1], duration_ms=2.0)
    assert ev.tool_result(done) == ToolResult(output=[1], duration_ms=2.0)
    assert ev.tool_result(ev.tool_outcome("r", "c", "t", ToolResult(output=[1], duration_ms=2.0))) == \
        ToolResult(output=[1], duration_ms=2.0)  # the inverse of tool_outcome
    err = ToolError("policy", "denied")
    failed = ev.ToolFailed(run_id="r", seq=1, ts=1.0, call_id="c", tool="t", error=err)
    assert ev.tool_result(failed).error == err


def test_json_for_humans_escapes_c1_control_characters_and_still_round_trips():
    """A model's text holding a C1 CSI (U+009B) or OSC (U+009D) must not reach a terminal raw through
    `sa replay --json`; the escaped JSON decodes to the very same event."""
    event = ev.stamp(ev.ModelResponded(run_id="r", request_id="r/1", turn=1, text="a\x9b31mred\x9d0;x\x07 é"),
                     seq=2, actor="a")
    text = ev.to_json(event)
    assert not any("\x80" <= ch <= "\x9f" for ch in text) and "\\u009b" in text and "é" in text
    assert ev.from_json(text) == event
