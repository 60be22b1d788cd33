"""JSON Schema's type names for plain Python values: the one definition shared by the schema validator
(`runtime.validate`, which checks tool arguments and outputs) and the argument coercer
(`runtime.model.adapters.arguments`, which repairs what models send). Both must agree on what "integer" or
"array" means, or a coerced argument could still fail validation. Dependency-free on purpose: the model
adapters import it without pulling in the sandbox layer.

Some tool schemas name types the way programming languages do (`"float"`, `"int"`, `"dict"`, `"String"`).
vLLM's tool parsers read those by name, so both sides here do too: `schema_type_name` maps them to JSON
Schema's names.
"""

from __future__ import annotations

from typing import Any

_ARRAYS = (list, tuple, set, frozenset)


def json_type(value: Any) -> str:
    """`null`, `boolean`, `integer`, `number`, `string`, `array`, `object`; a non-JSON value's class name."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, _ARRAYS):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# the non-JSON-Schema type names vLLM 0.33's tool parsers accept (`vllm.tool_parsers.utils._TYPE_ALIASES`)
TYPE_ALIASES: dict[str, str] = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
    "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
    "float": "number", "float32": "number", "float64": "number", "double": "number",
    "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}


def schema_type_name(name: str) -> str:
    """A schema's type name as JSON Schema spells it: `"float"` -> `"number"`, `"String"` -> `"string"`."""
    key = name.strip().lower()
    return TYPE_ALIASES.get(key, key)


def is_type(value: Any, kind: str) -> bool:
    """Whether `value` is an instance of JSON Schema type `kind` (a whole float counts as an integer).

    `kind` may be an alias (`"float"`, `"dict"`, ...: see `schema_type_name`).
    """
    kind = schema_type_name(kind) if isinstance(kind, str) else kind
    if kind == "integer":
        return json_type(value) == "integer" or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return json_type(value) in ("integer", "number")
    return kind in _NAMES and json_type(value) == kind


_NAMES = frozenset({"null", "boolean", "string", "array", "object"})
__all__ = ["TYPE_ALIASES", "is_type", "json_type", "schema_type_name"]
