"""structured-agents: an event-sourced actor runtime for many concurrent LLM agents on NATS.

The public API, in one place:

    from runtime import Agent
    agent = Agent.from_bundle("bundles/demo")                 # a bundle, run in this process
    result = await agent.run("What is 17 * 23 + 4?")          # RunOutcome: output, status, events

- agents and bundles: `Agent`, `load_bundle`, `Bundle`, `BundleError`, `RunOutcome`
- the wire schema: `Task`, `Cancel`, `Approve`, `Deny`, `Event` and every event type (`RunStarted`, ...)
- the kernel: `KernelConfig`, `State`, `evolve`, `decide`, `fold`
- the run log: `RunLog`, `RunHistory`, `Superseded`, `LogRejected`
- run control for operators: `Control` (cancel, pending approvals, approve, deny), `ControlError`
- fork a run from any past event: `fork`, `Forked`, `ForkError`, the edits (`OutputEdit`, `ReplyEdit`,
  `EditedCall`, `BundleEdit`, `SystemEdit`) and the fork's first event `RunForked`
- tools and scripts: `Tool`, `ToolContext`, `ScriptTool`, `PythonTool`, `discover_tools`, `load`, `Script`,
  `Limits`; the shared vocabulary `ToolCall`, `ToolResult`, `ToolError`, `ToolSchema`, `Message`
- serving: `Host`, `HostConfig` (`sa host`), `Worker` (`sa worker`)

Everything else (`runtime.nats`, `runtime.host.driver`, `runtime.scripts.pool`, ...) is implementation:
importable, but free to change. Names load on first use, so `import runtime` stays cheap (`sa run` does
not pay for nats, torch or xgrammar when it only needs the sandbox).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EVENTS = ("Task Cancel Approve Deny Command Event EventDecodeError PayloadRef RunStarted ModelRequested "
           "ModelResponded ModelFailed ToolCalled ScriptStarted ScriptPrinted ScriptCompleted ScriptFailed "
           "ToolRedelivered ToolCompleted ToolFailed ApprovalRequested ApprovalGranted ApprovalDenied "
           "TurnCompleted RunCompleted RunFailed RunCancelled RunForked OutputEdit ReplyEdit EditedCall "
           "BundleEdit SystemEdit")
_LAZY: dict[str, str] = {name: module for module, names in {
    "runtime.agent": "Agent LocalWorkspace",
    "runtime.bundle": "Bundle BundleError load_bundle",
    "runtime.events": _EVENTS,
    "runtime.kernel": "KernelConfig State evolve decide fold",
    "runtime.log": "RunLog RunHistory Superseded LogRejected",
    "runtime.client.fork": "fork Forked ForkError",
    "runtime.client.control": "Control ControlError",
    "runtime.loop": "RunOutcome run_task",
    "runtime.tools": "Tool ToolContext ScriptTool PythonTool discover_tools",
    "runtime.scripts": "Limits Script load",
    "runtime.types": "ToolCall ToolResult ToolError ToolSchema Message Usage",
    "runtime.host": "Host HostConfig",
    "runtime.worker": "Worker",
}.items() for name in names.split()}

if TYPE_CHECKING:
    from runtime.agent import Agent, LocalWorkspace
    from runtime.bundle import Bundle, BundleError, load_bundle
    from runtime.client.control import Control, ControlError
    from runtime.client.fork import Forked, ForkError, fork
    from runtime.events import (
        ApprovalDenied,
        ApprovalGranted,
        ApprovalRequested,
        Approve,
        BundleEdit,
        Cancel,
        Command,
        Deny,
        EditedCall,
        Event,
        EventDecodeError,
        ModelFailed,
        ModelRequested,
        ModelResponded,
        OutputEdit,
        PayloadRef,
        ReplyEdit,
        RunCancelled,
        RunCompleted,
        RunFailed,
        RunForked,
        RunStarted,
        ScriptCompleted,
        ScriptFailed,
        ScriptPrinted,
        ScriptStarted,
        SystemEdit,
        Task,
        ToolCalled,
        ToolCompleted,
        ToolFailed,
        ToolRedelivered,
        TurnCompleted,
    )
    from runtime.host import Host, HostConfig
    from runtime.kernel import KernelConfig, State, decide, evolve, fold
    from runtime.log import LogRejected, RunHistory, RunLog, Superseded
    from runtime.loop import RunOutcome, run_task
    from runtime.scripts import Limits, Script, load
    from runtime.tools import PythonTool, ScriptTool, Tool, ToolContext, discover_tools
    from runtime.types import Message, ToolCall, ToolError, ToolResult, ToolSchema, Usage
    from runtime.worker import Worker


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Agent",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRequested",
    "Approve",
    "Bundle",
    "BundleEdit",
    "BundleError",
    "Cancel",
    "Command",
    "Control",
    "ControlError",
    "Deny",
    "EditedCall",
    "Event",
    "EventDecodeError",
    "ForkError",
    "Forked",
    "Host",
    "HostConfig",
    "KernelConfig",
    "Limits",
    "LocalWorkspace",
    "LogRejected",
    "Message",
    "ModelFailed",
    "ModelRequested",
    "ModelResponded",
    "OutputEdit",
    "PayloadRef",
    "PythonTool",
    "ReplyEdit",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunForked",
    "RunHistory",
    "RunLog",
    "RunOutcome",
    "RunStarted",
    "Script",
    "ScriptCompleted",
    "ScriptFailed",
    "ScriptPrinted",
    "ScriptStarted",
    "ScriptTool",
    "State",
    "Superseded",
    "SystemEdit",
    "Task",
    "Tool",
    "ToolCall",
    "ToolCalled",
    "ToolCompleted",
    "ToolContext",
    "ToolError",
    "ToolFailed",
    "ToolRedelivered",
    "ToolResult",
    "ToolSchema",
    "TurnCompleted",
    "Usage",
    "Worker",
    "decide",
    "discover_tools",
    "evolve",
    "fold",
    "fork",
    "load",
    "load_bundle",
    "run_task",
]
