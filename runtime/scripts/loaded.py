"""`LoadedScript`: what the loader read from a `.pym`, as plain data: declarations, problems, code.

The loader (`runtime.scripts.loader`) makes one (as a `Script`) from a file or text; nothing else builds
one. It is plain data plus a few derived views: the JSON Schema of its inputs (what a model is shown), its
load problems as a failed `ToolResult` (what a run returns instead of running), and type stubs of its
declarations (for Monty's type checker). It does not run: the modules that run a script (`run`, `inputs`,
`externals`, `errors`) take a `LoadedScript`, and `Script` (`runtime.scripts.script`), the name callers
use, adds `Script.run` on top. Keeping the data below the runner is what lets the runner's modules name
the type without importing the module that imports them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from runtime.scripts.specs import Diagnostic, ExternalSpec, InputSpec, parameters_schema
from runtime.types import ToolResult

__all__ = ["LoadedScript", "first_paragraph"]


@dataclass(eq=False)
class LoadedScript:
    """A loaded `.pym`: its declarations, its diagnostics, and the line-preserving code Monty runs."""

    name: str
    source: str
    path: str | None = None
    docstring: str | None = None
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    externals: dict[str, ExternalSpec] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    code: str = ""

    @property
    def filename(self) -> str:
        """The name errors are reported under: the path as given, or `<name>.pym`."""
        return self.path or f"{self.name}.pym"

    @property
    def parsed(self) -> bool:
        """False when the source does not parse (then inputs, externals and docstring are unknown)."""
        return not any(d.kind == "parse" for d in self.diagnostics)

    @property
    def ok(self) -> bool:
        """True when the script loaded without diagnostics and can run."""
        return not self.diagnostics

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the source (first 16 hex chars): identifies this version of the script."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    @property
    def description(self) -> str:
        """The docstring's first paragraph on one line ("" without a docstring)."""
        return first_paragraph(self.docstring)

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """JSON Schema of the inputs (an object with `additionalProperties: false`)."""
        return parameters_schema(self.inputs.values())

    def error(self) -> ToolResult | None:
        """The load problems as a failed `ToolResult` (kind of the first), or None when the script is ok."""
        if not self.diagnostics:
            return None
        first = self.diagnostics[0]
        if len(self.diagnostics) == 1:
            message = first.message
        else:
            message = f"{len(self.diagnostics)} problems in {self.filename}:\n" + "\n".join(
                f"- line {d.line}: {d.message}" if d.line else f"- {d.message}" for d in self.diagnostics
            )
        return ToolResult.failure(first.kind, message, line=first.line)

    def stubs(self) -> str:
        """Type stubs for the declarations (`name: T` and `def f(...) -> R: ...`), e.g. for a type checker."""
        lines = [f"{spec.name}: {spec.annotation}" for spec in self.inputs.values()]
        lines += [f"{ext.signature()}: ..." for ext in self.externals.values()]
        return "\n".join(lines) + ("\n" if lines else "")

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"{len(self.diagnostics)} diagnostics"
        return (f"{type(self).__name__}({self.name!r}, inputs={list(self.inputs)}, "
                f"externals={list(self.externals)}, {status})")


def first_paragraph(docstring: str | None) -> str:
    """A docstring's first paragraph on one line ("" for none): a tool's description."""
    if not docstring:
        return ""
    paragraph = re.split(r"\n\s*\n", docstring.strip(), maxsplit=1)[0]
    return " ".join(paragraph.split())
