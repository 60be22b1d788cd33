"""Values more than one bundle section holds: a limits spec and an output model reference.

`limits:` is both the bundle's default and each tool entry's own (merged over it), and an output model is
named the same way in `output_models:` and in a tool's `output_model:`, so each is read here once and
reports its problems at whichever YAML path the caller gives. Like the sections, these never raise: a
bad value is recorded in `problems` and the result is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runtime.bundle.problems import Problem, did_you_mean
from runtime.externals import ExternalsError, import_object
from runtime.scripts import Limits, LimitsError

__all__ = ["limits_value", "output_model_value"]


def limits_value(spec: Any, path: str, problems: list[Problem]) -> Limits | None:
    """A preset name or an inline `{max_memory: 16mb, ...}` as `Limits` (None for a bad one; None or an
    empty spec gives what `Limits.resolve` gives)."""
    if isinstance(spec, dict):
        allowed = list(Limits.model_fields)
        bad = [k for k in spec if k not in allowed]
        for k in bad:
            problems.append((f"{path}.{k}", f"unknown limits key{did_you_mean(str(k), allowed)}; "
                                            f"allowed keys: {', '.join(allowed)}"))
        if bad:
            return None
        for k, v in spec.items():
            try:
                Limits.resolve({k: v})
            except LimitsError as e:
                problems.append((f"{path}.{k}", str(e)))
                return None
    try:
        return Limits.resolve(spec)
    except LimitsError as e:
        problems.append((path, str(e)))
        return None


def output_model_value(ref: Any, named: dict[str, Any], root: Path, path: str,
                       problems: list[Problem]) -> Any:
    """What a tool's result is checked against: a name from `output_models` (`named`), an inline JSON
    Schema, or a pydantic class as `module:Class` (imported relative to the bundle folder `root`); None for
    none, or after recording why `ref` is none of these."""
    if ref is None:
        return None
    if isinstance(ref, str) and ref in named:
        return named[ref]
    if isinstance(ref, dict):
        return _schema(ref, path, problems)
    if isinstance(ref, str) and ":" in ref:
        return _model_class(ref, root, path, problems)
    names = ", ".join(named) or "none defined"
    problems.append((path, f"{ref!r} is not an output model: use a name from output_models ({names}), "
                           "'module:Class', or an inline JSON Schema object"))
    return None


def _schema(ref: dict[str, Any], path: str, problems: list[Problem]) -> dict[str, Any] | None:
    """An inline JSON Schema, if it is one (`schema_problems`) and the result validator checks every
    keyword it uses: a schema no result could pass is refused here, not on every call of the tool."""
    from runtime.validate import schema_problems, unsupported_keywords

    bad = unsupported_keywords(ref)
    if bad:
        problems.append((path, f"JSON Schema keywords not supported: {', '.join(bad)}"))
    invalid = schema_problems(ref)
    problems.extend((path, f"not a valid JSON Schema: {p}") for p in invalid)
    return None if bad or invalid else ref


def _model_class(ref: str, root: Path, path: str, problems: list[Problem]) -> type[BaseModel] | None:
    """`module:Class`, imported, if it is a pydantic model."""
    try:
        obj = import_object(ref, root=root, what="output model")
    except ExternalsError as e:
        problems.append((path, str(e)))
        return None
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        problems.append((path, f"{ref!r} is not a pydantic BaseModel class"))
        return None
    return obj
