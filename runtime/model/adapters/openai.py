"""The `openai` family: calls travel in the API's native `tool_calls` field.

For servers that apply the model's chat template and run their own tool parser (vLLM with
`--enable-auto-tool-choice`, OpenAI itself). Tools are always sent with the request; there is no
text syntax to render or parse, so the text hooks are trivial and `format_call` writes the JSON
form (which is also how a call is shown in logs and round-trip tests).
"""

from __future__ import annotations

import json
from typing import Any

from runtime.model.adapters.base import ModelAdapter, RawCall
from runtime.types import Message, ToolSchema


class OpenAIAdapter(ModelAdapter):
    """Native OpenAI tool calling: `tools=` in, `tool_calls` out."""

    name = "openai"
    native_tool_calls = True

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)

    def tools_prompt(self, tools: list[ToolSchema]) -> str:
        return ""  # the server's chat template describes the tools

    def format_results(self, results: list[Message]) -> str:
        return "\n".join(m.content for m in results)

    def extract_calls(self, text: str) -> tuple[str, list[RawCall], list[str]]:
        return text, [], []

    def call_tags(self, tools: list[ToolSchema]) -> list[dict[str, Any]]:
        return []  # no text syntax: the server turns `tools` into its own constraint
