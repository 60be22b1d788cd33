"""Results out: what a script returns becomes plain JSON data, within `max_output`, of the declared shape.

A tool's result travels in events and messages as JSON, so every sandbox value is converted first
(`to_plain`: tuples and sets become lists, Decimal and dates become strings, a sandbox class instance
becomes its attributes, and so on). Then the JSON size is checked against `max_output`, because a result
too big for the model's context or for one message must be a clear `limit` error, not a failure later.
Last, the `output_model` checks the shape: a pydantic model or any type (validated with pydantic, and the
validated value is what the caller gets) or a JSON Schema dict (checked by `runtime.validate`).
Every failure is a `ToolError` the model can act on.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import msgspec
from pydantic_monty import MontyClassProxy, MontyClassTypeProxy, MontyStdTypeProxy

from runtime.quantities import human_size
from runtime.types import ToolError, ToolResult
from runtime.validate import describe_value, unsupported_keywords, validate

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from runtime.scripts.limits import Limits

__all__ = ["Unconvertible", "check_output", "finish", "to_plain"]

_INT64 = (-(1 << 63), (1 << 64) - 1)


class Unconvertible(Exception):
    """A value `to_plain` cannot turn into JSON data (nested more than 100 levels deep)."""


def to_plain(value: Any, _depth: int = 0) -> Any:
    """A sandbox result as plain JSON-able data.

    tuple/set -> list (sets sorted when possible), Decimal -> str (exact), date/datetime/time -> ISO
    string, Path -> str, bytes -> str (UTF-8, else "base64:..."), complex -> str, a sandbox class
    instance (`MontyClassProxy`) -> its attributes, ints beyond 64 bits -> str, non-string dict keys ->
    their JSON text.
    """
    if _depth > 100:
        raise Unconvertible("the result is nested more than 100 levels deep")
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        return value if _INT64[0] <= value <= _INT64[1] else str(value)
    if isinstance(value, dict):
        return {_key(k): to_plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, _depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return _set(value, _depth)
    if isinstance(value, MontyClassProxy):
        return to_plain(dict(value.attributes), _depth + 1)
    for kinds, convert in _LEAVES:
        if isinstance(value, kinds):
            return convert(value)
    return str(value)  # complex, and anything else: its text


def _set(value: set[Any] | frozenset[Any], depth: int) -> list[Any]:
    """A set as a list, sorted when its items can be (so the same set always reads the same)."""
    items = [to_plain(v, depth + 1) for v in value]
    try:
        return sorted(items)
    except TypeError:
        return items


def _type_name(value: MontyClassTypeProxy) -> str:
    return value.name


def _std_type(value: MontyStdTypeProxy) -> str:
    return f"<{value.kind} {value.name}>"


def _iso(value: datetime.date | datetime.time) -> str:
    return value.isoformat()


def _seconds(value: datetime.timedelta) -> float:
    return value.total_seconds()


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()


# values that hold no other values: (their types, how each becomes JSON data), tried in order
_LEAVES: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (MontyClassTypeProxy, _type_name),
    (MontyStdTypeProxy, _std_type),
    (decimal.Decimal, str),
    ((datetime.date, datetime.time), _iso),  # a datetime is a date
    (datetime.timedelta, _seconds),
    (PurePath, str),
    (bytes, _text),
)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    return json.dumps(to_plain(key), ensure_ascii=False, separators=(",", ":"))


def finish(output: Any, limits: Limits, output_model: Any) -> ToolResult:
    """A run's raw result as the tool's result: converted, within `max_output`, checked by the model."""
    try:
        plain = to_plain(output)
    except Unconvertible as e:
        return ToolResult(error=ToolError("output", f"the script's result cannot be converted to JSON: {e}"))
    size = len(msgspec.json.encode(plain))
    if limits.max_output is not None and size > limits.max_output:
        return ToolResult(
            error=ToolError(
                "limit",
                f"the script's result is {human_size(size)} of JSON, over its "
                f"{human_size(limits.max_output)} "
                "limit (max_output). Return less: summarise, select the fields needed, or paginate.",
                detail="output",
            )
        )
    checked, error = check_output(plain, output_model)
    if error is not None:
        return ToolResult(error=error)
    return ToolResult(output=checked)


@lru_cache(maxsize=256)
def _adapter(model: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(model)


def check_output(output: Any, output_model: Any) -> tuple[Any, ToolError | None]:
    """(the validated output, None) or (None, an `output` error); `output_model` None accepts anything."""
    if output_model is None:
        return output, None
    if isinstance(output_model, dict):
        bad = unsupported_keywords(output_model)
        if bad:
            return None, ToolError(
                "output",
                "the tool's output schema uses keywords this runtime cannot check ("
                + ", ".join(bad[:5])
                + "); fix the host's output schema",
            )
        problems = validate(output, output_model, path="result")
        if problems:
            return None, ToolError(
                "output",
                "the script's result does not match the tool's output schema: "
                + "; ".join(problems)
                + ". Return a value of the declared shape.",
            )
        return output, None
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = _adapter(output_model)
    except TypeError:  # unhashable: build uncached
        adapter = TypeAdapter(output_model)
    try:
        validated = adapter.validate_python(output)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:10]:
            loc = ".".join(str(p) for p in err["loc"]) or "result"
            problems.append(
                f"{'result.' + loc if loc != 'result' else loc}: {err['msg']}"
                f" (got {describe_value(err.get('input'))})"
            )
        name = getattr(output_model, "__name__", str(output_model))
        return None, ToolError(
            "output",
            f"the script's result does not match {name}: "
            + "; ".join(problems)
            + ". Return a value of the declared shape.",
        )
    return adapter.dump_python(validated, mode="json"), None
