"""JSON Schema's type names for plain Python values: the one definition shared by the schema validator
(`runtime.scripts.validate`, which checks tool arguments and outputs) and the argument coercer
(`runtime.model.adapters.arguments`, which repairs what models send). Both must agree on what "integer" or
"array" means, or a coerced argument could still fail validation. Dependency-free on purpose: the model
adapters import it without pulling in the sandbox layer.
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


def is_type(value: Any, kind: str) -> bool:
    """Whether `value` is an instance of JSON Schema type `kind` (a whole float counts as an integer)."""
    if kind == "integer":
        return json_type(value) == "integer" or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return json_type(value) in ("integer", "number")
    return kind in _NAMES and json_type(value) == kind


_NAMES = frozenset({"null", "boolean", "string", "array", "object"})
__all__ = ["is_type", "json_type"]
