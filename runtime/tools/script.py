"""`ScriptTool`: a `.pym` script as a tool.

`execute` runs the script in the Monty sandbox under `limits` (merged with a call's overrides) and checks
its result against `output_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.scripts import Limits, NoteCallback, Script, ScriptNote, load
from runtime.tools.schemas import LoadFailure, ScriptLoadError, script_tool_diagnostics
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolResult, ToolSchema

__all__ = ["ScriptTool"]


class ScriptTool(Described):
    """A `.pym` script as a tool. Raises `ScriptLoadError` if the script has diagnostics or breaks the
    tool rules; use `discover_tools` to collect such failures instead.

    `limits` bound every run (a call's `ToolContext.limits` are merged over them); `output_model` checks
    every result (a pydantic model, any type, or a JSON Schema dict); `externals` are host functions by
    name.
    """

    def __init__(
        self,
        script: Script,
        *,
        limits: Limits | str | dict[str, Any] | None = None,
        output_model: Any = None,
        externals: dict[str, Callable[..., Any]] | None = None,
    ) -> None:
        problems = script_tool_diagnostics(script)
        if problems:
            raise ScriptLoadError(LoadFailure(script.filename, problems[0].to_error(), tuple(problems)))
        self.script = script
        self.limits = Limits.resolve(limits)
        self.output_model = output_model
        self.externals = dict(externals or {})
        self._schema = ToolSchema(script.name, script.description, script.parameters)

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> ScriptTool:
        return cls(load(path), **kwargs)

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
            environ=ctx.environ,
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
