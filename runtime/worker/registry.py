"""The tools a worker can run: `ToolRegistry` and `build_registry`, what `sa worker --bundle B --tools GLOB`
serves, kept by version.

A worker knows its tools before it takes a job: every script is loaded (parsed, checked, transformed) once
per process, when the worker starts, and a script that cannot be a tool stops the start (a worker must not
serve half-equipped). Besides the tools, the registry keeps what each bundle gives its tools at run time:
its static data (`providers`), the grants, externals factory and model of each tool (a `Served`'s `setup`,
read by `runtime.worker.externals`), and the bundle's model client, made on the first `ask_llm` and closed
when the worker stops.

Versions. Two bundles may each have a tool called `add` with different code, and one worker may serve
both; a run's host also resolves its tool from its own copy of the bundle, which may be newer or older than
the worker's. So a job names the version it wants (`ToolJob.tool_digest`: the tool's content hash, as the
host resolved it) and its actor names the bundle, and the registry keeps every version it loads under a
`ToolVersion` (name, digest, bundle) and runs a job only with the one it names (`find`):

- a bundle's tool serves the jobs of that bundle's agents (instances and sub-runs included) whose digest
  is its own. It carries what its bundle configured (limits, output model, grants, factory, model), so a
  tool of another bundle with the same code does not serve them: that bundle may grant other secrets or
  validate the output otherwise;
- a script loaded from `--tools GLOB` belongs to no bundle: it serves any agent's job naming its code;
- a job that names no version (a host from before versions, a hand-made job) gets its own bundle's tool
  of that name, else a glob's, else any bundle's: what every job got before versions.

A worker that lacks the version a job names never runs another one in its place: `runtime.worker.handoff`
decides whether the job goes to a worker that has it or fails, naming the missing version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from runtime.commands import split_actor
from runtime.externals.provide import ToolSetup
from runtime.jobs import ToolJob
from runtime.tools import ScriptTool, discover_tools
from runtime.tools.agent_tool import AgentTool
from runtime.tools.data import DataProvider, StaticDataProvider
from runtime.tools.hosted import HostedPythonTool
from runtime.tools.mcp import McpTool
from runtime.worker.mcp_clients import McpClients

log = logging.getLogger("runtime.worker")

# what a worker runs: a sandboxed `.pym` script, a bundle's Python tool, an agent tool (a sub-run) or an MCP
# server's tool (called through the worker's one session per server, `runtime.worker.mcp_clients`)
WorkerTool: TypeAlias = ScriptTool | HostedPythonTool | AgentTool | McpTool


@dataclass(frozen=True)
class ToolVersion:
    """One version of a tool, for one bundle: what a worker serves and what a job asks for.

    `digest` is the tool's content hash ("" in a job: any version, as before versions); `bundle` is the
    bundle the tool came from ("" for a script from a glob: it serves any bundle)."""

    name: str
    digest: str = ""
    bundle: str = ""

    @classmethod
    def wanted_by(cls, job: ToolJob) -> ToolVersion:
        """The version a job asks for: its tool, the digest its host resolved, its actor's bundle."""
        return cls(job.tool, job.tool_digest, split_actor(job.actor)[0])

    def serves(self, wanted: ToolVersion) -> bool:
        """Whether a worker serving this version may run a job that wants `wanted` (an advertised version
        without a digest is an older worker's, which runs any version of a name)."""
        if self.name != wanted.name:
            return False
        if not wanted.digest or not self.digest:
            return True
        return self.digest == wanted.digest and self.bundle in ("", wanted.bundle)

    def describe(self) -> str:
        """`tool add version 1a2b3c4d5e6f7a8b (bundle calc)`, as error messages name it."""
        text = f"tool {self.name}"
        if self.digest:
            text += f" version {self.digest}"
        return text + (f" (bundle {self.bundle})" if self.bundle else " (from --tools)")


@dataclass(frozen=True)
class Served:
    """One tool version this worker runs, with what its bundle gives it at run time (`setup`: None for a
    glob's script, which gets no grants)."""

    tool: WorkerTool
    bundle: str = ""
    setup: ToolSetup | None = None

    @property
    def version(self) -> ToolVersion:
        return ToolVersion(self.tool.name, self.tool.content_hash, self.bundle)


class ToolRegistry:
    """Every tool version a worker loaded, from bundles and .pym globs: each a tool object carrying its own
    limits and output model (set by its bundle), found for a job by the version it names (`find`)."""

    def __init__(self) -> None:
        self._exact: dict[ToolVersion, Served] = {}  # every version loaded
        self._latest: dict[tuple[str, str], Served] = {}  # (bundle or "", name) -> the last loaded
        self._any: dict[str, Served] = {}  # name -> the last loaded (jobs that name no version)
        self.providers: dict[str, DataProvider] = {}  # agent (bundle name) -> its static data provider
        self._clients: dict[str, Any] = {}  # bundle name -> its model client, made on first ask_llm
        self.mcp = McpClients()  # one session per MCP server, for the bundles' MCP tools

    def __contains__(self, name: str) -> bool:
        return name in self._any

    @property
    def tools(self) -> dict[str, tuple[WorkerTool, ...]]:
        """Tool name -> every version of it loaded here (what `sa worker` announces, by name)."""
        out: dict[str, tuple[WorkerTool, ...]] = {}
        for served in self._exact.values():
            out[served.tool.name] = (*out.get(served.tool.name, ()), served.tool)
        return out

    def served(self) -> list[Served]:
        """Every tool version loaded here."""
        return list(self._exact.values())

    def versions(self) -> list[ToolVersion]:
        """Every version loaded here (what the worker advertises in its `WorkerBeat`)."""
        return list(self._exact)

    def find(self, job: ToolJob) -> Served | None:
        """The tool version the job names, or None if this worker lacks it (see the module docstring)."""
        wanted = ToolVersion.wanted_by(job)
        if wanted.digest:
            return self._exact.get(wanted) or self._exact.get(ToolVersion(wanted.name, wanted.digest))
        return (self._latest.get((wanted.bundle, wanted.name)) or self._latest.get(("", wanted.name))
                or self._any.get(wanted.name))

    def add(self, tool: WorkerTool, *, bundle: str = "", setup: ToolSetup | None = None) -> None:
        """Serve `tool` for `bundle`'s agents ("": for any agent whose job names its code)."""
        served = Served(tool, bundle, setup)
        if served.version not in self._exact and (bundle, tool.name) in self._latest:
            log.info("tool %s: serving another version too (%s, from %s)", tool.name, tool.content_hash,
                     tool.path or bundle)
        self._exact[served.version] = served
        self._latest[(bundle, tool.name)] = served
        self._any[tool.name] = served

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
                from runtime.model.connect import model_client

                client = self._clients[bundle.name] = model_client(bundle)
            return client

        for t in bundle.tools.values():
            self.add(t, bundle=bundle.name, setup=bundle.setup_for(t.name, model))
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
