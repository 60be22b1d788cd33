"""A validated bundle, resolved: the `Bundle` that hosts, workers and `Agent` run an agent from.

`load_bundle` (`runtime.bundle.load`) makes one; nothing else should. Its tools already carry the
bundle's settings (each one's limits, output model, approval, description), so a host or a worker reads
them from the tool, and `kernel_config()` / `decoding_constraint()` hand the kernel and the model client
what they need of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runtime.approval_policy import ApprovalRule
from runtime.bundle.schema import BundleSpec
from runtime.externals import ExternalsFactory, Grants
from runtime.externals.provide import ToolSetup
from runtime.model import DecodingConstraint
from runtime.model.limits import Budgets, EndpointLimits
from runtime.scripts import Limits
from runtime.tools import ScriptTool
from runtime.tools.agent_tool import AgentTool
from runtime.tools.hosted import HostedPythonTool
from runtime.tools.mcp import McpTool
from runtime.types import ToolSchema

if TYPE_CHECKING:
    from runtime.kernel import KernelConfig
    from runtime.model.client import ModelClient
    from runtime.policies import ToolPolicy
    from runtime.questions import QuestionsConfig
    from runtime.schedules import Schedule

__all__ = ["Bundle", "BundleTool", "DataProviderSpec"]

BundleTool = ScriptTool | HostedPythonTool | AgentTool | McpTool


@dataclass(frozen=True)
class DataProviderSpec:
    """`data_provider:` resolved: where a tool job's virtual files come from (`none`, a `static` folder
    and inline `files`, or the KV `workspace`)."""

    kind: Literal["none", "static", "workspace"] = "none"
    folder: Path | None = None
    files: dict[str, str] = field(default_factory=dict)
    workspace: str | None = None


@dataclass(frozen=True)
class Bundle:
    """A validated bundle. `digest` is a content hash of the bundle file and every tool source, recorded
    in `run.started` so a replay can tell which bundle version produced a run."""

    name: str
    path: Path
    spec: BundleSpec
    system_prompt: str
    limits: Limits
    tools: dict[str, BundleTool]  # each with its limits (global merged with its own), output model, approval
    data_provider: DataProviderSpec
    deadline_s: float | None
    policies: tuple[ToolPolicy, ...]
    digest: str
    approvals: tuple[ApprovalRule, ...] = ()  # the tools' approval rules (`approval:` entries)
    grants: dict[str, Grants] = field(default_factory=dict)  # tool -> its built-in externals
    factory: ExternalsFactory | None = None  # `externals:`, imported
    endpoint: EndpointLimits | None = None  # `endpoint:`: the model endpoint's fleet-wide share
    budgets: Budgets = field(default_factory=Budgets)  # `budgets:`: tokens per run and per agent per day
    schedules: tuple[Schedule, ...] = ()  # `schedules:`, checked (stored by a host serving the bundle)
    questions: QuestionsConfig | None = None  # `questions:`: ask_human offered, its timeout and default

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def workspace(self) -> str | None:
        return self.data_provider.workspace or self.spec.workspace

    def limits_for(self, tool: str) -> Limits:
        return self.tools[tool].limits if tool in self.tools else self.limits

    def setup_for(self, tool: str, model: Callable[[], ModelClient] | None = None) -> ToolSetup:
        """What the bundle gives `tool`'s externals at run time: its grants, the bundle's factory, the model
        its `ask_llm` calls (`model`, made on first use). One answer for a worker and an in-process run."""
        return ToolSetup(bundle=self.name, grants=self.grants.get(tool) or Grants(), factory=self.factory,
                         model=model, sampling=dict(self.spec.model.sampling))

    def output_model_for(self, tool: str) -> Any:
        return self.tools[tool].output_model if tool in self.tools else None

    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        """What the model is offered: the bundle's tools, then its built-in timers (`timers:`) and
        `ask_human` (`questions:`)."""
        from runtime.questions import ASK_HUMAN_TOOL
        from runtime.timers import TIMER_TOOLS

        asks = (ASK_HUMAN_TOOL,) if self.questions is not None else ()
        return (*(t.schema for t in self.tools.values()), *(TIMER_TOOLS[n] for n in self.spec.timers), *asks)

    def kernel_config(self) -> KernelConfig:
        """The kernel's `KernelConfig` for this bundle (tool schemas, termination, policies, sampling)."""
        from runtime.kernel import KernelConfig

        term = self.spec.termination
        return KernelConfig(
            system_prompt=self.system_prompt, tools=self.tool_schemas(), terminal_tool=term.terminal_tool,
            max_turns=term.max_turns, max_consecutive_errors=term.max_consecutive_errors,
            force_terminal_on_last_turn=term.force_terminal_on_last_turn,
            last_turn_prompt=term.last_turn_prompt,
            max_concurrent_tools=self.spec.max_concurrent_tools, history_window=self.spec.history_window,
            policies=self.policies,
            requires_approval=frozenset(n for n, t in self.tools.items() if t.requires_approval),
            approvals=self.approvals, sampling=dict(self.spec.model.sampling),
            token_budget=self.budgets.run_tokens, timers=frozenset(self.spec.timers),
            questions=self.questions)

    def decoding_constraint(self) -> DecodingConstraint | None:
        """The constraint of the bundle's model requests; None for `strategy: none` (unconstrained)."""
        c = self.spec.constraint
        if c.strategy == "none":
            return None
        return DecodingConstraint(strategy=c.strategy, allow_parallel_calls=c.parallel_calls,
                                  send_tools_to_api=c.send_tools_to_api)

    @property
    def priority(self) -> int:
        """The priority of the agent's tasks that name none (`priority:`, else the default)."""
        from runtime.events import DEFAULT_PRIORITY

        return self.spec.priority if self.spec.priority is not None else DEFAULT_PRIORITY

    @property
    def uses_local_model(self) -> bool:
        return self.spec.model.base_url == "local"
