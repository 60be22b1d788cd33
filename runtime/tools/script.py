"""`ScriptTool`: a `.pym` script as a tool, and the one object that carries how that tool runs.

A bundle configures each tool (its `Limits` merged over the bundle's, its output model, whether a call
needs approval); a worker runs it; the host reads its content hash to tell workers which version it means.
All three use this object itself: there is no second record of a tool's settings to drift from the first.
`configured` makes the bundle's copy; `execute` runs the script in the Monty sandbox under `limits`
(merged with a call's overrides) and checks its result against `output_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.scripts import Limits, NoteCallback, Script, ScriptNote, load
from runtime.tools.schemas import (
    LoadFailure,
    ScriptLoadError,
    default_description,
    script_tool_diagnostics,
    tool_diagnostics,
)
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolResult, ToolSchema

__all__ = ["ScriptTool"]


class ScriptTool(Described):
    """A `.pym` script as a tool. Raises `ScriptLoadError` if the script has diagnostics or breaks the
    tool rules; use `discover_tools` to collect such failures instead.

    `limits` bound every run (a call's `ToolContext.limits` are merged over them); `output_model` checks
    every result (a pydantic model, any type, or a JSON Schema dict); `externals` are host functions by
    name; `requires_approval` says a call waits for a human's approval before it runs; `description`
    (a bundle entry's) replaces the docstring's; `environ` is the script's `os.environ` (a call's
    `ToolContext.environ` is merged over it).
    """

    def __init__(
        self,
        script: Script,
        *,
        limits: Limits | str | dict[str, Any] | None = None,
        output_model: Any = None,
        externals: dict[str, Callable[..., Any]] | None = None,
        requires_approval: bool = False,
        description: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        problems = script_tool_diagnostics(script)
        if description is not None:
            problems += tool_diagnostics(script.name, description, file=script.filename, docstring_line=None)
        if problems:
            raise ScriptLoadError(LoadFailure(script.filename, problems[0].to_error(), tuple(problems)))
        self.script = script
        self.limits = Limits.resolve(limits)
        self.output_model = output_model
        self.externals = dict(externals or {})
        self.requires_approval = requires_approval
        self.environ = dict(environ or {})
        # where the model's description came from: the bundle entry, the docstring, or the default
        self.description_source = (
            "bundle" if description else "docstring" if script.description else "default"
        )
        text = description or script.description or default_description(script)
        self._schema = ToolSchema(script.name, text, script.parameters)
        self._description = description

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> ScriptTool:
        return cls(load(path), **kwargs)

    def configured(
        self,
        *,
        limits: Limits,
        output_model: Any = None,
        requires_approval: bool = False,
        description: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> ScriptTool:
        """The same script and externals under other settings (what a bundle makes of a discovered tool)."""
        return ScriptTool(
            self.script,
            limits=limits,
            output_model=output_model,
            externals=self.externals,
            requires_approval=requires_approval,
            description=description if description is not None else self._description,
            environ=environ if environ is not None else self.environ,
        )

    @property
    def path(self) -> str | None:
        """The file the script was loaded from (None for a script loaded from text)."""
        return self.script.path

    @property
    def content_hash(self) -> str:
        """Identifies this version of the script (hosts and workers compare it)."""
        return self.script.content_hash

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        ctx = context or ToolContext()
        externals = {**self.externals, **(ctx.externals or {})}
        return await self.script.run(
            arguments,
            externals=externals or None,
            files=ctx.files,
            environ={**self.environ, **ctx.environ},
            limits=self.limits.merge(ctx.limits),
            output_model=self.output_model,
            on_event=_tagged(ctx.on_event, ctx.call_id),
        )

    def __repr__(self) -> str:
        return f"ScriptTool({self.name!r}, path={self.path!r}, limits={self.limits.describe()!r})"


def _tagged(on_event: NoteCallback | None, call_id: str) -> NoteCallback | None:
    """`on_event` receiving each note with `call_id` set (unchanged without a call id)."""
    if on_event is None or not call_id:
        return on_event

    def tag(note: ScriptNote) -> Any:
        return on_event(msgspec.structs.replace(note, call_id=call_id))

    return tag
