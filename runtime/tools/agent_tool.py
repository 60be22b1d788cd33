"""`AgentTool`: another agent offered to a model as a tool (`- agent: researcher` in a bundle).

Calling it is delegating: the task text goes to the other agent as a task of its own, a durable child run
(`runtime.worker.subruns`), and the call's result is the child's output. What the model sees is one parameter,
`task`. This object only describes the tool and carries its settings; running it needs NATS, so a
worker does that (`runtime.worker.subruns.start_child`), never `execute` in process.
"""

from __future__ import annotations

import hashlib
from typing import Any

from runtime.scripts import Limits
from runtime.tools.schemas import tool_diagnostics
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolResult, ToolSchema

__all__ = ["DEFAULT_MAX_DEPTH", "AgentTool"]

DEFAULT_MAX_DEPTH = 4  # a run's children, their children...: a cycle of agents calling each other stops here


class AgentTool(Described):
    """The agent `agent` as a tool; `max_depth` bounds how deep sub-runs may nest below a top-level run.
    How long a child may run is its own bundle's business (`termination.deadline`)."""

    def __init__(self, agent: str, *, description: str | None = None, max_depth: int = DEFAULT_MAX_DEPTH,
                 limits: Limits | None = None, requires_approval: bool = False) -> None:
        text = description or f"Delegate a task to the {agent} agent; returns its answer."
        problems = tool_diagnostics(agent, text, docstring_line=None)
        if problems:
            raise ValueError("; ".join(d.message for d in problems))
        self.agent = agent
        self.max_depth = max_depth
        self.limits = limits or Limits.default()
        self.output_model: Any = None
        self.requires_approval = requires_approval
        self.description_source = "bundle" if description else "default"
        self._schema = ToolSchema(agent, text, {
            "type": "object",
            "properties": {"task": {"type": "string", "description": f"what {agent} should do, in full"}},
            "required": ["task"], "additionalProperties": False})

    @property
    def path(self) -> str | None:
        return None

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(f"agent:{self.agent}:{self.max_depth}".encode()).hexdigest()[:16]

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        return ToolResult.failure("input", f"{self.agent} is an agent tool: it runs as a sub-run on a tool "
                                           "worker (`sa worker --bundle`), not in process")

    def __repr__(self) -> str:
        return f"AgentTool({self.agent!r})"
