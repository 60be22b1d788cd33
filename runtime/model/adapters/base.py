"""The `ModelAdapter` contract: everything that differs between model families, in one object.

Why one object per family: the prompt format, the tool-call syntax the model was trained on, the
parser for that syntax and the decoding constraint that forces it are four views of the same fact
("this family writes calls like so"). Keeping them together means a new family is one module, and a
format change can never leave the grammar and the parser disagreeing.

Adapters are pure: no I/O, no clock, no xgrammar import, and they know nothing of constraints. An
adapter only describes its family as data (`call_trigger`, `call_separator`, `parameter_name_pattern`,
`native_tool_calls`, `call_tags`); `runtime.model.constraints` turns that description into xgrammar
grammars, and `runtime.model.client` does the HTTP.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from runtime.model.adapters.arguments import coerce_arguments, value_from_text
from runtime.types import Message, ToolSchema


class ParsedCall(msgspec.Struct, frozen=True):
    """One tool call recovered from a reply, with arguments already coerced by the tool's schema."""

    name: str
    arguments: dict[str, Any]


class ParsedReply(msgspec.Struct, frozen=True):
    """A model reply split into prose, calls, and problems.

    `errors` holds one readable line per call that could not be recovered (bad syntax, unknown tool,
    truncation). Parsing never raises: the kernel decides what the model is told.
    """

    content: str
    calls: list[ParsedCall] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


class RawCall(msgspec.Struct, frozen=True):
    """A call as a family parser found it, before tool lookup and coercion (internal)."""

    name: str
    arguments: Any
    from_text: bool = False  # values are text (XML parameters) and need typing by schema


class ModelAdapter(ABC):
    """Formats prompts for, and parses replies from, one model family.

    Subclasses set `name`, `call_trigger`, `call_separator` (and `parameter_name_pattern` when their
    syntax limits parameter names) and implement the family hooks (`tools_prompt`, `format_call`,
    `format_results`, `extract_calls`, `call_tags`).
    """

    name: ClassVar[str]
    #: the text every native call starts with (structural-tag trigger)
    call_trigger: ClassVar[str] = ""
    #: what goes between two calls when several are allowed
    call_separator: ClassVar[str] = "\n"
    #: True when calls travel as the API's `tool_calls` field, never as text (the openai family)
    native_tool_calls: ClassVar[bool] = False
    #: the parameter names the family's call syntax can write (a regular expression), or None for any
    #: name (JSON keys); a tool with another parameter name cannot be constrained for this family
    parameter_name_pattern: ClassVar[str | None] = None

    # ---- the public surface -------------------------------------------------------------------

    def _tools_text(self, tools: Sequence[ToolSchema]) -> str:
        """`tools_prompt(tools)`, made once per tool set: an agent sends the same tools on every turn, and
        writing their JSON schemas out again each time was a tenth of the model call's CPU. Keyed by the
        tool objects themselves (identity), so a changed tool set is never served a stale text."""
        cache: dict[tuple[int, ...], tuple[tuple[ToolSchema, ...], str]] = self.__dict__.setdefault(
            "_tools_texts", {})
        key = tuple(map(id, tools))
        hit = cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], tools, strict=True)):
            return hit[1]
        if len(cache) >= 64:  # bounded: a long-lived host serving many bundles keeps the recent ones
            cache.pop(next(iter(cache)))
        text = self.tools_prompt(list(tools))
        cache[key] = (tuple(tools), text)
        return text

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        *,
        tools_via_api: bool = False,
    ) -> list[dict[str, Any]]:
        """The OpenAI chat messages to send.

        Text families describe the tools in the system prompt in their native format and write past
        calls and results the way the model saw them in training. When the tools go to the API instead
        (`tools_via_api`, and always for the openai family), the server's chat template does that work,
        so messages are rendered in OpenAI's native shape and the system prompt is left alone.
        """
        if self.native_tool_calls or tools_via_api:
            return [_native_message(m) for m in messages]
        out: list[dict[str, Any]] = []
        tools_text = self._tools_text(tools) if tools else ""
        pending_results: list[Message] = []

        def flush() -> None:
            if pending_results:
                out.append({"role": "user", "content": self.format_results(pending_results)})
                pending_results.clear()

        for message in messages:
            if message.role == "tool":
                pending_results.append(message)
                continue
            flush()
            if message.role == "system":
                content = _join(message.content, tools_text)
                tools_text = ""
                out.append({"role": "system", "content": content})
            elif message.role == "assistant" and message.tool_calls:
                calls = self.call_separator.join(
                    self.format_call(c.name, c.arguments) for c in message.tool_calls
                )
                out.append({"role": "assistant", "content": _join(message.content, calls)})
            else:
                out.append({"role": message.role, "content": message.content})
        flush()
        if tools_text:
            out.insert(0, {"role": "system", "content": tools_text})
        return out

    def parse(
        self, text: str, api_tool_calls: list[dict[str, Any]] | None, tools: Sequence[ToolSchema]
    ) -> ParsedReply:
        """Split a reply into content and calls, typed by each tool's schema. Never raises."""
        by_name = {t.name: t for t in tools}
        errors: list[str] = []
        raw: list[RawCall] = []
        content = text or ""
        if api_tool_calls:
            for index, api_call in enumerate(api_tool_calls, 1):
                found = _raw_from_api(api_call)
                if isinstance(found, str):
                    errors.append(f"call {index}: {found}")
                else:
                    raw.append(found)
        if not self.native_tool_calls and content:
            content, text_calls, text_errors = self.extract_calls(content)
            raw.extend(text_calls)
            errors.extend(text_errors)
        if not raw and not errors:
            bare = _bare_json_calls(content)
            if bare is not None:
                raw, errors, content = bare[0], bare[1], ""
        calls: list[ParsedCall] = []
        for index, call in enumerate(raw, 1):
            tool = by_name.get(call.name)
            if tool is None:
                known = ", ".join(sorted(by_name)) or "none"
                errors.append(f"call {index}: unknown tool {call.name!r} (known: {known})")
                continue
            if call.from_text:
                properties = tool.parameters.get("properties") or {}
                arguments = {k: value_from_text(v, properties.get(k)) for k, v in call.arguments.items()}
            elif isinstance(call.arguments, dict):
                arguments = coerce_arguments(call.arguments, tool.parameters)
            else:
                errors.append(
                    f"call {index} ({call.name}): arguments must be an object, got {call.arguments!r}"
                )
                continue
            calls.append(ParsedCall(call.name, arguments))
        return ParsedReply(content.strip(), calls, errors)

    # ---- family hooks -------------------------------------------------------------------------

    @abstractmethod
    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call in the family's native text syntax (used to replay history and in tests)."""

    @abstractmethod
    def tools_prompt(self, tools: list[ToolSchema]) -> str:
        """The system-prompt section that describes the tools, in the family's native format."""

    @abstractmethod
    def format_results(self, results: list[Message]) -> str:
        """One user turn carrying consecutive tool results, as the family expects to read them."""

    @abstractmethod
    def extract_calls(self, text: str) -> tuple[str, list[RawCall], list[str]]:
        """Find native calls in `text`: (text without the calls, calls, errors)."""

    @abstractmethod
    def call_tags(self, tools: list[ToolSchema]) -> list[dict[str, Any]]:
        """xgrammar structural-tag `tag` formats, one per tool, describing a complete native call.

        Each tag's `begin` starts with `call_trigger`. `runtime.model.constraints` assembles these into
        an EBNF grammar (calls only) or a triggered structural tag (prose allowed around calls).
        """


def _join(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


def _native_message(message: Message) -> dict[str, Any]:
    """OpenAI's own message shape: calls in `tool_calls`, results as `tool` messages."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id or ""
        if message.name:
            out["name"] = message.name
    return out


def _raw_from_api(call: dict[str, Any]) -> RawCall | str:
    """A `tool_calls[i]` entry from the API as a RawCall, or the reason it is unusable."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return f"malformed tool call {call!r}"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            return f"{function['name']}: arguments are not valid JSON ({exc})"
    return RawCall(function["name"], arguments if arguments is not None else {})


def _bare_json_calls(text: str) -> tuple[list[RawCall], list[str], str] | None:
    """Calls written as a bare JSON object or array (the `json_schema` strategy's output), else None."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    return [call_from_json(i) for i in items], [], ""


def call_from_json(obj: dict[str, Any]) -> RawCall:
    """`{"name": ..., "arguments"|"parameters": {...}}` (arguments may be a JSON string) as a RawCall."""
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    return RawCall(obj["name"], arguments)
