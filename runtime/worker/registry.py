"""The tools a worker can run: `ToolRegistry` and `build_registry`, what `sa worker --bundle B --tools GLOB`
serves.

A worker knows its tools before it takes a job: every script is loaded (parsed, checked, transformed) once
per process, when the worker starts, and a script that cannot be a tool stops the start (a worker must not
serve half-equipped). A job then only looks its tool up, by name. Besides the tools, the registry keeps what
each bundle gives its tools at run time: its static data (`providers`), the grants, externals factory and
model of each tool (`setups`, read by `runtime.worker.externals`), and the bundle's model client, made on
the first `ask_llm` and closed when the worker stops.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeAlias

from runtime.externals import Grants
from runtime.externals.provide import ToolSetup
from runtime.tools import ScriptTool, discover_tools
from runtime.tools.agent_tool import AgentTool
from runtime.tools.data import DataProvider, StaticDataProvider
from runtime.tools.hosted import HostedPythonTool

log = logging.getLogger("runtime.worker")

# what a worker runs: a sandboxed `.pym` script, a bundle's Python tool, or an agent tool (a sub-run)
WorkerTool: TypeAlias = ScriptTool | HostedPythonTool | AgentTool


class ToolRegistry:
    """Tools by name, from bundles and .pym globs: each a `ScriptTool` carrying its own limits and output
    model (set by its bundle). `by_digest` indexes the same tools by script content hash: a script is
    loaded (parsed, checked, transformed) once per process, when the worker starts."""

    def __init__(self) -> None:
        self.tools: dict[str, WorkerTool] = {}
        self.by_digest: dict[str, WorkerTool] = {}
        self.providers: dict[str, DataProvider] = {}  # agent (bundle name) -> its static data provider
        self.setups: dict[str, ToolSetup] = {}  # tool -> its bundle's grants, factory and model
        self._clients: dict[str, Any] = {}  # bundle name -> its model client, made on first ask_llm

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def get(self, name: str) -> WorkerTool | None:
        return self.tools.get(name)

    def add(self, tool: WorkerTool) -> None:
        old = self.tools.get(tool.name)
        if old is not None and old.content_hash != tool.content_hash:
            log.warning("tool %s from %s replaces the one from %s", tool.name, tool.path, old.path)
        self.tools[tool.name] = tool
        self.by_digest[tool.content_hash] = tool

    async def close_clients(self) -> None:
        """Close the model clients `ask_llm` made (the next call makes a new one)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except Exception as e:  # closing is best effort: the process may be ending anyway
                log.debug("closing a model client: %s", e)

    def add_globs(self, patterns: Iterable[str]) -> list[str]:
        """Every `.pym` matching the globs (files and folders work too), with default limits; a script
        that cannot be a tool is an error (a worker must not start half-equipped)."""
        patterns = list(patterns)
        if not patterns:
            return []
        found, failures = discover_tools(patterns)
        if failures:
            raise ValueError("cannot load tools:\n" + "\n".join(str(f) for f in failures))
        for t in found:
            self.add(t)
        return [t.name for t in found]

    def add_bundle(self, path: str | Path) -> list[str]:
        """Every tool of a bundle with its resolved limits and output model; its static data, if any."""
        from runtime.bundle import load_bundle

        bundle = load_bundle(path)

        def model() -> Any:  # the bundle's model client, shared by its tools' ask_llm calls
            client = self._clients.get(bundle.name)
            if client is None:
                from runtime.agent import model_client

                client = self._clients[bundle.name] = model_client(bundle)
            return client

        for t in bundle.tools.values():
            self.add(t)
            self.setups[t.name] = ToolSetup(bundle=bundle.name, grants=bundle.grants.get(t.name) or Grants(),
                                            factory=bundle.factory, model=model,
                                            sampling=dict(bundle.spec.model.sampling))
        dp = bundle.data_provider
        if dp.kind == "static":
            self.providers[bundle.name] = StaticDataProvider(dp.files, folder=dp.folder)
        return list(bundle.tools)


def build_registry(*, bundles: Iterable[str | Path] = (), tool_globs: Iterable[str] = ()) -> ToolRegistry:
    """The registry `sa worker` serves: every bundle's tools, then every glob's scripts."""
    reg = ToolRegistry()
    for b in bundles:
        reg.add_bundle(b)
    reg.add_globs(tool_globs)
    return reg
