"""Tools: what a model can call. One protocol, two kinds, discovery, and the data a tool run reads and writes.

    tools, failures = discover_tools(["agents"], limits=Limits.strict())
    tool.schema                                   # ToolSchema(name, description, parameters: JSON Schema)
    await tool.execute({"expression": "1 + 2"}, ToolContext(call_id="r1/0.0"))   # -> ToolResult

- `ScriptTool` wraps a `.pym` script (runs in the Monty sandbox under its `Limits`); it is the one object
  that carries a tool's settings for the bundle, the host and the worker.
- `PythonTool` wraps a sync or async Python callable (schema from its type hints and docstring).
- A tool's name matches `^[a-z0-9_-]{1,64}$` (a script's is its file stem) and its description is the first
  paragraph of its docstring, 1-200 characters: the model reads it to decide when to call the tool. A
  script without a docstring still loads (grail needs none): a warning, and a bundle `description:` or a
  default text stands in (`ScriptTool.description_source` says which).
- Arguments are validated against the schema before anything runs (unknown argument, missing, wrong type
  -> an `input` error the model can act on). Failures are values (`ToolResult.error`), never exceptions.
- `discover_tools` returns every script that failed to load beside the tools: nothing is skipped silently.

Modules: `tool` (the `Tool` protocol, `ToolContext`), `schemas` (the tool rules, `LoadFailure`), `script`
(`ScriptTool`), `python` (`PythonTool`), `discovery`, and `data`: the data providers that fill a run's
virtual files and the result handlers that persist its writes. `data` talks to NATS, so it is imported on
its own (`from runtime.tools.data import ...`), never by this package: calling a tool in-process does not
load a NATS client.
"""

from runtime.tools.discovery import discover_tools, expand_paths
from runtime.tools.python import PythonTool
from runtime.tools.schemas import (
    MAX_DESCRIPTION,
    TOOL_NAME,
    LoadFailure,
    ScriptLoadError,
    default_description,
    schema_from_inputs,
    script_tool_diagnostics,
    script_tool_warnings,
    tool_diagnostics,
)
from runtime.tools.script import ScriptTool
from runtime.tools.tool import Tool, ToolContext

__all__ = [
    "MAX_DESCRIPTION",
    "TOOL_NAME",
    "LoadFailure",
    "PythonTool",
    "ScriptLoadError",
    "ScriptTool",
    "Tool",
    "ToolContext",
    "default_description",
    "discover_tools",
    "expand_paths",
    "schema_from_inputs",
    "script_tool_diagnostics",
    "script_tool_warnings",
    "tool_diagnostics",
]
