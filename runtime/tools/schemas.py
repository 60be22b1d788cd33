"""The rules a tool must satisfy, and what a script that breaks them becomes.

A model picks tools by name and description, so both are checked before a tool exists: a name matches
`^[a-z0-9_-]{1,64}$` (what every model API accepts; a script's name is its file stem) and a description
(the docstring's first paragraph) has 1-200 characters. A script that fails these rules or its own load
checks is a `LoadFailure` value carrying every diagnostic, never a tool that fails at its first call.

A script without a docstring is still a tool: grail does not require one, and scripts written for grail
must load unchanged. That is a warning (`script_tool_warnings`), and the description then comes from the
bundle entry's `description:` or from `default_description`, which names the tool and its inputs.
`schema_from_inputs` gives the JSON Schema `parameters` a model is shown for a script's inputs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from runtime.scripts import Diagnostic, InputSpec, Script, parameters_schema
from runtime.types import ToolError

__all__ = [
    "MAX_DESCRIPTION",
    "TOOL_NAME",
    "LoadFailure",
    "ScriptLoadError",
    "default_description",
    "schema_from_inputs",
    "script_tool_diagnostics",
    "script_tool_warnings",
    "tool_diagnostics",
]

TOOL_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
MAX_DESCRIPTION = 200


class LoadFailure(msgspec.Struct, frozen=True, omit_defaults=True):
    """A script that could not become a tool, with the first error and every diagnostic."""

    path: str
    error: ToolError
    diagnostics: tuple[Diagnostic, ...] = ()

    def __str__(self) -> str:
        if self.diagnostics:
            return "\n".join(str(d) for d in self.diagnostics)
        line = f":{self.error.line}" if self.error.line else ""
        return f"{self.path}{line}: {self.error.kind} error: {self.error.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            **self.error.to_dict(),
            "diagnostics": [d.to_dict() for d in self.diagnostics],
        }


class ScriptLoadError(Exception):
    """Raised by `ScriptTool(...)` for a script that cannot be a tool; carries the `LoadFailure`."""

    def __init__(self, failure: LoadFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure

    @property
    def error(self) -> ToolError:
        return self.failure.error


def tool_diagnostics(
    name: str, description: str, *, file: str | None = None, docstring_line: int | None = 1
) -> list[Diagnostic]:
    """The tool rules: name `^[a-z0-9_-]{1,64}$`, description 1-200 characters."""
    found: list[Diagnostic] = []
    if not TOOL_NAME.match(name):
        suggestion = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_")[:64] or "my_tool"
        found.append(
            Diagnostic(
                "check",
                f"tool name {name!r} is invalid: names must match ^[a-z0-9_-]{{1,64}}$ "
                f"(lowercase letters, digits, _ and -); rename the file, e.g. to "
                f"{suggestion}.pym",
                None,
                file,
            )
        )
    if not description:
        found.append(
            Diagnostic(
                "check",
                "the script has no docstring: start it with a docstring whose first "
                "paragraph says what the tool does (1-200 characters); the model reads "
                "it to decide when to call the tool",
                docstring_line,
                file,
            )
        )
    elif len(description) > MAX_DESCRIPTION:
        found.append(
            Diagnostic(
                "check",
                f"the description (the docstring's first paragraph) is {len(description)} "
                f"characters; shorten it to at most {MAX_DESCRIPTION} and move details "
                "to a later paragraph",
                docstring_line,
                file,
            )
        )
    return found


def script_tool_diagnostics(script: Script) -> list[Diagnostic]:
    """Everything that keeps `script` from being a tool: its load diagnostics, then the tool rules (the
    description rule only when the script parsed, since an unparsed script's docstring is unknown). A
    missing docstring is not among them: it is a warning (`script_tool_warnings`)."""
    rules = tool_diagnostics(script.name, script.description or "-", file=script.filename)
    if not script.parsed:
        rules = [d for d in rules if d.line is None]
    return list(script.diagnostics) + rules


def script_tool_warnings(script: Script, *, description: str | None = None) -> list[Diagnostic]:
    """What is worth fixing but does not stop `script` from being a tool: a missing docstring (unless the
    bundle gives a `description`), since the model then chooses the tool by a generic default text."""
    if not script.parsed or script.description or description:
        return []
    return [
        Diagnostic(
            "check",
            "the script has no docstring, so the model is shown the default description "
            f"{default_description(script)!r}; start the script with a docstring whose first paragraph "
            "says what the tool does (1-200 characters), or set `description:` on its bundle entry",
            1,
            script.filename,
        )
    ]


def default_description(script: Script) -> str:
    """The description of a tool whose script has no docstring: its name and inputs, within the rule."""
    inputs = ", ".join(script.inputs)
    text = f"Runs the {script.name} script" + (f" with inputs {inputs}." if inputs else ".")
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 3] + "..."


def schema_from_inputs(inputs: Mapping[str, InputSpec] | Iterable[InputSpec]) -> dict[str, Any]:
    """The JSON Schema `parameters` object for a script's `Input()` declarations."""
    return parameters_schema(inputs.values() if isinstance(inputs, Mapping) else inputs)
