"""The in-process run loop against a real HTTP model server (scripted), real adapters and real tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import events as ev
from runtime import kernel
from runtime.driver.local import run_task
from runtime.model.adapters import get_adapter
from runtime.model.client import ModelClient
from runtime.model.constraints import DecodingConstraint
from runtime.testing import Reply, ScriptedModelServer, last_message
from runtime.tools import PythonTool, ScriptTool
from runtime.types import ToolSchema

pytestmark = pytest.mark.anyio
AGENTS = Path(__file__).parents[2] / "agents"
SUBMIT = ToolSchema(
    "submit_result",
    "Finish the task with its answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)


def lookup(key: str) -> str:
    """Look a key up in the fixture table."""
    return {"capital": "Paris", "river": "Seine"}.get(key, "unknown")


def client_for(server: ScriptedModelServer, **kw: Any) -> ModelClient:
    return ModelClient(base_url=server.base_url, model="scripted", **{"max_retries": 0, **kw})


def make_config(tools: list[Any], **kw: Any) -> kernel.KernelConfig:
    return kernel.KernelConfig(
        system_prompt="You are a careful assistant.",
        tools=(*[t.schema for t in tools], SUBMIT),
        terminal_tool="submit_result",
        **kw,
    )


async def test_a_run_with_a_sandboxed_script_a_python_tool_and_a_terminal_tool():
    qwen = get_adapter("qwen3")
    tools = [ScriptTool.from_path(AGENTS / "calculator.pym"), PythonTool(lookup)]
    replies = [
        qwen.format_call("calculator", {"expression": "2 + 3"})
        + "\n"
        + qwen.format_call("lookup", {"key": "capital"}),
        qwen.format_call("submit_result", {"answer": "5 in Paris"}),
    ]
    seen: list[ev.Event] = []
    cfg = make_config(tools, sampling={"temperature": 0.0}, max_concurrent_tools=2)
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            outcome = await run_task(
                ev.Task(agent="calc", input="What is 2 + 3, and the capital?", task_id="t-1"),
                cfg, client=client, adapter=qwen, tools=tools, on_event=seen.append,
                constraint=DecodingConstraint("ebnf", allow_parallel_calls=True), run_id="r1",
            )  # fmt: skip
        requests = server.requests

    assert outcome.ok and outcome.output == {"answer": "5 in Paris"}
    assert seen == outcome.events and [e.seq for e in seen] == list(range(len(seen)))
    kinds = [ev.kind_of(e) for e in outcome.events]
    assert kinds[:3] == ["run.started", "model.requested", "model.responded"]
    assert {"tool.completed", "turn.completed"} <= set(kinds)
    assert not any(k.startswith("script.") for k in kinds)
    (script,) = [e for e in outcome.events if isinstance(e, ev.ToolCompleted) and e.tool == "calculator"]
    assert script.script is not None and script.script.ended is not None  # the sandbox run, in its outcome
    lookup_done = next(e for e in outcome.events if isinstance(e, ev.ToolCompleted) and e.tool == "lookup")
    assert lookup_done.script is None  # a Python tool runs no sandbox
    assert [ev.kind_of(e) for e in ev.expand(script)] == [
        "script.started", "script.completed", "tool.completed"]
    assert kinds[-1] == "run.completed"
    results = {e.call_id: e.output for e in outcome.events if isinstance(e, ev.ToolCompleted)}
    assert results["r1/1.1"] == "Paris" and "5" in json.dumps(results["r1/1.0"])
    # what went over the wire: the constraint, sampling, and the tool results rendered for the model
    assert "grammar" in requests[0]["structured_outputs"]  # extra_body is merged into the JSON body
    assert requests[0]["temperature"] == 0.0
    assert "Paris" in json.dumps(requests[1]["messages"])
    digest = outcome.events[1].constraint_digest
    assert digest and all(
        e.constraint_digest == digest for e in outcome.events if isinstance(e, ev.ModelRequested)
    )
    # the log alone reproduces the outcome
    folded = kernel.fold(cfg, outcome.events)
    assert folded.status == "completed" and folded.output == outcome.output and kernel.decide(folded) == []


async def test_the_last_turn_is_constrained_to_the_terminal_tool():
    """A model that keeps calling a tool meets a grammar that only admits the terminal tool at the end."""
    hermes = get_adapter("hermes")
    tools = [ScriptTool.from_path(AGENTS / "calculator.pym")]
    again = hermes.format_call("calculator", {"expression": "17 * 23 + 4"})
    replies = [again, hermes.format_call("submit_result", {"answer": "395"})]
    cfg = make_config(tools, max_turns=2)
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            task = ev.Task(agent="a", input="17 * 23 + 4?")
            outcome = await run_task(task, cfg, client=client, adapter=hermes, tools=tools,
                                     constraint=DecodingConstraint("ebnf"))  # fmt: skip
        first, last = (r["structured_outputs"]["grammar"] for r in server.requests)
        prompts = [r["messages"][0]["content"] for r in server.requests]
    assert outcome.ok and outcome.output == {"answer": "395"}
    requested = [e for e in outcome.events if isinstance(e, ev.ModelRequested)]
    assert [r.tools for r in requested] == [(), ("submit_result",)]
    assert requested[0].constraint_digest != requested[1].constraint_digest
    assert "calculator" in first and "calculator" not in last and "submit_result" in last
    # the grammar narrows the turn; the prompt keeps every tool, so the server's prefix cache still holds
    assert prompts[1] == prompts[0] and "calculator" in prompts[1]


async def test_native_tool_calls_with_the_openai_adapter_and_a_plain_final_answer():
    adapter = get_adapter("openai")
    tools = [PythonTool(lookup)]
    cfg = kernel.KernelConfig(tools=tuple(t.schema for t in tools))
    with ScriptedModelServer([Reply.tool_call("lookup", {"key": "river"}), "It is the Seine."]) as server:
        async with client_for(server) as client:
            task = ev.Task(agent="a", input="Which river?")
            outcome = await run_task(task, cfg, client=client, adapter=adapter, tools=tools)
        requests = server.requests
    assert outcome.ok and outcome.output == "It is the Seine."
    assert requests[0]["tools"][0]["function"]["name"] == "lookup"
    tool_msg = next(m for m in requests[1]["messages"] if m["role"] == "tool")
    assert tool_msg["content"] == "Seine" and tool_msg["tool_call_id"] == f"{outcome.run_id}/1.0"


async def test_an_unreachable_model_fails_the_run_after_consecutive_errors():
    cfg = kernel.KernelConfig(max_consecutive_errors=2)
    with ScriptedModelServer([Reply.error(400, "bad request"), Reply.error(400, "bad request")]) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="hi"), cfg, client=client,
                                     adapter=get_adapter("hermes"), tools=[])  # fmt: skip
    failures = [e for e in outcome.events if isinstance(e, ev.ModelFailed)]
    assert [f.request_id for f in failures] == [f"{outcome.run_id}/1", f"{outcome.run_id}/1#1"]
    assert "bad request" in failures[0].error and failures[0].error_kind == "ModelError"
    assert outcome.status == "failed" and outcome.reason.startswith("consecutive_errors")


async def test_an_unparseable_reply_is_fed_back_to_the_model():
    hermes = get_adapter("hermes")
    tools = [PythonTool(lookup)]
    replies = [
        '<tool_call>{"name": "lookup", "arguments": {"key": ',
        hermes.format_call("submit_result", {"answer": "ok"}),
    ]
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="go"), make_config(tools), client=client,
                                     adapter=hermes, tools=tools)  # fmt: skip
        second = server.requests[1]
    responded = [e for e in outcome.events if isinstance(e, ev.ModelResponded)]
    assert responded[0].parse_error and responded[0].calls == ()
    assert "could not be read as tool calls" in last_message(second, "user")
    assert outcome.output == {"answer": "ok"}


async def test_calls_run_concurrently_up_to_the_limit():
    running, peak = 0, 0

    async def slow(n: int) -> int:
        """Return n after a pause."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.02)
        running -= 1
        return n

    tools = [PythonTool(slow)]
    openai = get_adapter("openai")
    replies = [Reply.tool_calls_of([("slow", {"n": i}) for i in range(5)]),
               Reply.tool_call("submit_result", {"answer": "done"})]
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            cfg = make_config(tools, max_concurrent_tools=2)
            outcome = await run_task(
                ev.Task(agent="a", input="go"), cfg, client=client, adapter=openai, tools=tools
            )
    assert outcome.ok and peak == 2
    completed = [e for e in outcome.events if isinstance(e, ev.ToolCompleted) and e.tool == "slow"]
    assert sorted(e.output for e in completed) == [0, 1, 2, 3, 4]
    tool_msgs = [m for m in outcome.events if isinstance(m, ev.ModelRequested)][1].messages[1:]
    assert [m.content for m in tool_msgs] == ["0", "1", "2", "3", "4"]  # call order, not finish order


async def test_a_denied_approval_reaches_the_model_as_a_policy_error():
    asked: list[str] = []

    async def approver(call: Any) -> str | None:
        asked.append(call.name)
        return "lookups need a ticket"

    tools = [PythonTool(lookup)]
    openai = get_adapter("openai")
    cfg = make_config(tools, requires_approval=frozenset({"lookup"}))
    replies = [Reply.tool_call("lookup", {"key": "capital"}), "I was not allowed."]
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="go"), cfg, client=client, adapter=openai,
                                     tools=tools, approver=approver)  # fmt: skip
        tool_msg = next(m for m in server.requests[1]["messages"] if m["role"] == "tool")
    assert asked == ["lookup"]
    assert "Error [policy/approval]" in tool_msg["content"] and "lookups need a ticket" in tool_msg["content"]
    assert not any(isinstance(e, ev.ToolCalled) for e in outcome.events)


async def test_the_deadline_stops_a_hung_tool_and_fails_the_run():
    async def hang() -> str:
        """Never return."""
        await anyio.sleep(60)
        return "never"

    tools = [PythonTool(hang)]
    with ScriptedModelServer([Reply.tool_call("hang", {})]) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="go", timeout_s=3), make_config(tools),
                                     client=client, adapter=get_adapter("openai"), tools=tools)  # fmt: skip
    failed = next(e for e in outcome.events if isinstance(e, ev.ToolFailed))
    assert failed.error.kind == "timeout"
    assert outcome.status == "failed" and outcome.reason.startswith("deadline")


async def test_the_deadline_passes_while_waiting_for_an_approver():
    async def silent(call: Any) -> str | None:
        await anyio.sleep_forever()

    tools = [PythonTool(lookup)]
    cfg = make_config(tools, requires_approval=frozenset({"lookup"}))
    with ScriptedModelServer([Reply.tool_call("lookup", {"key": "river"})]) as server:
        async with client_for(server) as client:
            with anyio.fail_after(30):  # without the deadline, the run would wait forever
                outcome = await run_task(ev.Task(agent="a", input="go", timeout_s=0.3), cfg,
                                         client=client, adapter=get_adapter("openai"), tools=tools,
                                         approver=silent)  # fmt: skip
    denied = next(e for e in outcome.events if isinstance(e, ev.ApprovalDenied))
    assert denied.by == "deadline" and "deadline" in denied.reason
    assert not any(isinstance(e, ev.ToolCalled) for e in outcome.events)
    assert outcome.status == "failed" and outcome.reason.startswith("deadline")
    assert kernel.fold(cfg, outcome.events).status == "failed"


async def test_the_deadline_is_judged_on_event_timestamps_from_the_injected_clock():
    ticks = iter(range(0, 10_000, 10))
    tools = [PythonTool(lookup)]
    with ScriptedModelServer([Reply.tool_call("lookup", {"key": "river"})] * 5) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="go", timeout_s=35), make_config(tools),
                                     client=client, adapter=get_adapter("openai"), tools=tools,
                                     clock=lambda: float(next(ticks)))  # fmt: skip
    assert outcome.reason.startswith("deadline")
    first_late = next(i for i, e in enumerate(outcome.events) if e.ts >= 35)
    assert first_late > 1  # the run did work before the deadline...
    after = outcome.events[first_late:]  # ...and started no new model call once an event was past it
    assert not any(isinstance(e, ev.ModelRequested) for e in after) and isinstance(after[-1], ev.RunFailed)


async def test_cancelling_the_caller_appends_run_cancelled():
    started = anyio.Event()

    async def wait() -> str:
        """Wait until cancelled."""
        started.set()
        await anyio.sleep(60)
        return "never"

    tools = [PythonTool(wait)]
    seen: list[ev.Event] = []
    with ScriptedModelServer([Reply.tool_call("wait", {})]) as server:
        async with client_for(server) as client, anyio.create_task_group() as group:

            async def go() -> None:
                await run_task(ev.Task(agent="a", input="go"), make_config(tools), client=client,
                               adapter=get_adapter("openai"), tools=tools, on_event=seen.append)  # fmt: skip

            group.start_soon(go)
            await started.wait()
            group.cancel_scope.cancel()
    assert isinstance(seen[-1], ev.RunCancelled)
    assert kernel.fold(make_config(tools), seen).status == "cancelled"


async def test_model_requested_stays_small_while_the_prompt_grows():
    tools = [PythonTool(lookup)]
    openai = get_adapter("openai")
    replies = [Reply.tool_call("lookup", {"key": "capital"})] * 29 + [
        Reply.tool_call("submit_result", {"answer": "x"})
    ]
    with ScriptedModelServer(replies) as server:
        async with client_for(server) as client:
            outcome = await run_task(ev.Task(agent="a", input="go"), make_config(tools, max_turns=30),
                                     client=client, adapter=openai, tools=tools)  # fmt: skip
        wire = [len(json.dumps(r["messages"])) for r in server.requests]
    assert outcome.ok and len(wire) == 30
    recorded = [len(ev.encode(e)) for e in outcome.events if isinstance(e, ev.ModelRequested)]
    assert wire[-1] > 10 * wire[1]  # the prompt sent grows with the conversation...
    assert max(recorded[1:]) < 1.5 * min(recorded[1:])  # ...while each event records one exchange


async def test_every_offered_tool_needs_an_implementation_except_the_terminal_one():
    cfg = kernel.KernelConfig(tools=(ToolSchema("ghost", "not implemented", {"type": "object"}), SUBMIT))
    with pytest.raises(ValueError, match="no implementation: ghost"):
        await run_task(
            ev.Task(agent="a", input="go"), cfg, client=None, adapter=get_adapter("openai"), tools=[]
        )


class _Held:
    """An inbound message as a driver holds it: records what the driver did with it."""

    def __init__(self) -> None:
        self.done: list[str] = []

    async def ack(self) -> None:
        self.done.append("ack")

    async def nak(self) -> None:
        self.done.append("nak")


async def test_a_superseded_driver_hands_back_the_messages_it_held_at_once() -> None:
    """Another writer appended to the run between this driver's steps: its next append is refused
    (`Superseded`), and the command it was applying is handed back (a nak: redelivered to the run's owner
    now) instead of left unacked for the whole AckWait, which stalled a tool outcome 30 s after a takeover."""
    from runtime.driver.local import LocalModel, LocalPorts
    from runtime.driver.ports import Inbound
    from runtime.driver.run import RunDriver
    from runtime.log import Superseded
    from runtime.log.memory import MemoryRunLog
    from runtime.model import ModelStep

    qwen = get_adapter("qwen3")
    tool = ToolSchema("t", "A tool.", {"type": "object"})
    config = kernel.KernelConfig(system_prompt="Compute.", tools=(tool,))
    log = MemoryRunLog()
    async with ModelClient(base_url="http://127.0.0.1:9/v1", model="m") as client, \
            anyio.create_task_group() as group:
        ports = LocalPorts(group, {}, data=None, approver=None, answerer=None, clock=lambda: 1.0)
        driver: RunDriver[LocalModel] = RunDriver(
            log, LocalModel(ModelStep.for_config(qwen, config, None), client), ports, "calc", "sup1",
            state=kernel.initial(config), last_seq=0, clock=lambda: 1.0)
        await driver.append(ev.RunStarted(run_id="sup1", input="x"))
        await driver.flush()
        taken = ev.stamp(ev.RunTaken(run_id="sup1", host="other"), seq=2, actor="calc")
        await log.append(taken, expect=driver.last_seq)  # the new owner's fence
        held = _Held()
        driver.deliver(Inbound(ev.Cancel(run_id="sup1", reason="stop", by="op"), held))
        with pytest.raises(Superseded):
            await driver.run()
        group.cancel_scope.cancel()
    assert held.done == ["nak"], held.done
    assert [ev.kind_of(e) for e in (await log.read("sup1")).events] == ["run.started", "run.taken"]
