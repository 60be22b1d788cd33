"""The `qwen3` family: Qwen3-Coder's XML calls.

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

Every VALUE is text: strings are written raw, anything else as JSON; the tool's schema types them
back on parse. The grammar uses xgrammar's `qwen_xml` JSON-schema style, so values are typed inside
the constraint too (an integer parameter admits only digits), not `[^<]+`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.model.adapters.base import ModelAdapter, RawCall
from runtime.model.schemas import closed_schema
from runtime.types import Message, ToolSchema

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(</function>|(?=<function=)|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _strip_one_newline(text: str) -> str:
    """Drop the single newline the format puts on each side of a value, and nothing more."""
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    return text


class Qwen3Adapter(ModelAdapter):
    """Qwen3-Coder style `<function=...>` / `<parameter=...>` XML calls."""

    name = "qwen3"
    call_trigger = "<tool_call>"
    call_separator = "\n"
    parameter_name_pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"  # written raw inside `<parameter=...>`

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        params = "".join(f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    def tools_prompt(self, tools: list[ToolSchema]) -> str:
        blocks = []
        for tool in tools:
            schema = tool.parameters or {}
            required = set(schema.get("required") or [])
            params = []
            for pname, pschema in (schema.get("properties") or {}).items():
                pschema = pschema if isinstance(pschema, dict) else {}
                lines = [f"<name>{pname}</name>"]
                if "type" in pschema:
                    lines.append(f"<type>{_value_text(pschema['type'])}</type>")
                if pschema.get("description"):
                    lines.append(f"<description>{pschema['description']}</description>")
                extra = {k: v for k, v in pschema.items() if k not in ("type", "description")}
                if extra:
                    lines.append(f"<schema>{json.dumps(extra, ensure_ascii=False)}</schema>")
                lines.append(f"<required>{'true' if pname in required else 'false'}</required>")
                params.append("<parameter>\n" + "\n".join(lines) + "\n</parameter>")
            blocks.append(
                f"<function>\n<name>{tool.name}</name>\n<description>{tool.description}</description>\n"
                "<parameters>\n" + "\n".join(params) + ("\n" if params else "") + "</parameters>\n</function>"
            )
        return (
            "# Tools\n\nYou can call the following functions:\n\n<tools>\n"
            + "\n".join(blocks)
            + "\n</tools>\n\n"
            "To call a function, reply in exactly this format and add nothing after it:\n\n"
            "<tool_call>\n<function=function_name>\n<parameter=parameter_name>\nvalue\n</parameter>\n"
            "</function>\n</tool_call>\n\n"
            "Write string values as plain text and every other value as JSON. "
            "Give every required parameter."
        )

    def format_results(self, results: list[Message]) -> str:
        return "\n".join(f"<tool_response>\n{m.content}\n</tool_response>" for m in results)

    def extract_calls(self, text: str) -> tuple[str, list[RawCall], list[str]]:
        calls: list[RawCall] = []
        errors: list[str] = []
        blocks = list(_BLOCK.finditer(text))
        # Qwen3-Coder sometimes drops the <tool_call> wrapper: fall back to bare <function=...> blocks.
        spans = [(m.group(1), m.group(0).endswith("</tool_call>")) for m in blocks] or [(text, False)]
        for body, wrapper_closed in spans:
            functions = list(_FUNCTION.finditer(body))
            if blocks and not functions:
                errors.append(f"call {len(calls) + len(errors) + 1}: <tool_call> without <function=NAME>")
            for fn in functions:
                name = fn.group(1).strip()
                closed = bool(fn.group(3)) or wrapper_closed
                if not closed:
                    errors.append(f"call {len(calls) + len(errors) + 1} ({name}): truncated (no </function>)")
                    continue
                arguments = {
                    p.group(1).strip(): _strip_one_newline(p.group(2))
                    for p in _PARAMETER.finditer(fn.group(2))
                }
                calls.append(RawCall(name, arguments, from_text=True))
        remaining = _BLOCK.sub("", text) if blocks else _FUNCTION.sub("", text)
        return remaining, calls, errors

    def call_tags(self, tools: list[ToolSchema]) -> list[dict[str, Any]]:
        return [
            {
                "type": "tag",
                "begin": f"<tool_call>\n<function={t.name}>\n",
                "content": {
                    "type": "json_schema",
                    "json_schema": closed_schema(t.parameters),
                    "style": "qwen_xml",
                },
                "end": "</function>\n</tool_call>",
            }
            for t in tools
        ]
