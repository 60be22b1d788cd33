"""What a tool is: a schema the model is shown and an async `execute` that returns a value, never raises.

`Tool` is the protocol the kernel's runners call; `ToolContext` is what the caller knows about one call
(who asks, the files and environment a script may read, limit overrides, extra host functions, and who
wants the run's `ScriptNote`s). `Described` is the part every tool kind shares: the `ToolSchema`, built
once, and the name the model calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from runtime.types import ToolResult, ToolSchema

if TYPE_CHECKING:
    from runtime.externals.context import ExecutionContext
    from runtime.scripts import Limits, NoteCallback

__all__ = ["Described", "Tool", "ToolContext"]


@dataclass
class ToolContext:
    """What the caller knows about one call: who asks, the data the tool may read, and overrides.

    `files` (virtual path -> str | bytes) and `environ` are what a script sees as its read-only filesystem
    and `os.environ`; `limits` is merged over the tool's own; `externals` adds host functions for scripts
    that declare them; `on_event` receives the run's `ScriptNote`s (tagged with `call_id`); `execution`
    is the call as a worker's externals see it (a Python tool may ask for it as a parameter).
    """

    run_id: str = ""
    agent: str = ""
    call_id: str = ""
    files: dict[str, str | bytes] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    limits: Limits | None = None
    externals: dict[str, Callable[..., Any]] | None = None
    on_event: NoteCallback | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    execution: ExecutionContext | None = None


@runtime_checkable
class Tool(Protocol):
    """Anything the kernel can call: a schema for the model and an async `execute` that returns a value."""

    @property
    def schema(self) -> ToolSchema: ...

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult: ...


class Described:
    """What both tool kinds share: the schema the model is shown, built once, and the name it calls."""

    _schema: ToolSchema

    @property
    def schema(self) -> ToolSchema:
        return self._schema

    @property
    def name(self) -> str:
        return self._schema.name
