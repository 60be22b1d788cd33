"""A tool's parameters schema, shaped for decoding: closed for our own grammars, strict for `tools=`.

    closed_schema(tool.parameters)    # the root object admits no undeclared argument (our constraints)
    api_tools(tools, strict=True)     # the `tools=[...]` entries, each `"strict": true` with a strict schema

Why strict: with `tool_choice` "required" (or "auto" and a tool parser), vLLM builds the decoding
constraint itself from `tools`. vLLM 0.33's hermes and qwen3_coder tool parsers then constrain only the
call envelope and the function name, and take the arguments as any JSON, unless the function says
`"strict": true`; then its parameters schema is enforced. OpenAI's convention is the same flag.

What strict mode accepts. vLLM enforces any schema its xgrammar backend compiles, and asks nothing more
of it. OpenAI's own strict mode is narrower: every object must say `additionalProperties: false` and list
every property in `required`. `strict_schema` produces a schema both accept (as far as structure goes):

- every object that declares `properties` is closed (`additionalProperties: false`) unless it says
  otherwise; xgrammar treats such objects as closed in a tool's schema anyway, so nothing changes on vLLM;
- every property is required, and one the tool has as optional becomes nullable, so a model says "not
  given" with `null`; `runtime.model.adapters.arguments` drops such a null again before the tool sees it;
- type names that are not JSON Schema's (`"float"`, `"dict"`) are renamed (xgrammar rejects them).

Keywords OpenAI's strict mode does not support (it rejects, for example, `patternProperties`) are kept:
they constrain decoding on vLLM, and OpenAI names the keyword in its HTTP 400.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from runtime.jsontypes import schema_type_name
from runtime.types import ToolSchema

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The parameters schema with `additionalProperties: false` unless it says otherwise.

    Why: a grammar built from an open schema lets the model invent arguments; tools declare what
    they take, so the constraint should admit exactly that. Type names that are not JSON Schema's
    are renamed as well (`"float"` -> `"number"`): xgrammar rejects them, vLLM's parsers read them.
    """
    out = _walk(schema if isinstance(schema, dict) else {}, _rename_types)
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    out.setdefault("additionalProperties", False)
    return out


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The parameters schema in the form strict mode accepts (see the module docstring)."""
    return _walk(closed_schema(schema), _make_strict)


def api_tools(tools: Sequence[ToolSchema], *, strict: bool) -> list[dict[str, Any]]:
    """The OpenAI `tools=[...]` entries; with `strict`, each function is marked and its schema made strict."""
    if not strict:
        return [t.to_openai() for t in tools]
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": strict_schema(t.parameters),
                "strict": True,
            },
        }
        for t in tools
    ]


def _walk(node: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`node` with `change` applied to every sub-schema, innermost first (a copy: `node` is not touched)."""
    if isinstance(node, list):
        return [_walk(n, change) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_walk(n, change) for n in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _walk(n, change) for name, n in out[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict | list):
            out[key] = _walk(out[key], change)
    return change(out)


def _rename_types(schema: dict[str, Any]) -> dict[str, Any]:
    declared = schema.get("type")
    if isinstance(declared, str):
        schema["type"] = schema_type_name(declared)
    elif isinstance(declared, list):
        schema["type"] = [schema_type_name(t) if isinstance(t, str) else t for t in declared]
    return schema


def _make_strict(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema.setdefault("additionalProperties", False)
        required = schema.get("required") or []
        schema["properties"] = {
            name: prop if name in required else _nullable(prop) for name, prop in properties.items()
        }
        schema["required"] = list(properties)
    return schema


def _nullable(schema: Any) -> Any:
    """`schema`, also admitting null (unchanged if it already does)."""
    if not isinstance(schema, dict) or _admits_null(schema):
        return schema
    declared = schema.get("type")
    if "enum" not in schema and "const" not in schema:
        if isinstance(declared, str):
            return {**schema, "type": [declared, "null"]}
        if isinstance(declared, list):
            return {**schema, "type": [*declared, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _admits_null(schema: dict[str, Any]) -> bool:
    """Whether null is valid under `schema`, as far as its type keywords tell."""
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if "enum" in schema:
        return None in (schema["enum"] or [])
    if "const" in schema:
        return schema["const"] is None
    branches = [b for key in ("anyOf", "oneOf") for b in schema.get(key) or []]
    if branches:
        return any(isinstance(b, dict) and _admits_null(b) for b in branches)
    # no type keyword: anything goes, unless the schema describes an object or array without saying so
    return declared is None and not any(k in schema for k in ("properties", "items", "$ref"))
