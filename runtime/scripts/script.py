"""`Script`: a loaded `.pym` that can run itself, grail's `GrailScript` (`script.run(inputs, ...)`).

Everything a `Script` knows is in `LoadedScript` (`runtime.scripts.loaded`): its declarations, its
diagnostics and the code Monty runs. `Script` only adds `run`, which hands it to the sandbox
(`runtime.scripts.run.run_script`). The split exists so that the runner's modules can take the plain
`LoadedScript` without importing this module, which imports them: nothing in `runtime/scripts/` imports
its way back to itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.scripts.loaded import LoadedScript
from runtime.scripts.run import run_script

if TYPE_CHECKING:
    from runtime.scripts.limits import Limits
    from runtime.scripts.notes import NoteCallback
    from runtime.types import ToolResult

__all__ = ["Script"]


class Script(LoadedScript):
    """A loaded `.pym` (what `load` and `loads` return): its declarations, its diagnostics, and `run`."""

    async def run(self, inputs: dict[str, Any] | None = None, *,
                  externals: dict[str, Callable[..., Any]] | None = None,
                  files: dict[str, str | bytes] | None = None, environ: dict[str, str] | None = None,
                  limits: Limits | str | dict[str, Any] | None = None, output_model: Any = None,
                  on_event: NoteCallback | None = None) -> ToolResult:
        """Run in the sandbox; returns a `ToolResult` with the output or a `ToolError` (never raises for
        script problems). The same as `runtime.scripts.run.run_script(script, ...)`."""
        return await run_script(self, inputs, externals=externals, files=files, environ=environ,
                                limits=limits, output_model=output_model, on_event=on_event)
