"""The pure kernel: termination, pending effects and recovery, idempotent folding, policies, approvals."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from kernel_sim import Reply, Sim, echo_tool, schema, script, submit

from runtime import events as ev
from runtime import kernel as k
from runtime.client.verify import verify
from runtime.policies import ReadBeforeWritePolicy, SequentialDependencyPolicy
from runtime.types import ToolCall, ToolResult

TOOLS = (
    schema("search", q="string"),
    schema("submit_result", answer="string"),
    schema("build"),
    schema("deploy"),
)


def config(**kw) -> k.KernelConfig:
    base = dict(
        system_prompt="You are terse.",
        tools=TOOLS,
        terminal_tool="submit_result",
        max_turns=5,
        max_consecutive_errors=3,
        max_concurrent_tools=4,
    )
    return k.KernelConfig(**{**base, **kw})


def call(name: str, **args) -> tuple[str, dict]:
    return (name, args)


# ── purity ────────────────────────────────────────────────────────────────────────────────────────────

PURE_MODULES = ["kernel", "events", "policies", "history", "types", "approval_policy", "timers",
                "questions"]
FORBIDDEN = {
    "nats",
    "openai",
    "pydantic_monty",
    "xgrammar",
    "time",
    "random",
    "uuid",
    "datetime",
    "os",
    "socket",
    "asyncio",
    "anyio",
    "httpx",
    "subprocess",
    "threading",
    "secrets",
}


def _imports(module: str) -> set[str]:
    tree = ast.parse((Path(__file__).parents[2] / "runtime" / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "runtime":
            names |= {f"runtime.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_kernel_and_everything_it_imports_do_no_io():
    seen, todo = set(), ["kernel"]
    while todo:
        module = todo.pop()
        seen.add(module)
        for name in _imports(module):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"runtime/{module}.py imports {name}"
            if top == "runtime":
                sub = name.split(".")[1] if "." in name else None
                assert sub in PURE_MODULES, f"runtime/{module}.py imports {name}, not a pure module"
                if sub not in seen:
                    todo.append(sub)
    assert seen == set(PURE_MODULES)


# ── termination ───────────────────────────────────────────────────────────────────────────────────────


def test_a_reply_without_calls_is_the_final_answer_of_a_run_without_a_terminal_tool():
    sim = Sim(config(terminal_tool=None)).start().run(script(Reply("Paris")))
    assert sim.kinds() == [
        "run.started",
        "model.requested",
        "model.responded",
        "turn.completed",
        "run.completed",
    ]
    assert sim.state.status == "completed" and sim.state.output == "Paris"
    first_request = sim.events[1]
    assert [m.role for m in first_request.messages] == ["system", "user"]
    assert first_request.messages[1].content == "do the task"
    assert sim.state.usage.prompt_tokens == 10


TEXT = "I am not a tool call at all }}}{{"


def test_a_reply_in_text_does_not_end_a_run_that_must_end_through_its_terminal_tool():
    """Issue 36: with a terminal tool, text is a model error the model is told about, then may retry."""
    sim = Sim(config()).start().run(script(Reply(TEXT), submit("42")))
    assert sim.state.status == "completed" and sim.state.output == {"tool": "submit_result", "answer": "42"}
    assert not any(isinstance(e, ev.RunCompleted) and e.output == TEXT for e in sim.events)
    retry = [e for e in sim.events if isinstance(e, ev.ModelRequested)][1]
    said, told = retry.messages  # recorded in the log: what the model wrote, then what it was told
    assert (said.role, said.content) == ("assistant", TEXT)
    assert told.role == "user" and "Error [no_terminal_call]" in told.content
    assert "Call the tool submit_result" in told.content
    first_turn = next(e for e in sim.events if isinstance(e, ev.TurnCompleted))
    assert (first_turn.calls_ok, first_turn.calls_failed) == (0, 0)
    assert verify(sim.config, sim.events).ok


def test_a_model_that_only_answers_in_text_fails_the_run_naming_the_terminal_tool():
    sim = Sim(config(max_consecutive_errors=3)).start().run(script(Reply(TEXT)))
    assert sim.state.status == "failed" and not any(isinstance(e, ev.RunCompleted) for e in sim.events)
    end = sim.events[-1]
    assert isinstance(end, ev.RunFailed) and end.reason == k.NO_TERMINAL_CALL == "no_terminal_call"
    assert "'submit_result'" in end.detail and "3 errors in a row (limit 3)" in end.detail
    assert TEXT in end.detail  # what the model said last, to debug it
    assert sim.state.turns == 3 and sim.state.reason.startswith("no_terminal_call: ")
    report = verify(sim.config, sim.events)
    assert report.ok and report.checked >= 4, report.problems


def test_text_on_the_forced_last_turn_fails_no_terminal_call_after_max_turns():
    model = script(Reply("", (call("search", q="x"),)), Reply(TEXT))
    sim = Sim(config(max_turns=2, max_consecutive_errors=5)).start().run(model)
    assert _offered_per_turn(sim)[-1] == (2, ("submit_result",))
    end = sim.events[-1]
    assert end.reason == "no_terminal_call" and "2 turns (limit 2)" in end.detail


def test_text_between_tool_calls_counts_as_an_error_and_a_success_resets_it():
    model = script(Reply(TEXT), Reply("", (call("search", q="x"),)), Reply(TEXT), Reply(TEXT), submit("y"))
    sim = Sim(config(max_turns=10, max_consecutive_errors=3)).start().run(model)
    assert sim.state.status == "completed" and sim.state.turns == 5
    failing = Sim(config(max_turns=10, max_consecutive_errors=2)).start().run(
        script(Reply("", (call("rm_rf"),)), Reply(TEXT)))
    assert failing.events[-1].reason == "no_terminal_call"  # an unknown tool, then text: 2 errors in a row


def test_a_log_that_completed_on_text_under_a_terminal_tool_no_longer_verifies():
    """What the old kernel wrote for a text reply (run.completed with the text): the log still folds, but
    `verify` shows the kernel decides otherwise; without a terminal tool the same log verifies as before."""
    plain = Sim(config(terminal_tool=None)).start().run(script(Reply(TEXT)))
    assert plain.events[-1] == ev.stamp(ev.RunCompleted(run_id="run1", output=TEXT), seq=plain.events[-1].seq,
                                        ts=plain.events[-1].ts, actor="tester")
    assert verify(plain.config, plain.events).ok
    assert k.fold(config(), plain.events).status == "completed"
    report = verify(config(), plain.events)
    assert not report.ok and any("run.completed" in p for p in report.problems), report.problems


def test_tool_results_join_the_conversation_in_call_order_and_the_terminal_tool_ends_the_run():
    replies = script(
        Reply("looking", (call("search", q="a"), call("search", q="b"))),
        Reply("", (call("submit_result", answer="42"),)),
    )
    sim = Sim(config()).start().run(replies)
    assert sim.state.status == "completed"
    assert sim.state.output == {"tool": "submit_result", "answer": "42"}
    called = [e.call.id for e in sim.events if isinstance(e, ev.ToolCalled)]
    assert called == ["run1/1.0", "run1/1.1", "run1/2.0"]
    second_request = [e for e in sim.events if isinstance(e, ev.ModelRequested)][1]
    roles = [m.role for m in second_request.messages]
    assert roles == ["assistant", "tool", "tool"]  # only what was added since the first request
    assert [m.tool_call_id for m in second_request.messages[1:]] == ["run1/1.0", "run1/1.1"]
    assert '"q": "b"' in second_request.messages[2].content


def test_a_failed_terminal_call_does_not_end_the_run():
    def tool(c: ToolCall) -> ToolResult:
        if c.name == "submit_result" and c.arguments["answer"] == "bad":
            return ToolResult.failure("output", "answer must be a number")
        return echo_tool(c)

    replies = script(
        Reply("", (call("submit_result", answer="bad"),)), Reply("", (call("submit_result", answer="7"),))
    )
    sim = Sim(config()).start().run(replies, tool)
    assert sim.state.output == {"tool": "submit_result", "answer": "7"}
    assert sim.state.turns == 2
    tool_msg = next(m for m in sim.state.messages if m.role == "tool")
    assert tool_msg.content == "Error [output]: answer must be a number"


def test_max_turns_fails_the_run():
    sim = Sim(config(max_turns=3)).start().run(script(Reply("", (call("search", q="x"),))))
    assert sim.state.status == "failed" and sim.state.turns == 3
    assert isinstance(sim.events[-1], ev.RunFailed) and sim.events[-1].reason == "max_turns"


def _offered_per_turn(sim: Sim) -> list[tuple[int, tuple[str, ...]]]:
    return [
        (f.turn, tuple(t.name for t in f.tools))
        for _, effects in sim.decisions
        for f in effects
        if isinstance(f, k.CallModel)
    ]


def test_the_last_turn_offers_only_the_terminal_tool_so_the_run_ends_with_an_answer():
    def model(effect: k.CallModel) -> Reply:
        if [t.name for t in effect.tools] == ["submit_result"]:
            return Reply("", (call("submit_result", answer="42"),))
        return Reply("", (call("search", q="again"),))

    sim = Sim(config(max_turns=3)).start().run(model)
    everything = tuple(t.name for t in TOOLS)
    assert _offered_per_turn(sim) == [(1, everything), (2, everything), (3, ("submit_result",))]
    assert sim.state.status == "completed" and sim.state.output == {"tool": "submit_result", "answer": "42"}


def test_another_tool_called_in_the_forced_turn_is_denied_not_run():
    ran: list[str] = []

    def tool(c: ToolCall) -> ToolResult:
        ran.append(c.id)
        return echo_tool(c)

    sim = Sim(config(max_turns=2)).start().run(script(Reply("", (call("search", q="x"),))), tool)
    assert ran == ["run1/1.0"] and sim.events[-1].reason == "max_turns"
    denied = [e for e in sim.events if isinstance(e, ev.ToolFailed)]
    assert [(e.call_id, e.error.kind, e.error.detail) for e in denied] == [
        ("run1/2.0", "policy", "last_turn")
    ]
    assert "call submit_result" in denied[0].error.message


@pytest.mark.parametrize(
    "cfg", [config(max_turns=2, force_terminal_on_last_turn=False), config(max_turns=2, terminal_tool=None)]
)
def test_no_forcing_when_turned_off_or_without_a_terminal_tool(cfg: k.KernelConfig):
    sim = Sim(cfg).start().run(script(Reply("", (call("search", q="x"),))))
    assert [names for _, names in _offered_per_turn(sim)] == [tuple(t.name for t in TOOLS)] * 2
    assert sim.events[-1].reason == "max_turns" and not any(isinstance(e, ev.ToolFailed) for e in sim.events)


def test_a_single_turn_budget_forces_the_first_request():
    sim = Sim(config(max_turns=1)).start().run(script(Reply("", (call("submit_result", answer="y"),))))
    assert _offered_per_turn(sim) == [(1, ("submit_result",))] and sim.state.status == "completed"


def test_consecutive_model_failures_fail_the_run_and_retries_get_new_ids():
    sim = Sim(config(max_consecutive_errors=3)).start().run(script(Reply(fail="HTTP 503")))
    requests = [e.request_id for e in sim.events if isinstance(e, ev.ModelRequested)]
    assert requests == ["run1/1", "run1/1#1", "run1/1#2"]
    assert sim.events[-1].reason == "consecutive_errors"


def test_a_turn_with_a_success_resets_the_error_count():
    def tool(c: ToolCall) -> ToolResult:
        ok = c.name == "submit_result" or c.arguments.get("q") == "ok"
        return echo_tool(c) if ok else ToolResult.failure("execution", "boom")

    def replies():
        bad, good = (
            Reply("", (call("search", q="no"),)),
            Reply("", (call("search", q="ok"), call("search", q="no"))),
        )
        return script(bad, bad, good, bad, bad, submit("done"))

    sim = Sim(config(max_turns=10, max_consecutive_errors=3)).start().run(replies(), tool)
    assert sim.state.status == "completed" and sim.state.output == {"tool": "submit_result", "answer": "done"}
    sim = Sim(config(max_turns=10, max_consecutive_errors=2)).start().run(replies(), tool)
    assert sim.state.status == "failed" and sim.state.turns == 2


def test_an_unparseable_reply_is_shown_to_the_model_and_counts_as_an_error():
    sim = Sim(config()).start().run(script(Reply(garbled="<tool_call>{oops"), submit("fine")))
    assert sim.state.output == {"tool": "submit_result", "answer": "fine"}
    told = [e for e in sim.events if isinstance(e, ev.ModelRequested)][1].messages
    assert told[0].role == "assistant" and told[0].content == "<tool_call>{oops"
    assert told[1].role == "user" and "no closing tag" in told[1].content
    sim = Sim(config(max_consecutive_errors=2)).start().run(script(Reply(garbled="???")))
    assert sim.events[-1].reason == "consecutive_errors"


def test_the_deadline_compares_against_event_timestamps():
    sim = (
        Sim(config(max_turns=50), tick=10.0)
        .start(timeout_s=45)
        .run(script(Reply("", (call("search", q="x"),))))
    )
    assert sim.events[-1].reason == "deadline"
    assert sim.events[-2].ts >= sim.events[0].ts + 45 > sim.events[-3].ts
    fast = Sim(config(), tick=1.0).start(timeout_s=45).run(script(submit("ok")))
    assert fast.state.status == "completed"


def test_a_final_answer_wins_over_a_deadline_that_passed_while_ending_the_turn():
    sim = Sim(config(terminal_tool=None), tick=10.0).start(timeout_s=25)
    sim.step(script(Reply("the answer")))  # requested (t+10), responded (t+20)
    sim.step(script(Reply("unused")))  # turn.completed at t+30: past the deadline
    assert k.decide(sim.state) == [ev.RunCompleted(run_id="run1", output="the answer")]


def test_cancellation_stops_the_run_and_later_events_change_nothing():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (call("search", q="x"),))))
    sim.emit(ev.RunCancelled, reason="user asked", by="cli")
    assert sim.state.status == "cancelled" and k.decide(sim.state) == []
    before = sim.state
    sim.emit(ev.ToolCompleted, call_id="run1/1.0", tool="search", output="late")
    assert k.decide(sim.state) == [] and sim.state.turn == before.turn


# ── pending effects and recovery ──────────────────────────────────────────────────────────────────────


def test_decide_repeats_an_unanswered_model_call_with_nothing_new_to_record():
    sim = Sim(config()).start()
    [first] = k.decide(sim.state)
    assert isinstance(first, k.CallModel) and first.id == "run1/1" and len(first.new_messages) == 2
    sim.emit(ev.ModelRequested, request_id=first.id, turn=1, messages=first.new_messages)
    [again] = k.decide(sim.state)
    assert again == dataclasses.replace(first, new_messages=())
    assert again.messages == first.messages  # the prompt to send is unchanged


def test_recovery_reissues_only_unresolved_calls():
    sim = Sim(config(max_concurrent_tools=4)).start()
    sim.step(script(Reply("", (call("search", q="a"), call("search", q="b"), call("search", q="c")))))
    [tools] = k.decide(sim.state)
    for c in tools.calls:
        sim.emit(ev.ToolCalled, call=c)
    sim.emit(ev.ToolCompleted, call_id="run1/1.1", tool="search", output="b!")
    # the host crashes here; a new one folds the log and decides
    recovered = k.fold(sim.config, list(sim.events))
    [again] = k.decide(recovered)
    assert isinstance(again, k.CallTools) and [c.id for c in again.calls] == ["run1/1.0", "run1/1.2"]
    assert again.id == tools.id == "run1/1/tools"


def test_a_second_result_for_the_same_call_changes_nothing():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (call("search", q="a"),))))
    sim.step(script(Reply("x")))  # tool.called + tool.completed
    once = sim.state
    sim.emit(ev.ToolFailed, call_id="run1/1.0", tool="search", error=ToolResult.failure("crashed", "x").error)
    assert sim.state.turn == once.turn and sim.state.policy_states == once.policy_states
    assert sim.state.seq == once.seq + 1


def test_duplicates_are_ignored_and_gaps_other_runs_and_headless_logs_raise():
    sim = Sim(config()).start().run(script(Reply("", (call("search", q="a"),)), Reply("done")))
    final = sim.state
    assert k.evolve(final, sim.events[3]) is final  # redelivered
    late = ev.RunCancelled(run_id="run1", seq=final.seq + 1, ts=1.0)
    with pytest.raises(k.EvolveError, match="gap"):
        k.evolve(final, late)
    with pytest.raises(k.EvolveError, match="folded into run"):
        k.evolve(final, ev.RunCancelled(run_id="run2", seq=final.seq, ts=1.0))
    with pytest.raises(k.EvolveError, match=r"before run\.started"):
        k.evolve(k.initial(sim.config), ev.RunCancelled(run_id="run1", seq=0, ts=1.0))


def test_evolve_leaves_its_input_untouched():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (call("search", q="a"),))))
    state = sim.state
    snapshot = (state.messages, state.turn, state.seq, dict(state.turn.results))
    k.evolve(state, ev.ToolCompleted(run_id="run1", seq=state.seq, ts=5.0, call_id="run1/1.0", tool="search"))
    assert (state.messages, state.turn, state.seq, dict(state.turn.results)) == snapshot
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.seq = 99  # type: ignore[misc]


# ── calls the kernel refuses ──────────────────────────────────────────────────────────────────────────


def test_an_unknown_tool_becomes_an_input_error_the_model_reads():
    sim = Sim(config()).start().run(script(Reply("", (call("rm_rf", path="/"),)), submit("sorry")))
    failed = [e for e in sim.events if isinstance(e, ev.ToolFailed)]
    assert failed[0].error.kind == "input" and "unknown tool 'rm_rf'" in failed[0].error.message
    assert [e.call.name for e in sim.events if isinstance(e, ev.ToolCalled)] == ["submit_result"]
    told = next(m for m in sim.state.messages if m.role == "tool")
    assert "available tools: build, deploy, search, submit_result" in told.content


def test_sequential_dependency_in_sequential_mode_sees_earlier_results_of_the_same_turn():
    cfg = config(policies=(SequentialDependencyPolicy({"deploy": ["build"]}),), max_concurrent_tools=1)
    sim = (
        Sim(cfg).start().run(script(Reply("", (call("deploy"), call("build"), call("deploy"))), Reply("ok")))
    )
    outcome = {
        e.call_id: ev.kind_of(e) for e in sim.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)
    }
    assert outcome == {"run1/1.0": "tool.failed", "run1/1.1": "tool.completed", "run1/1.2": "tool.completed"}
    denial = next(e for e in sim.events if isinstance(e, ev.ToolFailed))
    assert denial.error.kind == "policy" and "deploy requires build" in denial.error.message
    # sequential mode: one call per CallTools, each decided after the previous result
    assert all(
        len(e.calls) == 1 for _, effects in sim.decisions for e in effects if isinstance(e, k.CallTools)
    )


def test_concurrent_mode_checks_a_turn_against_the_policy_state_at_the_reply():
    cfg = config(policies=(SequentialDependencyPolicy({"deploy": ["build"]}),), max_concurrent_tools=4)
    sim = (
        Sim(cfg)
        .start()
        .run(script(Reply("", (call("build"), call("deploy"))), Reply("", (call("deploy"),)), Reply("ok")))
    )
    results = [
        (e.call_id, ev.kind_of(e)) for e in sim.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)
    ]
    assert results == [
        ("run1/1.1", "tool.failed"),
        ("run1/1.0", "tool.completed"),
        ("run1/2.0", "tool.completed"),
    ]


def test_read_before_write():
    tools = (schema("read_file", path="string"), schema("write_file", path="string", text="string"))
    cfg = k.KernelConfig(tools=tools, policies=(ReadBeforeWritePolicy(),), max_concurrent_tools=1)

    def tool(c: ToolCall) -> ToolResult:
        if c.name == "read_file" and c.arguments["path"] == "new.txt":
            return ToolResult.failure("execution", "no such file")
        return echo_tool(c)

    replies = script(
        Reply(
            "",
            (
                call("write_file", path="a.txt", text="x"),
                call("read_file", path="a.txt"),
                call("write_file", path="a.txt", text="y"),
                call("read_file", path="new.txt"),
                call("write_file", path="new.txt", text="z"),
            ),
        ),
        Reply("ok"),
    )
    sim = Sim(cfg).start().run(replies, tool)
    kinds = [
        (e.call_id[-1], ev.kind_of(e)) for e in sim.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)
    ]
    assert kinds == [
        ("0", "tool.failed"),
        ("1", "tool.completed"),
        ("2", "tool.completed"),
        ("3", "tool.failed"),
        ("4", "tool.completed"),
    ]
    first_denial = next(e for e in sim.events if isinstance(e, ev.ToolFailed))
    assert "read 'a.txt' with read_file before writing it with write_file" in first_denial.error.message


class Exploding:
    name = "exploding"

    def __init__(self, where: str) -> None:
        self.where = where

    def initial(self) -> int:
        return 0

    def check(self, state: int, call: ToolCall) -> str | None:
        if self.where == "check":
            raise RuntimeError("bug in check")
        return None

    def update(self, state: int, call: ToolCall, result: ToolResult) -> int:
        if self.where == "update":
            raise KeyError("bug in update")
        return state + 1


@pytest.mark.parametrize("where", ["check", "update"])
def test_a_raising_policy_denies_fail_closed(where: str):
    cfg = config(policies=(Exploding(where),), max_concurrent_tools=1)
    sim = Sim(cfg).start().run(script(Reply("", (call("search", q="1"), call("search", q="2"))), Reply("ok")))
    results = [e for e in sim.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)]
    if where == "check":
        assert all(isinstance(r, ev.ToolFailed) and r.error.kind == "policy" for r in results)
        assert "RuntimeError: bug in check" in results[0].error.message
    else:  # the first call ran, its update broke the policy, the second call is refused
        assert isinstance(results[0], ev.ToolCompleted) and isinstance(results[1], ev.ToolFailed)
        assert "out of order" in results[1].error.message and "KeyError" in results[1].error.message


def test_approval_waits_then_runs_or_fails_with_a_policy_error():
    cfg = config(requires_approval=frozenset({"deploy"}))
    sim = Sim(cfg).start()
    sim.step(script(Reply("", (call("deploy"), call("search", q="s")))))
    effects = k.decide(sim.state)
    assert [type(e) for e in effects] == [ev.ApprovalRequested, k.CallTools]
    assert [c.name for c in effects[1].calls] == ["search"]
    sim.step(script(Reply("-")))  # approval.requested, search runs; nobody has answered yet
    assert k.decide(sim.state) == []  # waiting on a human: nothing pending
    sim.emit(ev.ApprovalGranted, call_id="run1/1.0", by="ops")
    [run] = k.decide(sim.state)
    assert isinstance(run, k.CallTools) and [c.name for c in run.calls] == ["deploy"]

    denied = (
        Sim(cfg)
        .start()
        .run(script(Reply("", (call("deploy"),)), submit("ok")), approver=lambda c: "not today")
    )
    failure = next(e for e in denied.events if isinstance(e, ev.ToolFailed))
    assert failure.error.kind == "policy" and failure.error.detail == "approval"
    assert "not today" in failure.error.message
    assert denied.state.output == {"tool": "submit_result", "answer": "ok"}


# ── events stay small ─────────────────────────────────────────────────────────────────────────────────


def test_model_requests_grow_linearly_over_a_long_run():
    cfg = config(max_turns=30)
    turn = iter(range(1000))

    def model(effect: k.CallModel) -> Reply:
        n = next(turn)
        return (
            Reply("", (call("search", q=f"query {n}"),))
            if n < 29
            else Reply("", (call("submit_result", answer="x"),))
        )

    sim = Sim(cfg).start().run(model, lambda c: ToolResult(output="r" * 500))
    assert sim.state.status == "completed" and sim.state.turns == 30
    sizes = [len(ev.encode(e)) for e in sim.events if isinstance(e, ev.ModelRequested)]
    assert len(sizes) == 30
    assert max(sizes[1:]) < 2 * min(sizes[1:])  # each request records one exchange, not the prompt
    per_turn, size = [], 0  # bytes of all events between two turn.completed
    for e in sim.events:
        size += len(ev.encode(e))
        if isinstance(e, ev.TurnCompleted):
            per_turn, size = [*per_turn, size], 0
    assert len(per_turn) == 30
    assert per_turn[28] < 1.2 * per_turn[1]  # turn 29 costs what turn 2 cost: the log grows linearly
    # while the prompt the kernel hands the runner does grow with the conversation
    last_request = max(i for i, e in enumerate(sim.events) if isinstance(e, ev.ModelRequested))
    [prompt] = k.decide(k.fold(cfg, sim.events[:last_request]))
    assert isinstance(prompt, k.CallModel) and len(prompt.messages) == 2 + 29 * 2


def test_config_validation():
    with pytest.raises(ValueError, match="terminal_tool"):
        k.KernelConfig(tools=TOOLS, terminal_tool="nope")
    with pytest.raises(ValueError, match="max_turns"):
        k.KernelConfig(max_turns=0)
    with pytest.raises(ValueError, match="duplicate"):
        k.KernelConfig(tools=(TOOLS[0], TOOLS[0]))


def test_the_kernels_replace_makes_what_dataclasses_replace_makes():
    """`kernel.replace` skips `__init__` for speed: the copies must equal `dataclasses.replace`'s, leave the
    original untouched, and refuse a field the class does not have."""
    sim = Sim(config()).start()
    sim.step(script(Reply(calls=(call(TOOLS[0].name, x=1),))))
    state = sim.state
    assert state.turn is not None
    fast = k.replace(state, turns=7, turn=k.replace(state.turn, responded=True))
    slow = dataclasses.replace(state, turns=7, turn=dataclasses.replace(state.turn, responded=True))
    assert fast == slow and type(fast) is k.State and fast.turn is not state.turn
    assert state.turns != 7 and fast.messages is state.messages
    with pytest.raises(TypeError, match="no field"):
        k.replace(state, turnz=1)
