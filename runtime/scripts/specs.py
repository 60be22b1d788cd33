"""What the loader learns from a `.pym` file: its inputs, its externals, and its diagnostics.

The names follow grail's (`InputSpec`, `ExternalSpec`, `ParamSpec`; `type_annotation`, `lineno`,
`return_type` are kept as aliases) so code written against grail's metadata reads the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from runtime.types import ToolError

__all__ = ["MISSING", "Diagnostic", "ExternalSpec", "InputSpec", "ParamSpec", "parameters_schema"]


class _Missing:
    """Sentinel: an input without a default (None is a real default)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class Diagnostic(msgspec.Struct, frozen=True, omit_defaults=True):
    """One problem found while loading a script: `file:line:column: kind: message`."""

    kind: Literal["parse", "check"]
    message: str
    line: int | None = None
    file: str | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.file or "<script>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.kind} error: {self.message}"

    def to_error(self) -> ToolError:
        return ToolError(self.kind, self.message, self.line)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "line": self.line,
            "file": self.file,
            "column": self.column,
        }


@dataclass(frozen=True, slots=True)
class InputSpec:
    """`name: annotation = Input("name", default=..., description=...)`."""

    name: str
    annotation: str
    required: bool
    default: Any = MISSING
    description: str | None = None
    line: int = 0
    schema: dict[str, Any] = field(default_factory=dict)

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING

    # grail's attribute names
    @property
    def type_annotation(self) -> str:
        return self.annotation

    @property
    def lineno(self) -> int:
        return self.line


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter of an `@external` declaration."""

    name: str
    annotation: str | None
    kind: Literal["positional_only", "positional", "var_positional", "keyword_only", "var_keyword"]
    default: str | None = None  # the default's source text, if any
    has_default: bool = False

    @property
    def type_annotation(self) -> str | None:
        return self.annotation

    def render(self) -> str:
        text = self.name
        if self.kind == "var_positional":
            text = "*" + text
        elif self.kind == "var_keyword":
            text = "**" + text
        if self.annotation:
            text += f": {self.annotation}"
        if self.has_default:
            text += f" = {self.default}" if self.annotation else f"={self.default}"
        return text


@dataclass(frozen=True, slots=True)
class ExternalSpec:
    """`@external [async] def name(params) -> returns: ...` — a host function the script calls."""

    name: str
    parameters: tuple[ParamSpec, ...]
    returns: str | None
    is_async: bool
    docstring: str | None = None
    line: int = 0
    end_line: int = 0

    @property
    def return_type(self) -> str | None:
        return self.returns

    @property
    def lineno(self) -> int:
        return self.line

    def signature(self) -> str:
        """`async def fetch(url: str, *, timeout: float = 1.0) -> str` (a stub line)."""
        parts: list[str] = []
        seen_kwonly_marker = False
        for i, p in enumerate(self.parameters):
            if p.kind == "keyword_only" and not seen_kwonly_marker:
                if not any(q.kind == "var_positional" for q in self.parameters[:i]):
                    parts.append("*")
                seen_kwonly_marker = True
            parts.append(p.render())
            if p.kind == "positional_only" and (
                i + 1 == len(self.parameters) or self.parameters[i + 1].kind != "positional_only"
            ):
                parts.append("/")
        returns = f" -> {self.returns}" if self.returns else ""
        return f"{'async ' if self.is_async else ''}def {self.name}({', '.join(parts)}){returns}"


def parameters_schema(specs: Iterable[InputSpec]) -> dict[str, Any]:
    """The JSON Schema `parameters` object of a script's `Input()` declarations: what the model is shown
    and what arguments are validated against, so there is exactly one way to build it."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for spec in specs:
        prop = dict(spec.schema)
        if spec.description:
            prop["description"] = spec.description
        if spec.has_default:
            prop["default"] = spec.default
        properties[spec.name] = prop
        if spec.required:
            required.append(spec.name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
