"""Arguments in: checked against a tool's parameter schema before anything runs, then coerced.

Every problem with a call's arguments (not an object, a required input missing, an unknown input, a value
of the wrong type) becomes one `input` error that names each problem and what the tool accepts, so the
model can fix its call in one try. `.pym` scripts and Python tools share these checks, so both kinds of
tool answer bad arguments with the same words.

JSON has one number type, so a model may send `5.0` for an integer input: after validation `coerce` turns
integral floats given for integers into ints, which is what the script's annotation promised.
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

from runtime.types import ToolError
from runtime.validate import describe_value, validate

if TYPE_CHECKING:
    from runtime.scripts.loaded import LoadedScript

__all__ = ["check_arguments", "coerce", "prepare_inputs"]

_NO_COERCE = (int, str, bool, type(None))


def did_you_mean(name: str, options: list[str]) -> str:
    """` (did you mean 'x'?)` for the closest option, or ""."""
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def coerce(value: Any, schema: dict[str, Any]) -> Any:
    """After validation: integral floats given for integers become ints (JSON `5.0` for `int`)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if isinstance(value, float) and "integer" in kinds and "number" not in kinds and value.is_integer():
        return int(value)
    if isinstance(value, list):
        if isinstance(schema.get("items"), dict):
            if all(type(v) in _NO_COERCE for v in value):  # nothing to change (the common case)
                return value
            return [coerce(v, schema["items"]) for v in value]
        if schema.get("prefixItems"):
            return [coerce(v, s) for v, s in zip(value, schema["prefixItems"], strict=False)] + value[
                len(schema["prefixItems"]) :
            ]
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: coerce(v, schema["additionalProperties"]) for k, v in value.items()}
    return value


def check_arguments(script_name: str, parameters: dict[str, Any], arguments: object) -> ToolError | None:
    """Arguments against a tool's parameter schema: an `input` error naming every problem, or None."""
    if not isinstance(arguments, dict):
        return ToolError(
            "input", f"arguments must be a JSON object of named inputs, got {describe_value(arguments)}"
        )
    props: dict[str, Any] = parameters.get("properties", {})
    allowed = list(props)
    problems: list[str] = []
    for name in parameters.get("required", []):
        if name not in arguments:
            problems.append(f"missing required input {name!r} ({_type_hint(props.get(name, {}))})")
    for name in arguments:
        if name not in props:
            accepted = ", ".join(allowed) if allowed else "no inputs"
            problems.append(
                f"unknown input {name!r}{did_you_mean(str(name), allowed)}; {script_name} accepts {accepted}"
            )
    for name, value in arguments.items():
        schema = props.get(name)
        if schema is not None and not _plainly_valid(value, schema):
            for p in validate(value, schema, path=str(name), max_errors=3):
                problems.append(f"input {p}")
    if not problems:
        return None
    head = "the arguments do not match the tool's inputs" if len(problems) > 1 else "invalid arguments"
    return ToolError(
        "input", f"{head}: " + "; ".join(problems) + ". Call the tool again with corrected arguments."
    )


#: the Python types that are, exactly, a JSON schema's simple `type` (bool is not an integer here)
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}
#: keywords that say nothing about which values are valid
_ANNOTATIONS = frozenset({"type", "description", "title", "default", "examples"})


def _plainly_valid(value: Any, schema: Any) -> bool:
    """True when `value` is valid for a schema that is only a simple type (`{"type": "integer"}` and
    annotations), seen from the value's exact type; False means "ask `validate`". Why: a worker checks
    every job's arguments, nearly always plain scalars of the right type, and the general validator cost
    about a tenth of a trivial job's own CPU."""
    if type(schema) is not dict:
        return False
    kind = schema.get("type")
    wanted = _PLAIN_TYPES.get(kind) if type(kind) is str else None
    return wanted is not None and type(value) in wanted and schema.keys() <= _ANNOTATIONS


def _type_hint(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind:
        return str(kind)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    return "any value"


def prepare_inputs(script: LoadedScript, inputs: dict[str, Any] | None) -> dict[str, Any] | ToolError:
    """Validated inputs with defaults filled, or an `input` error."""
    inputs = {} if inputs is None else inputs
    error = check_arguments(script.name, script.parameters, inputs)
    if error is not None:
        return error
    prepared: dict[str, Any] = {}
    for name, spec in script.inputs.items():
        value = inputs[name] if name in inputs else spec.default
        prepared[name] = coerce(value, spec.schema)
    return prepared
