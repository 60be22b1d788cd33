"""Questions to a person in the pure kernel: `question.asked` decided from the log, the `ask_human` call
waiting like a call for its result, `question.answered` giving it one, the timeout's default (or error)
decided from timestamps, what a runner needs to park the run, and `verify` reproducing all of it; and the
in-process runner (`runtime.driver.local`), where an `answerer` callback answers."""

from __future__ import annotations

import pytest
from kernel_sim import Reply, Sim, schema, script, submit

from runtime import events as ev
from runtime import kernel as k
from runtime import questions
from runtime.client.verify import verify

TOOLS = (schema("search", q="string"), schema("submit_result", answer="string"), questions.ASK_HUMAN_TOOL)
YES_NO = {"type": "string", "enum": ["yes", "no"]}


def config(timeout_s: float | None = None, **default) -> k.KernelConfig:
    q = questions.QuestionsConfig(timeout_s=timeout_s, default=default.get("default"),
                                  has_default="default" in default)
    return k.KernelConfig(system_prompt="You are terse.", tools=TOOLS, terminal_tool="submit_result",
                          max_turns=5, questions=q)


def asking(sim: Sim, args: dict | None = None, *, timeout_s: float | None = None) -> ev.QuestionAsked:
    """Start the run, let the model call ask_human with `args`, record the question."""
    sim.start(timeout_s=timeout_s)
    sim.step(script(Reply("", (("ask_human", args or {"question": "Ship it?", "answer_schema": YES_NO}),))))
    [asked] = k.decide(sim.state)
    assert isinstance(asked, ev.QuestionAsked)
    sim.append(asked)
    return asked


def test_a_question_is_decided_from_the_log_and_waits_for_its_answer():
    sim = Sim(config())
    asked = asking(sim)
    assert asked.call_id == "run1/1.0" and asked.question == "Ship it?" and asked.schema == YES_NO
    assert asked.due is None and not asked.has_default
    assert k.decide(sim.state) == []  # nothing to do: it waits for a person
    assert [c.id for c, _ in k.pending_questions(sim.state)] == ["run1/1.0"]
    assert k.parked_until(sim.state) == float("inf")  # only an answer wakes it
    assert k.next_timer(sim.state) is None and k.expire(sim.state, 1e12) == []

    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer="yes", by="alice")
    assert k.pending_questions(sim.state) == () and k.parked_until(sim.state) is None
    assert sim.state.turn.results["run1/1.0"].output == {"answer": "yes"}
    sim.run(script(Reply("", (("submit_result", {"answer": "shipped"}),))))
    assert sim.state.status == "completed"
    tool_msg = next(m for m in sim.state.messages if m.role == "tool")
    assert tool_msg.name == "ask_human" and '"yes"' in tool_msg.content
    report = verify(sim.config, sim.events)
    assert report.ok, report.problems
    assert report.checked >= 4  # question.asked among the predictions, the answer an input


def test_the_timeout_gives_the_default_decided_from_timestamps():
    sim = Sim(config(timeout_s=60, default="no"))
    asked = asking(sim)
    assert asked.due == sim.events[-2].ts + 60 and asked.has_default and asked.default == "no"
    assert k.parked_until(sim.state) == asked.due and k.next_timer(sim.state) == asked.due
    assert k.expire(sim.state, asked.due - 0.5) == []
    [verdict] = k.expire(sim.state, asked.due)
    assert isinstance(verdict, ev.QuestionAnswered) and verdict.by == "timeout" and verdict.answer == "no"
    sim.clock = asked.due + 1  # the runner woke at the timeout and appends the verdict at its time
    sim.append(verdict)
    result = sim.state.turn.results["run1/1.0"]
    assert result.output["answer"] == "no" and "default" in result.output["note"]
    sim.run(script(submit("gave up waiting")))
    report = verify(sim.config, sim.events)
    assert report.ok, report.problems


def test_a_timeout_without_a_default_fails_the_call_clearly():
    sim = Sim(config(timeout_s=30))
    asked = asking(sim)
    [verdict] = k.expire(sim.state, asked.due + 5)
    assert isinstance(verdict, ev.ToolFailed) and verdict.error.kind == "timeout"
    assert "nobody answered within 30 s" in verdict.error.message
    sim.clock = asked.due + 5
    sim.append(verdict)
    sim.run(script(submit("no answer came")))
    assert sim.state.status == "completed"
    report = verify(sim.config, sim.events)
    assert report.ok, report.problems


def test_decide_returns_the_timeout_verdict_once_an_event_passes_it():
    sim = Sim(config(timeout_s=10, default=None))  # a null default is a default
    asked = asking(sim)
    sim.clock = asked.due + 1
    sim.emit(ev.ModelThrottled, request_id="x", turn=1, status=429, wait_s=0.0)  # any later event
    [verdict] = k.decide(sim.state)
    assert isinstance(verdict, ev.QuestionAnswered) and verdict.answer is None and verdict.by == "timeout"


def test_the_deadline_bounds_the_wait_for_an_answer():
    sim = Sim(config())
    asking(sim, timeout_s=120)
    started = sim.events[0]
    assert k.parked_until(sim.state) == started.ts + 120  # woken at the deadline to fail the run


@pytest.mark.parametrize(("args", "message"), [
    ({}, "needs `question`"),
    ({"question": "   "}, "needs `question`"),
    ({"question": "x" * 5000}, "at most 4000"),
    ({"question": "ok?", "answer_schema": "yes/no"}, "JSON schema object"),
    ({"question": "ok?", "urgency": "high"}, "not urgency"),
])
def test_bad_question_arguments_are_the_calls_error(args, message):
    sim = Sim(config()).start()
    sim.run(script(Reply("", (("ask_human", args),)), submit("done")))
    failed = next(e for e in sim.events if isinstance(e, ev.ToolFailed))
    assert failed.tool == "ask_human" and failed.error.kind == "input" and message in failed.error.message
    assert not any(isinstance(e, ev.QuestionAsked) for e in sim.events)
    assert sim.state.status == "completed"


def test_a_question_beside_a_tool_call_parks_only_once_the_call_is_answered():
    sim = Sim(config()).start()
    sim.step(script(Reply("", (("ask_human", {"question": "which?"}), ("search", {"q": "x"})))))
    decided = k.decide(sim.state)
    assert [type(d) for d in decided] == [ev.QuestionAsked, k.CallTools]
    sim.append(decided[0])
    sim.emit(ev.ToolCalled, call=decided[1].calls[0])
    assert k.parked_until(sim.state) is None  # the search is still out
    sim.emit(ev.ToolCompleted, call_id="run1/1.1", tool="search", output="found")
    assert k.parked_until(sim.state) == float("inf")
    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer={"pick": 2}, by="bob")
    [done] = k.decide(sim.state)
    assert isinstance(done, ev.TurnCompleted) and done.calls_ok == 2


def test_question_events_fold_idempotently():
    sim = Sim(config())
    asking(sim)
    before = sim.state
    sim.emit(ev.QuestionAnswered, call_id="run1/9.9", answer="yes", by="x")  # never asked
    assert sim.state.turn == before.turn
    sim.emit(ev.QuestionAsked, call_id="run1/1.0", question="again?")  # a second ask: ignored
    assert sim.state.turn.questions == before.turn.questions
    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer="yes", by="alice")
    result = sim.state.turn.results["run1/1.0"]
    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer="no", by="bob")  # a second answer: nothing
    assert sim.state.turn.results["run1/1.0"] is result


def test_a_cancelled_waiting_run_has_no_pending_question():
    sim = Sim(config())
    asking(sim)
    sim.emit(ev.RunCancelled, reason="enough", by="ops")
    assert sim.state.status == "cancelled" and k.pending_questions(sim.state) == ()
    assert k.parked_until(sim.state) is None


def test_ask_human_is_only_the_kernels_when_the_config_says_so():
    with pytest.raises(ValueError, match="ask_human is not among the tools"):
        k.KernelConfig(tools=TOOLS[:2], questions=questions.QuestionsConfig())
    with pytest.raises(ValueError, match="positive"):
        questions.QuestionsConfig(timeout_s=0)
    sim = Sim(k.KernelConfig(tools=TOOLS)).start()  # offered as a plain tool: a worker runs it
    sim.step(script(Reply("", (("ask_human", {"question": "?"}),))))
    [tools] = k.decide(sim.state)
    assert isinstance(tools, k.CallTools)


def test_question_events_and_the_answer_command_round_trip():
    asked = ev.stamp(ev.QuestionAsked(run_id="r", call_id="r/1.0", question="ok?", schema=YES_NO, due=9.5,
                                      timeout_s=3.0, default="no", has_default=True), seq=3, ts=6.5)
    answered = ev.stamp(ev.QuestionAnswered(run_id="r", call_id="r/1.0", answer="yes", by="alice"), seq=4,
                        ts=7.0)
    for e in (asked, answered):
        assert ev.decode(ev.encode(e)) == e and ev.from_json(ev.to_json(e)) == e
    answer = ev.Answer(run_id="r", call_id="r/1.0", answer={"n": 1}, by="alice")
    assert ev.decode_command(ev.encode_command(answer)) == answer
    from runtime.commands import decode

    assert decode("asker", ev.encode_command(answer), "carol").command.by == "carol"  # the subject's operator


def test_a_forged_answer_in_a_log_fails_verification_only_when_it_claims_the_timeout():
    sim = Sim(config(timeout_s=60, default="no"))
    asking(sim)
    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer="no", by="timeout")  # before its time
    report = verify(sim.config, sim.events)
    assert not report.ok and "question.answered" in report.problems[0]


async def _in_process(answerer, timeout_s: float | None = None, **default):
    from runtime.driver.local import run_task
    from runtime.model.adapters import get_adapter
    from runtime.model.client import ModelClient
    from runtime.testing import ScriptedModelServer

    hermes = get_adapter("hermes")
    q = questions.QuestionsConfig(timeout_s=timeout_s, default=default.get("default"),
                                  has_default="default" in default)
    cfg = k.KernelConfig(tools=(questions.ASK_HUMAN_TOOL,), questions=q)
    ask = hermes.format_call("ask_human", {"question": "Ship it?", "answer_schema": YES_NO})
    with ScriptedModelServer([ask, "done"]) as server:
        client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        try:
            outcome = await run_task(ev.Task(agent="asker", input="ship"), cfg, client=client, adapter=hermes,
                                     tools=[], answerer=answerer)
        finally:
            await client.aclose()
    assert outcome.status == "completed", outcome.reason
    report = verify(cfg, outcome.events)
    assert report.ok, report.problems
    asked = next(e for e in outcome.events if isinstance(e, ev.QuestionAsked))
    return asked, outcome.events[asked.seq + 1]


@pytest.mark.anyio
async def test_in_one_process_the_answerer_answers():
    seen = []

    async def answerer(question, schema):
        seen.append((question, schema))
        return "yes"

    _, answered = await _in_process(answerer)
    assert seen == [("Ship it?", YES_NO)]
    assert isinstance(answered, ev.QuestionAnswered)
    assert answered.answer == "yes" and answered.by == "answerer"


@pytest.mark.anyio
@pytest.mark.parametrize(("answerer", "kind", "message"), [
    (None, "policy", "no answerer is configured"),
    (lambda q, s: "maybe", "input", "does not fit the question's schema"),
])
async def test_in_one_process_no_answerer_or_a_bad_answer_is_the_calls_error(answerer, kind, message):
    _, failed = await _in_process(answerer)
    assert isinstance(failed, ev.ToolFailed) and failed.error.kind == kind and message in failed.error.message


@pytest.mark.anyio
async def test_in_one_process_a_silent_answerer_gets_the_timeouts_default():
    import anyio

    async def silent(question, schema):
        await anyio.sleep_forever()

    asked, answered = await _in_process(silent, timeout_s=0.2, default="no")
    assert isinstance(answered, ev.QuestionAnswered) and answered.by == "timeout" and answered.answer == "no"
    assert answered.ts >= asked.due


def running_call(sim: Sim) -> None:
    """Start the run and let the model call `search`, which goes out as a job (`tool.called`)."""
    sim.start()
    sim.step(script(Reply("", (("search", {"q": "x"}),))))
    [call_tools] = k.decide(sim.state)
    assert isinstance(call_tools, k.CallTools) and [c.id for c in call_tools.calls] == ["run1/1.0"]
    sim.emit(ev.ToolCalled, call=call_tools.calls[0])


def test_a_question_a_running_call_puts_sends_the_call_out_again_or_fails_it():
    """A call in doubt asks a person (`resume`): while it waits nothing is dispatched and the run parks;
    `recall` sends it out again one round up; an earlier round's late report changes nothing; `failed`
    gives the call an `in_doubt` failure; and `verify` reproduces all of it."""
    for answer in ("recall", "failed"):
        sim = Sim(config())
        running_call(sim)
        question, schema_, resume = questions.in_doubt_question("the call may or may not have happened.")
        sim.emit(ev.QuestionAsked, call_id="run1/1.0", question=question, schema=schema_, resume=resume)
        assert k.decide(sim.state) == []  # it waits for the answer: not dispatched again
        assert k.parked_until(sim.state) == float("inf")
        sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer=answer, by="alice")
        if answer == "failed":
            result = sim.state.turn.results["run1/1.0"]
            assert result.error is not None and result.error.kind == "in_doubt"
            assert "may or may not have happened" in result.error.message
            continue
        assert "run1/1.0" not in sim.state.turn.results
        assert sim.state.turn.resumed["run1/1.0"] == (1, {"kind": "recall"})
        [again] = k.decide(sim.state)
        assert isinstance(again, k.CallTools) and [c.id for c in again.calls] == ["run1/1.0"]
        sim.emit(ev.QuestionAsked, call_id="run1/1.0", question=question, schema=schema_, resume=resume,
                 round=0)  # round 0's report, late: the call is in round 1 now
        assert "run1/1.0" not in sim.state.turn.questions
        sim.emit(ev.ToolCompleted, call_id="run1/1.0", tool="search", output="found")
        assert sim.state.turn.results["run1/1.0"].output == "found"
        sim.run(script(submit("done")))
        assert sim.state.status == "completed"
        report = verify(sim.config, sim.events)
        assert report.ok, report.problems


def test_an_mcp_servers_request_for_input_goes_back_with_the_answer():
    sim = Sim(config())
    running_call(sim)
    form = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    sim.emit(ev.QuestionAsked, call_id="run1/1.0", question="who?", schema=form,
             resume=questions.elicit_resume("k1", "sealed"))
    sim.emit(ev.QuestionAnswered, call_id="run1/1.0", answer={"name": "Ann"}, by="alice")
    assert sim.state.turn.resumed["run1/1.0"] == (1, {
        "kind": "elicit", "request_state": "sealed",
        "input_responses": {"k1": {"action": "accept", "content": {"name": "Ann"}}}})
    [again] = k.decide(sim.state)
    assert isinstance(again, k.CallTools)
