"""structured-agents: an event-sourced actor runtime for many concurrent LLM agents on NATS.

    from runtime import Agent, Client

    async with Agent.from_bundle("bundles/demo") as agent:    # a bundle, run in this process
        outcome = await agent.run("What is 17 * 23 + 4?")     # RunOutcome: output, status, events

    async with await Client.connect() as client:              # the fleet (`sa up`, `sa host`, `sa worker`)
        print(await client.run("demo", "What is 17 * 23 + 4?", result_timeout=60))

The public API is the `TYPE_CHECKING` block below, grouped by what a user does; each name is written there
once, and the loader reads that block to know where a name lives, so the API and `__all__` cannot drift
apart (tests/core/test_public_api.py imports every name). Event and command types are the `events` namespace
(`runtime.events.RunStarted`), not names of their own here. Everything else (`runtime.nats`,
`runtime.host.driver`, `runtime.scripts.pool`, ...) is implementation: importable, but free to change.

Names load on first use, so `import runtime` stays cheap: `sa check` and `sa run` need the sandbox, not
nats-py, torch or xgrammar.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    # the groups below are the API's table of contents: keep them in this order
    # isort: off

    # run an agent in this process
    from runtime.agent import Agent as Agent, LocalWorkspace as LocalWorkspace
    from runtime.driver.local import RunOutcome as RunOutcome, run_task as run_task

    # the fleet from outside: give agents tasks, hold their runs, steer and check them
    from runtime.client import Client as Client, SyncClient as SyncClient, RunHandle as RunHandle
    from runtime.client import RunError as RunError, RunFailedError as RunFailedError
    from runtime.client import RunCancelledError as RunCancelledError, NotSent as NotSent
    from runtime.client import ControlError as ControlError, ForkError as ForkError

    # serve a fleet: `sa host`, `sa worker`
    from runtime.host import Host as Host, HostConfig as HostConfig
    from runtime.worker import Worker as Worker

    # bundles, tools and the sandbox
    from runtime.bundle import Bundle as Bundle, BundleError as BundleError, load_bundle as load_bundle
    from runtime.tools import Tool as Tool, ToolContext as ToolContext, ScriptTool as ScriptTool
    from runtime.tools import PythonTool as PythonTool, discover_tools as discover_tools
    from runtime.scripts import Limits as Limits, Script as Script, load as load

    # the kernel (the pure state machine) and the run log it is folded from
    from runtime.kernel import KernelConfig as KernelConfig, State as State
    from runtime.kernel import evolve as evolve, decide as decide, fold as fold
    from runtime.log import RunLog as RunLog

    # the shared vocabulary, and every event and command type as one namespace
    from runtime.types import ToolCall as ToolCall, ToolResult as ToolResult, ToolError as ToolError
    from runtime.types import ToolSchema as ToolSchema, Message as Message, Usage as Usage
    from runtime import events as events

    # isort: on


def _exports() -> dict[str, tuple[str, str]]:
    """Public name -> (module, attribute), read from the `TYPE_CHECKING` block above, in its order."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                 and node.test.id == "TYPE_CHECKING")
    out: dict[str, tuple[str, str]] = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
    return out


_EXPORTS = _exports()
__all__ = list(_EXPORTS)  # built from the block above: each name is written once


def __getattr__(name: str) -> object:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    module, attribute = where
    if module == __name__:  # `from runtime import events`: a submodule
        value: object = importlib.import_module(f"{module}.{attribute}")
    else:
        value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
