"""Coercing tool-call argument values by the tool's JSON schema.

Why this exists: model families disagree on how values travel. Qwen3-Coder's XML carries every
parameter as text (`<parameter=days>3</parameter>`), FunctionGemma writes bare words, and even
JSON-speaking models sometimes quote a number. The tool's JSON schema is the one authority on what a
value should be, so every adapter funnels its raw values through here. Coercion is best effort and
never raises: a value that cannot be coerced is passed on unchanged, and the tool's own input check
reports it as a `ToolError(kind="input")` the model can read and fix.

Two leniencies follow what vLLM's own tool parsers accept from real models: an object or array value
written as a Python literal (`{'key': 'value'}`, `['a', 'b']`, `True`) is read with `ast.literal_eval`
when it is not JSON, and type names that are not JSON Schema's (`"float"`, `"int"`, `"dict"`) count
as the JSON Schema type they name. And a `null` given for an optional property whose schema does not
admit null is dropped, as if omitted: that is how a model under a strict schema (every property
required, optional ones nullable) says "not given".
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from runtime.jsontypes import json_type, schema_type_name

_INT = re.compile(r"^[+-]?\d+$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_LITERAL_MAX_CHARS = 100_000  # a longer value is not read as a Python literal (parsing cost is unbounded)


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema admits, in preference order (string last: text fits it trivially)."""
    if not isinstance(schema, dict):
        return []
    found: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, str):
        found.append(schema_type_name(declared))
    elif isinstance(declared, list):
        found.extend(schema_type_name(t) for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            found.extend(schema_types(sub))
    if not found:
        for value in [schema.get("const"), *(schema.get("enum") or [])]:
            if value is not None:
                found.append(json_type(value))
    unique = list(dict.fromkeys(found))
    if "string" in unique:
        unique.remove("string")
        unique.append("string")
    return unique


def _sub_schema(schema: dict[str, Any], type_name: str) -> dict[str, Any]:
    """The branch of an anyOf/oneOf that declares `type_name` (so nested properties are found)."""
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if type_name in schema_types(sub):
                return sub
    return schema


def value_from_text(text: str, schema: Any) -> Any:
    """Turn a parameter that arrived as text into the type its schema asks for."""
    types = schema_types(schema)
    stripped = text.strip()
    for type_name in types:
        if type_name == "string":
            return text
        if type_name == "integer" and _INT.match(stripped):
            return int(stripped)
        if type_name == "number" and _NUMBER.match(stripped):
            number = float(stripped)
            return int(number) if _INT.match(stripped) else number
        if type_name == "boolean" and stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if type_name == "null" and stripped.lower() in ("null", "none", ""):
            return None
        if type_name in ("object", "array"):
            decoded = _structured(stripped)
            if json_type(decoded) == type_name:
                return coerce_value(decoded, _sub_schema(schema, type_name))
    if types:
        return text  # nothing fits: keep it and let the tool's input check explain
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return text


def _structured(text: str) -> Any:
    """`text` as JSON, else as a Python literal made JSON-shaped, else None."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    if len(text) > _LITERAL_MAX_CHARS:
        return None
    try:
        # literal_eval evaluates literals only (no names, calls or operators beyond signed numbers)
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return _json_shaped(value)


def _json_shaped(value: Any) -> Any:
    """A Python literal's value as JSON would hold it (tuples as lists), or None if JSON cannot."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        items = [_json_shaped(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value, strict=True)) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        out = {k: _json_shaped(v) for k, v in value.items()}
        return None if any(out[k] is None and value[k] is not None for k in value) else out
    return None  # sets, bytes, complex numbers, ... have no JSON form


def coerce_value(value: Any, schema: Any) -> Any:
    """Bring an already-decoded value closer to its schema (quoted numbers, nested text values)."""
    if not isinstance(schema, dict):
        return value
    types = schema_types(schema)
    if not types:
        return value
    if isinstance(value, str) and "string" not in types:
        return value_from_text(value, schema)
    if isinstance(value, float) and "integer" in types and "number" not in types and value.is_integer():
        return int(value)
    if isinstance(value, dict) and "object" in types:
        return coerce_arguments(value, _sub_schema(schema, "object"))
    if isinstance(value, list) and "array" in types:
        items = _sub_schema(schema, "array").get("items")
        return [coerce_value(item, items) for item in value]
    return value


def coerce_arguments(arguments: dict[str, Any], schema: Any) -> dict[str, Any]:
    """Coerce each argument by its property schema; unknown properties pass through unchanged.

    A `null` for an optional property whose schema does not admit null is dropped (not given).
    """
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return dict(arguments)
    required = schema.get("required") or []
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        prop = properties.get(key)
        if value is None and key not in required and _refuses_null(prop):
            continue
        out[key] = coerce_value(value, prop)
    return out


def _refuses_null(schema: Any) -> bool:
    """Whether a property schema declares its types and null is not among them."""
    types = schema_types(schema)
    return bool(types) and "null" not in types
