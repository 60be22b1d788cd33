"""Durable timers in the pure kernel: `timer.started` decided from the log, a timer call waiting like a call
for its result, `timer.fired` giving it one, and everything a runner needs to park a sleeping run; and the
in-process runner (`runtime.driver.local`), for which a timer is a plain wait."""

from __future__ import annotations

import pytest
from kernel_sim import Reply, Sim, schema, script, submit

from runtime import events as ev
from runtime import kernel as k
from runtime import timers
from runtime.types import ToolCall

TOOLS = (schema("search", q="string"), schema("submit_result", answer="string"),
         timers.TIMER_TOOLS["sleep"], timers.TIMER_TOOLS["wait_until"])


def config(**kw) -> k.KernelConfig:
    base = dict(system_prompt="You are terse.", tools=TOOLS, terminal_tool="submit_result", max_turns=5,
                timers=frozenset({"sleep", "wait_until"}))
    return k.KernelConfig(**{**base, **kw})


def sleeping(sim: Sim, *calls: tuple[str, dict]) -> Sim:
    """A run whose first reply made `calls`, stepped until nothing is pending."""
    sim.start()
    sim.run(script(Reply("", calls), submit("done")))
    return sim


def test_a_sleep_is_decided_from_the_log_and_waits_like_a_call_for_its_result():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (("sleep", {"seconds": 30}),))))  # model.requested, model.responded
    responded = sim.events[-1]
    [started] = k.decide(sim.state)
    assert isinstance(started, ev.TimerStarted)
    assert started.call_id == "run1/1.0" and started.tool == "sleep" and started.due == responded.ts + 30
    sim.append(started)
    assert k.decide(sim.state) == []  # nothing to do: the run sleeps
    assert k.pending_timers(sim.state) == (("run1/1.0", responded.ts + 30),)
    assert k.sleeping_until(sim.state) == responded.ts + 30
    assert k.next_timer(sim.state) is None  # not the host's own clock: the cluster wakes it

    sim.clock = started.due + 2.0
    fired = sim.emit(ev.TimerFired, call_id="run1/1.0", by="schedule")
    assert k.pending_timers(sim.state) == () and k.sleeping_until(sim.state) is None
    result = sim.state.turn.results["run1/1.0"]
    assert result.ok and result.output == {"due": timers.iso(started.due), "woke": timers.iso(fired.ts)}
    sim.run(script(submit("done")))
    assert sim.state.status == "completed" and sim.state.output == {"tool": "submit_result", "answer": "done"}
    tool_msg = next(m for m in sim.state.messages if m.role == "tool")
    assert '"woke"' in tool_msg.content and tool_msg.name == "sleep"


def test_a_replay_decides_the_same_timer():
    sim = sleeping(Sim(config()), ("sleep", {"seconds": 5}))
    i = next(i for i, e in enumerate(sim.events) if isinstance(e, ev.TimerStarted))
    decided = k.decide(k.fold(sim.config, sim.events[:i]))
    assert len(decided) == 1 and ev.same_fact(decided[0], sim.events[i])
    assert isinstance(decided[0], k.DECIDED_TYPES)


def test_wait_until_takes_a_zoned_instant_and_fires_at_once_for_one_in_the_past():
    sim = sleeping(Sim(config(), clock=1893400000.0), ("wait_until", {"time": "2030-01-01T09:00:00+01:00"}))
    [started] = [e for e in sim.events if isinstance(e, ev.TimerStarted)]
    assert started.due == timers.parse_instant("2030-01-01T08:00:00Z") == 1893484800.0
    past = sleeping(Sim(config(), clock=1893400000.0), ("wait_until", {"time": "1999-12-31T23:59:59Z"}))
    [started] = [e for e in past.events if isinstance(e, ev.TimerStarted)]
    assert started.due == past.events[started.seq - 1].ts  # due now: the runner wakes it at once


@pytest.mark.parametrize(("name", "args", "message"), [
    ("wait_until", {"time": "2030-01-01T09:00:00"}, "names no time zone"),
    ("wait_until", {"time": "soon"}, "not an ISO 8601 time"),
    ("sleep", {"seconds": -1}, "at least 0"),
    ("sleep", {"seconds": "10"}, "a number of seconds"),
    ("sleep", {"seconds": 10 * 366 * 86400}, "at most 366 days"),
])
def test_bad_timer_arguments_are_the_calls_error(name, args, message):
    sim = sleeping(Sim(config()), (name, args))
    failed = next(e for e in sim.events if isinstance(e, ev.ToolFailed))
    assert failed.tool == name and failed.error.kind == "input" and message in failed.error.message
    assert not any(isinstance(e, ev.TimerStarted) for e in sim.events)
    assert sim.state.status == "completed"  # the model read the error and answered


def test_a_timer_past_the_deadline_is_refused_saying_how_long_is_left():
    sim = Sim(config()).start(timeout_s=60)
    sim.run(script(Reply("", (("sleep", {"seconds": 3600}),)), submit("gave up")))
    failed = next(e for e in sim.events if isinstance(e, ev.ToolFailed))
    assert "would pass the task's deadline" in failed.error.message and "wait at most" in failed.error.message


def test_a_sleep_beside_a_tool_call_sleeps_only_once_the_call_is_answered():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (("sleep", {"seconds": 9}), ("search", {"q": "x"})))))
    decided = k.decide(sim.state)
    assert [type(d) for d in decided] == [ev.TimerStarted, k.CallTools]
    sim.append(decided[0])
    sim.emit(ev.ToolCalled, call=decided[1].calls[0])
    assert k.sleeping_until(sim.state) is None  # the search is still out
    sim.emit(ev.ToolCompleted, call_id="run1/1.1", tool="search", output="found")
    assert k.sleeping_until(sim.state) == decided[0].due
    sim.emit(ev.TimerFired, call_id="run1/1.0")
    [done] = k.decide(sim.state)
    assert isinstance(done, ev.TurnCompleted) and done.calls_ok == 2


def test_calls_one_at_a_time_wait_behind_a_sleep():
    sim = Sim(config(max_concurrent_tools=1)).start()
    sim.step(script(Reply("", (("sleep", {"seconds": 9}), ("search", {"q": "x"})))))
    [started] = k.decide(sim.state)
    sim.append(started)
    assert k.decide(sim.state) == [] and k.sleeping_until(sim.state) == started.due
    sim.emit(ev.TimerFired, call_id="run1/1.0")
    [tools] = k.decide(sim.state)
    assert isinstance(tools, k.CallTools) and [c.name for c in tools.calls] == ["search"]


def test_timer_events_fold_idempotently():
    sim = sleeping(Sim(config()), ("sleep", {"seconds": 5}))
    before = sim.state
    sim.emit(ev.TimerFired, call_id="run1/9.9")  # a wake for a timer that never started
    assert sim.state.turn == before.turn
    sim.emit(ev.TimerStarted, call_id="run1/1.0", tool="sleep", due=1.0)  # a second start: ignored
    assert k.pending_timers(sim.state) == k.pending_timers(before)
    sim.emit(ev.TimerFired, call_id="run1/1.0", by="schedule")
    result = sim.state.turn.results["run1/1.0"]
    sim.emit(ev.TimerFired, call_id="run1/1.0", by="host")  # a second wake: changes nothing
    assert sim.state.turn.results["run1/1.0"] is result


def test_a_cancelled_sleeping_run_has_no_pending_timer():
    sim = sleeping(Sim(config()), ("sleep", {"seconds": 5}))
    assert k.pending_timers(sim.state)
    sim.emit(ev.RunCancelled, reason="enough", by="ops")
    assert sim.state.status == "cancelled" and k.pending_timers(sim.state) == ()
    assert k.sleeping_until(sim.state) is None


def test_a_timer_is_only_a_timer_when_the_config_says_so():
    with pytest.raises(ValueError, match="timers"):
        k.KernelConfig(tools=TOOLS[:2], timers=frozenset({"sleep"}))  # not among the tools
    with pytest.raises(ValueError, match="timers"):
        k.KernelConfig(tools=TOOLS, timers=frozenset({"search"}))  # not a timer
    cfg = config(timers=frozenset())  # `sleep` offered as a plain tool: a worker runs it
    sim = Sim(cfg).start()
    sim.step(script(Reply("", (("sleep", {"seconds": 5}),))))
    [tools] = k.decide(sim.state)
    assert isinstance(tools, k.CallTools)


def test_timer_events_and_the_wake_command_round_trip():
    started = ev.stamp(ev.TimerStarted(run_id="r", call_id="r/1.0", tool="sleep", due=12.5), seq=3, ts=2.0)
    fired = ev.stamp(ev.TimerFired(run_id="r", call_id="r/1.0", by="schedule"), seq=4, ts=13.0)
    for e in (started, fired):
        assert ev.decode(ev.encode(e)) == e and ev.from_json(ev.to_json(e)) == e
    wake = ev.Wake(run_id="r", call_id="r/1.0")
    assert ev.decode_command(ev.encode_command(wake)) == wake
    assert ev.command_from_json('{"kind": "wake", "run_id": "r", "call_id": "r/1.0"}') == wake
    from runtime.commands import BadCommand, decode

    assert decode("napper", ev.encode_command(wake), "scheduler").command == wake
    with pytest.raises(BadCommand, match="cluster's clock only"):  # an operator cannot wake a timer early
        decode("napper", ev.encode_command(wake), "mallory")


def test_iso_and_parse_instant_agree_with_the_calendar():
    assert timers.iso(0) == "1970-01-01T00:00:00Z" and timers.iso(951782400.25) == "2000-02-29T00:00:00.250Z"
    assert timers.parse_instant("2000-02-29T00:00:00.250Z") == 951782400.25
    assert timers.parse_instant("2024-03-01T01:00:00+01:00") == timers.parse_instant("2024-03-01T00:00:00Z")
    with pytest.raises(ValueError, match="has no day 29"):
        timers.parse_instant("2023-02-29T00:00:00Z")
    assert isinstance(timers.due_of(ToolCall("c", "nap", {}), 0.0), timers.ToolError)


@pytest.mark.anyio
async def test_in_one_process_a_timer_is_a_plain_wait():
    from runtime.driver.local import run_task
    from runtime.model.adapters import get_adapter
    from runtime.model.client import ModelClient
    from runtime.testing import ScriptedModelServer

    hermes = get_adapter("hermes")
    cfg = k.KernelConfig(tools=(timers.TIMER_TOOLS["sleep"],), timers=frozenset({"sleep"}))
    with ScriptedModelServer([hermes.format_call("sleep", {"seconds": 0.2}), "rested"]) as server:
        client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        try:
            outcome = await run_task(ev.Task(agent="napper", input="rest a little"), cfg, client=client,
                                     adapter=hermes, tools=[])
        finally:
            await client.aclose()
    assert outcome.status == "completed" and outcome.output == "rested"
    kinds = [ev.kind_of(e) for e in outcome.events]
    assert kinds[3:5] == ["timer.started", "timer.fired"]
    started, fired = outcome.events[3], outcome.events[4]
    assert fired.by == "loop" and fired.ts >= started.due  # it woke once the timer was due
    assert k.fold(cfg, outcome.events).status == "completed"
