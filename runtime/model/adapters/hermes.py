"""The `hermes` family: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Used by Qwen2.5, Hermes 2/3 and SmolLM2 (ChatML models). Tools are described as OpenAI tool JSON
inside `<tools>` in the system prompt; results come back as `<tool_response>` blocks in a user turn.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.model.adapters.base import ModelAdapter, RawCall, call_from_json
from runtime.model.schemas import closed_schema
from runtime.types import Message, ToolSchema

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesAdapter(ModelAdapter):
    """JSON calls wrapped in `<tool_call>` tags."""

    name = "hermes"
    call_trigger = "<tool_call>"
    call_separator = "\n"

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"

    def tools_prompt(self, tools: list[ToolSchema]) -> str:
        listing = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\n"
            "You may call one or more functions to help with the request.\n"
            "The available function signatures are listed inside <tools></tools>:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "To call a function, reply with a JSON object holding its name and arguments, "
            "wrapped in <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def format_results(self, results: list[Message]) -> str:
        return "\n".join(f"<tool_response>\n{m.content}\n</tool_response>" for m in results)

    def extract_calls(self, text: str) -> tuple[str, list[RawCall], list[str]]:
        calls: list[RawCall] = []
        errors: list[str] = []
        decoder = json.JSONDecoder()
        for match in _BLOCK.finditer(text):
            body = match.group(1).strip()
            closed = match.group(0).endswith("</tool_call>")
            position = 0
            while position < len(body):
                try:
                    value, end = decoder.raw_decode(body, position)
                except (ValueError, RecursionError) as exc:
                    what = "truncated call" if not closed else "invalid JSON"
                    errors.append(f"call {len(calls) + len(errors) + 1}: {what} in <tool_call> ({exc})")
                    break
                if isinstance(value, dict) and isinstance(value.get("name"), str):
                    calls.append(call_from_json(value))
                else:
                    errors.append(
                        f'call {len(calls) + len(errors) + 1}: expected {{"name", "arguments"}}, '
                        f"got {body[position:end]!r}"
                    )
                position = end
                while position < len(body) and body[position] in " \t\r\n,":
                    position += 1
            if not body:
                errors.append(f"call {len(calls) + len(errors) + 1}: empty <tool_call>")
        return _BLOCK.sub("", text), calls, errors

    def call_tags(self, tools: list[ToolSchema]) -> list[dict[str, Any]]:
        return [
            {
                "type": "tag",
                "begin": f'<tool_call>\n{{"name": {json.dumps(t.name)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": closed_schema(t.parameters)},
                "end": "}\n</tool_call>",
            }
            for t in tools
        ]
