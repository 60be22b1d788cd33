"""Every turn's request starts with the previous request, byte for byte, on every adapter and strategy.

Why: a server with prefix caching (vLLM's automatic prefix caching) reuses the KV cache of the longest
prefix a request shares with earlier ones. An agent's turn N+1 repeats turn N's prompt and adds to it; if
anything early in the prompt changed between turns (the tools text, the order of tool results, a
re-rendered system prompt, JSON key order) the server would recompute the whole context on every turn.
`bench/prefix.py` measures the share; this test fails on the first byte that moves.

The runs end on a forced last turn (`max_turns`), where the kernel offers only the terminal tool: the
request narrows the constraint (or, for the openai family, names the tool in `tool_choice`) and keeps the
tools of the prompt, which used to change there.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import anyio
import pytest

from runtime import events as ev
from runtime import kernel
from runtime.driver.local import run_task
from runtime.model.adapters import get_adapter
from runtime.model.client import ModelClient
from runtime.model.constraints import DecodingConstraint
from runtime.testing import Reply, ScriptedModelServer
from runtime.tools import PythonTool
from runtime.types import ToolSchema

pytestmark = pytest.mark.anyio
TURNS = 4
SUBMIT = ToolSchema(
    "submit_result", "Finish the task with its answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)


async def add(a: int, b: int) -> dict[str, Any]:
    """Add two numbers (the first call of a turn finishes last: results arrive out of call order)."""
    await anyio.sleep(0.02 if b == 1 else 0.0)
    return {"text": f"the sum is {a + b}", "sum": a + b}


CASES = [
    ("hermes", "ebnf", False, False), ("hermes", "structural_tag", False, False),
    ("hermes", "json_schema", False, False), ("hermes", "ebnf", True, False),
    ("hermes", "structural_tag", False, True),
    ("qwen3", "ebnf", False, False), ("qwen3", "structural_tag", True, False),
    ("qwen3", "json_schema", False, False),
    ("function_gemma", "ebnf", False, False), ("function_gemma", "structural_tag", True, False),
    ("function_gemma", "json_schema", False, False),
    ("openai", "json_schema", False, False), ("openai", "json_schema", True, False),
    ("openai", None, False, False),
]


def responder(adapter_name: str, strategy: str | None, parallel: bool) -> Any:
    adapter = get_adapter(adapter_name)

    def reply(body: dict[str, Any]) -> Reply | str:
        done = sum(m["role"] == "assistant" for m in body["messages"])
        calls: list[tuple[str, dict[str, Any]]] = [("submit_result", {"answer": str(done)})]
        if done < TURNS - 1:
            calls = [("add", {"a": done, "b": 1})] + ([("add", {"a": done, "b": 2})] if parallel else [])
        if adapter.native_tool_calls:
            return Reply.tool_calls_of(calls)
        if strategy == "json_schema":
            objs = [{"name": n, "arguments": a} for n, a in calls]
            return json.dumps(objs if len(objs) > 1 else objs[0])
        return adapter.call_separator.join(adapter.format_call(n, a) for n, a in calls)

    return reply


def rendered(body: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    """What the server's chat template reads, as bytes: the tools, and each message in order."""
    tools = json.dumps(body.get("tools") or [], ensure_ascii=False).encode()
    return tools, [json.dumps(m, ensure_ascii=False).encode() for m in body["messages"]]


@pytest.mark.parametrize(("adapter_name", "strategy", "parallel", "via_api"), CASES,
                         ids=lambda v: str(v))
async def test_each_turn_starts_with_the_previous_request(adapter_name, strategy, parallel, via_api):
    adapter = get_adapter(adapter_name)
    tools = [PythonTool(add)]
    cfg = kernel.KernelConfig(system_prompt="You add numbers, then submit the last sum.",
                              tools=(tools[0].schema, SUBMIT), terminal_tool="submit_result",
                              max_turns=TURNS, max_concurrent_tools=4)
    constraint = (DecodingConstraint(strategy, allow_parallel_calls=parallel, send_tools_to_api=via_api)
                  if strategy else None)
    with ScriptedModelServer(responder=responder(adapter_name, strategy, parallel)) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            outcome = await run_task(ev.Task(agent="a", input="Add up."), cfg, client=client, adapter=adapter,
                                     tools=tools, constraint=constraint)
        bodies = server.requests
    assert outcome.ok, outcome
    assert len(bodies) == TURNS
    requested = [e for e in outcome.events if isinstance(e, ev.ModelRequested)]
    assert requested[-1].tools == ("submit_result",)  # the last turn was forced
    for turn, (before, after) in enumerate(itertools.pairwise(bodies), 2):
        tools_before, messages_before = rendered(before)
        tools_after, messages_after = rendered(after)
        assert tools_after == tools_before, f"turn {turn}: the tools changed"
        assert len(messages_after) > len(messages_before)
        for i, (was, now) in enumerate(zip(messages_before, messages_after, strict=False)):
            assert now == was, f"turn {turn}: message {i} changed:\n{was!r}\n{now!r}"
    if adapter.native_tool_calls:  # the forced turn names its tool instead of offering fewer
        assert bodies[-1]["tool_choice"] == {"type": "function", "function": {"name": "submit_result"}}


async def test_a_bundle_may_ask_for_the_narrowed_prompt_on_the_forced_turn():
    """`last_turn_prompt: narrowed` (the demo's tiny model needs it): the last turn's prompt lists only the
    terminal tool, at the cost of the server's cached prefix on that turn."""
    adapter = get_adapter("hermes")
    tools = [PythonTool(add)]
    cfg = kernel.KernelConfig(system_prompt="You add numbers, then submit the last sum.",
                              tools=(tools[0].schema, SUBMIT), terminal_tool="submit_result",
                              max_turns=TURNS, last_turn_prompt="narrowed")
    with ScriptedModelServer(responder=responder("hermes", "ebnf", False)) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            outcome = await run_task(ev.Task(agent="a", input="Add up."), cfg, client=client, adapter=adapter,
                                     tools=tools, constraint=DecodingConstraint("ebnf"))
        systems = [b["messages"][0]["content"] for b in server.requests]
    assert outcome.ok, outcome
    assert systems[-2] == systems[0] and '"add"' in systems[-2]
    assert '"add"' not in systems[-1] and "submit_result" in systems[-1]


async def test_the_kept_prompt_says_at_its_end_which_tools_remain():
    adapter = get_adapter("hermes")
    tools = [PythonTool(add)]
    cfg = kernel.KernelConfig(system_prompt="You add numbers, then submit the last sum.",
                              tools=(tools[0].schema, SUBMIT), terminal_tool="submit_result", max_turns=TURNS)
    with ScriptedModelServer(responder=responder("hermes", "ebnf", False)) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            outcome = await run_task(ev.Task(agent="a", input="Add up."), cfg, client=client, adapter=adapter,
                                     tools=tools, constraint=DecodingConstraint("ebnf"))
        last = server.requests[-1]["messages"][-1]
    assert outcome.ok, outcome
    assert last["role"] == "user" and last["content"].startswith("<tool_response>")
    assert last["content"].endswith("This is the last turn: only submit_result can be called now.")
