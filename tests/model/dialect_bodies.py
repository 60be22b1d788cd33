"""What the runtime puts on the wire in each server's dialect: the request bodies the dialect tests check.

Each body is the real one: sent by `ModelClient` through `ModelStep` to the scripted server and read back as
it arrived (plain and streamed), so a test of a body tests what that server would receive.
"""

from __future__ import annotations

import json
from typing import Any

import anyio

from runtime import events as ev
from runtime import kernel
from runtime.model import DecodingConstraint, ModelStep, get_adapter
from runtime.model.client import ModelClient
from runtime.testing import ScriptedModelServer
from runtime.types import Message, ToolCall, ToolSchema

PLAN = ToolSchema(
    "plan_trip",
    "Plan a trip.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    },
)
SUBMIT = ToolSchema(
    "submit_result",
    "Finish with the answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
TOOLS = (PLAN, SUBMIT)
HISTORY = (
    Message("system", "You plan trips."),
    Message("user", "Two days in Oslo?"),
    Message("assistant", "Planning.", tool_calls=(ToolCall("r/1.0", "plan_trip", {"city": "Oslo"}),)),
    Message("tool", '{"ok": true}', tool_call_id="r/1.0", name="plan_trip"),
)
SAMPLING = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 256, "seed": 7, "stop": ["</s>"]}

# the JSON documents of the json_schema strategy: valid ones, and ones each translated schema must refuse
VALID_CALLS = [
    {"name": "plan_trip", "arguments": {"city": "Oslo", "days": 2, "unit": "c"}},
    {"name": "plan_trip", "arguments": {"city": "Oslo"}},
    {"name": "submit_result", "arguments": {"answer": "done"}},
]
INVALID_CALLS = {
    "an unknown tool": {"name": "book_hotel", "arguments": {"city": "Oslo"}},
    "an undeclared argument": {"name": "plan_trip", "arguments": {"city": "Oslo", "color": "red"}},
    "a missing required argument": {"name": "plan_trip", "arguments": {"days": 2}},
    "a wrong type": {"name": "plan_trip", "arguments": {"city": "Oslo", "days": "two"}},
    "a value outside the enum": {"name": "plan_trip", "arguments": {"city": "Oslo", "unit": "k"}},
    "no arguments": {"name": "plan_trip"},
}


class Drain:
    """A live view that drops every fragment (and the notice of a retried attempt): the call is then made as a
    streamed request, as a host with watchers makes it. Shared with `test_vllm_conformance.py`."""

    async def on_text(self, text: str) -> None:
        pass

    async def on_tool_call(self, index: int, call_id: str, name: str, arguments: str) -> None:
        pass

    async def retrying(self, attempt: int) -> None:
        pass

    async def done(self) -> None:
        pass


def bodies(dialect: str, family: str, constraint: DecodingConstraint | None,
           offered: tuple[ToolSchema, ...] = TOOLS) -> dict[str, dict[str, Any]]:
    """The bodies `dialect`'s server receives for this family and constraint, plain and streamed; `offered`
    fewer than the tools is the forced last turn."""
    step = ModelStep(get_adapter(family), TOOLS, constraint, dialect=dialect)
    effect = kernel.CallModel("r/2", 2, 1, HISTORY, HISTORY[-1:], 1, offered, SAMPLING, None)

    async def send() -> list[dict[str, Any]]:
        with ScriptedModelServer(responder=lambda body: "ok") as server:
            async with ModelClient(base_url=server.base_url, model="m", max_retries=0) as client:
                outcome = await step.call(client, effect, "r")
                assert not isinstance(outcome, ev.ModelFailed), outcome
                streamed = await step.call(client, effect, "r", stream=Drain())  # type: ignore[arg-type]
                assert not isinstance(streamed, ev.ModelFailed), streamed
            return list(server.requests)

    plain, streamed = anyio.run(send)
    return {"plain": plain, "stream": streamed}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


__all__ = ["HISTORY", "INVALID_CALLS", "PLAN", "SUBMIT", "TOOLS", "VALID_CALLS", "bodies", "dumps"]
