"""The `function_gemma` family: FunctionGemma's control tokens and `<escape>`-delimited strings.

A call is `<start_function_call>call:NAME{key:value,...}<end_function_call>`. Values use a compact
syntax of their own: strings between two `<escape>` tokens (so `{`, `,` or quotes inside a string
are literal), bare numbers and booleans, `[...]` arrays and `{key:...}` objects with bare keys. Tools
are declared with `<start_function_declaration>` and results return inside
`<start_function_response>`.

There is no xgrammar style for this syntax, so `args_grammar` writes the EBNF for a tool's
arguments from its JSON schema itself, typed the same way xgrammar types JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.model.adapters.base import ModelAdapter, RawCall
from runtime.types import Message, ToolSchema

ESC = "<escape>"
CALL_START, CALL_END = "<start_function_call>", "<end_function_call>"
DECL_START, DECL_END = "<start_function_declaration>", "<end_function_declaration>"
RESP_START, RESP_END = "<start_function_response>", "<end_function_response>"

_CALL = re.compile(
    re.escape(CALL_START) + r"\s*call:([^{<\s]*)\s*(.*?)(" + re.escape(CALL_END) + r"|$)", re.DOTALL
)


# ---- the value syntax ------------------------------------------------------------------------


def encode_value(value: Any) -> str:
    """A Python value in FunctionGemma's value syntax."""
    if isinstance(value, str):
        return f"{ESC}{value}{ESC}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{encode_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode_value(v) for v in value) + "]"
    return encode_value(str(value))


class _Decoder:
    """Recursive-descent reader for the value syntax; tolerant of whitespace and bare words."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"{what} at offset {self.pos} in {self.text[:80]!r}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def value(self) -> Any:
        self.skip()
        text = self.text
        if text.startswith(ESC, self.pos):
            end = text.find(ESC, self.pos + len(ESC))
            if end < 0:
                raise self.error("unterminated <escape> string")
            out = text[self.pos + len(ESC) : end]
            self.pos = end + len(ESC)
            return out
        if text.startswith("{", self.pos):
            return self.object()
        if text.startswith("[", self.pos):
            return self.array()
        match = re.compile(r"[^,}\]<]*").match(text, self.pos)
        word = match.group(0).strip() if match else ""
        if not word:
            raise self.error("expected a value")
        self.pos = match.end() if match else self.pos
        if word in ("true", "false"):
            return word == "true"
        if word == "null":
            return None
        try:
            return json.loads(word)
        except (ValueError, RecursionError):
            return word  # a bare word: keep it as text, the schema decides

    def object(self) -> dict[str, Any]:
        self.pos += 1
        out: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            self.skip()
            if self.text.startswith(ESC, self.pos):
                key = self.value()
            else:
                colon = self.text.find(":", self.pos)
                if colon < 0:
                    raise self.error("expected key:")
                key = self.text[self.pos : colon].strip()
                self.pos = colon
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.error("expected ':'")
            self.pos += 1
            out[str(key)] = self.value()
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("}", self.pos):
                self.pos += 1
                return out
            else:
                raise self.error("expected ',' or '}'")

    def array(self) -> list[Any]:
        self.pos += 1
        out: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return out
        while True:
            out.append(self.value())
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("]", self.pos):
                self.pos += 1
                return out
            else:
                raise self.error("expected ',' or ']'")


def decode_value(text: str) -> Any:
    """Parse one value in FunctionGemma's syntax; raises ValueError with the offset on bad input."""
    decoder = _Decoder(text)
    value = decoder.value()
    decoder.skip()
    if decoder.pos != len(text):
        raise decoder.error("unexpected trailing text")
    return value


# ---- the argument grammar --------------------------------------------------------------------

# Text that never contains "<escape>". TagDispatch with `excludes` is xgrammar's own construct for this
# (the qwen_xml style uses it for `</parameter>`); it compiles far faster on a real vocabulary than an
# equivalent hand-written automaton (bench/constraints.py, SmolLM2 vocabulary, 10 tools: ~1.5 s -> ~60 ms).
_STRING_RULES = [
    'fg_string ::= "<escape>" fg_text "<escape>"',
    'fg_text ::= TagDispatch(loop_after_dispatch=false, excludes=("<escape>"))',
]
_BASE_RULES = [
    *_STRING_RULES,
    'fg_integer ::= "-"? ("0" | [1-9] [0-9]*)',
    'fg_number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+\\-]? [0-9]+)?',
    'fg_boolean ::= "true" | "false"',
    "fg_key ::= [a-zA-Z_] [a-zA-Z0-9_]*",
    'fg_any ::= fg_string | fg_number | fg_boolean | "null" | fg_any_array | fg_any_object',
    'fg_any_array ::= "[" (fg_any ("," fg_any)*)? "]"',
    'fg_any_object ::= "{" (fg_key ":" fg_any ("," fg_key ":" fg_any)*)? "}"',
]


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _GrammarWriter:
    """Writes EBNF rules for a JSON schema in FunctionGemma's value syntax."""

    def __init__(self) -> None:
        self.rules: list[str] = []
        self.count = 0

    def new_rule(self, body: str) -> str:
        self.count += 1
        name = f"fg_r{self.count}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: Any) -> str:
        if schema is True or not isinstance(schema, dict):
            return "fg_any"
        if "const" in schema:
            return _literal(encode_value(schema["const"]))
        if "enum" in schema:
            return "(" + " | ".join(_literal(encode_value(v)) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return "(" + " | ".join(self.value(sub) for sub in schema[key]) + ")"
        declared = schema.get("type")
        if isinstance(declared, list):
            return "(" + " | ".join(self.value({**schema, "type": t}) for t in declared) + ")"
        if declared == "string":
            return "fg_string"
        if declared == "integer":
            return "fg_integer"
        if declared == "number":
            return "fg_number"
        if declared == "boolean":
            return "fg_boolean"
        if declared == "null":
            return '"null"'
        if declared == "array":
            item = self.value(schema.get("items", True))
            return self.new_rule(f'"[" ({item} ("," {item})*)? "]"')
        if declared == "object" or "properties" in schema:
            return self.object(schema)
        return "fg_any"

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties") or {}
        if not properties:
            return '"{}"' if schema.get("additionalProperties") is False else "fg_any_object"
        required = set(schema.get("required") or [])
        names = list(properties)
        # Properties come in declared order; optional ones may be skipped. Two rules per position:
        # "nothing written yet" (no comma before the next property) and "something written".
        first, later = ['""'], ['""']  # the state after the last property: done
        for name in reversed(names):
            prop = f"{_literal(name + ':')} {self.value(properties[name])}"
            first_alts = [f"{prop} {later[0]}"]
            later_alts = [f'"," {prop} {later[0]}']
            if name not in required:
                first_alts.append(first[0])
                later_alts.append(later[0])
            first = [self.new_rule(" | ".join(first_alts))]
            later = [self.new_rule(" | ".join(later_alts))]
        return self.new_rule(f'"{{" {first[0]} "}}"')


def args_grammar(schema: dict[str, Any]) -> str:
    """EBNF (root rule `root`) for one tool's `{...}` arguments in FunctionGemma syntax."""
    writer = _GrammarWriter()
    root = writer.object({"type": "object", **(schema or {})})
    return "\n".join([f"root ::= {root}", *writer.rules, *_BASE_RULES])


# ---- the adapter -----------------------------------------------------------------------------


def _declaration_schema(value: Any) -> Any:
    """JSON schema with type names upper-cased (STRING, OBJECT), as FunctionGemma declares them."""
    if isinstance(value, dict):
        return {
            k: (v.upper() if k == "type" and isinstance(v, str) else _declaration_schema(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_declaration_schema(v) for v in value]
    return value


class FunctionGemmaAdapter(ModelAdapter):
    """FunctionGemma (Gemma 3 270M tuned for function calling)."""

    name = "function_gemma"
    call_trigger = CALL_START
    call_separator = ""
    parameter_name_pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"  # bare keys, as `fg_key` in the grammar

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{CALL_START}call:{name}{encode_value(dict(arguments))}{CALL_END}"

    def tools_prompt(self, tools: list[ToolSchema]) -> str:
        declarations = "".join(
            f"{DECL_START}declaration:{t.name}"
            + encode_value({"description": t.description, "parameters": _declaration_schema(t.parameters)})
            + DECL_END
            for t in tools
        )
        return f"You are a model that can call the following functions{declarations}"

    def format_results(self, results: list[Message]) -> str:
        parts = []
        for message in results:
            try:
                value = json.loads(message.content)
            except (ValueError, RecursionError):
                value = message.content
            body = value if isinstance(value, dict) else {"result": value}
            parts.append(f"{RESP_START}response:{message.name or 'tool'}{encode_value(body)}{RESP_END}")
        return "".join(parts)

    def extract_calls(self, text: str) -> tuple[str, list[RawCall], list[str]]:
        calls: list[RawCall] = []
        errors: list[str] = []
        for match in _CALL.finditer(text):
            name, body, end = match.group(1).strip(), match.group(2).strip(), match.group(3)
            index = len(calls) + len(errors) + 1
            try:
                arguments = decode_value(body) if body else {}
            except (ValueError, RecursionError) as exc:
                what = "truncated call" if not end else "bad arguments"
                errors.append(f"call {index} ({name}): {what}: {exc}")
                continue
            if not isinstance(arguments, dict):
                errors.append(f"call {index} ({name}): arguments must be {{key:value,...}}, got {body!r}")
                continue
            calls.append(RawCall(name, arguments))
        return _CALL.sub("", text), calls, errors

    def call_tags(self, tools: list[ToolSchema]) -> list[dict[str, Any]]:
        return [
            {
                "type": "tag",
                "begin": f"{CALL_START}call:{t.name}",
                "content": {"type": "grammar", "grammar": args_grammar(t.parameters)},
                "end": CALL_END,
            }
            for t in tools
        ]
