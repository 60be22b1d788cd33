"""The `mcp:` section: each MCP server named, reached, listed, and its chosen tools added to the agent's.

Reaching the server here is deliberate: the host needs every tool's schema before the first turn (the
kernel config, the decoding constraint), and a bundle whose server cannot be reached must say so when it is
loaded, naming the server, not when a model first calls it. Every problem (a server that is missing or
crashes at start, an `allow:` name it does not have, a name that collides with another tool or breaks the
tool-name rule, a schema the constraint cannot use) is one bundle problem at `mcp.<server>`, and the other
sections are still checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.bundle.problems import UNREACHABLE, Problem
from runtime.bundle.schema import McpServerSpec
from runtime.quantities import LimitsError, parse_duration, parse_size
from runtime.scripts import Limits
from runtime.tools.mcp import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    McpError,
    McpServer,
    McpTool,
    list_server_tools,
)

__all__ = ["UNREACHABLE", "mcp_section"]



def mcp_section(servers: dict[str, McpServerSpec], root: Path, global_limits: Limits, taken: set[str]
                ) -> tuple[dict[str, McpTool], list[Problem]]:
    """The tools of every server under `mcp:` by the name the model calls; `taken` are the names the
    bundle's other tools already have."""
    problems: list[Problem] = []
    tools: dict[str, McpTool] = {}
    for name, spec in servers.items():
        where = f"mcp.{name}"
        server = _server(name, spec, root, where, problems)
        if server is None:
            continue
        try:
            listed = list_server_tools(server)
        except McpError as e:
            problems.append((where, str(e)))  # says UNREACHABLE (`list_server_tools`)
            continue
        for tool in _chosen(server, spec, listed, global_limits, where, problems):
            if tool.name in taken or tool.name in tools:
                problems.append((where, f"two tools are named {tool.name!r}: give the server another "
                                        "`prefix:` or the tool a `rename:`"))
                continue
            tools[tool.name] = tool
    return tools, problems


def _server(name: str, spec: McpServerSpec, root: Path, where: str,
            problems: list[Problem]) -> McpServer | None:
    """The entry as an `McpServer`, or None after recording what is wrong with it."""
    from runtime.nats.subjects import check_token

    ok = True
    try:
        check_token(name, "MCP server")
    except ValueError as e:
        problems.append((where, str(e)))
        ok = False
    if (spec.command is None) == (spec.url is None):
        problems.append((where, "an MCP server has one of `command:` (started over stdio) or `url:` "
                                "(streamable HTTP)"))
        return None
    if spec.url is not None and (spec.args or spec.env or spec.cwd):
        problems.append((where, "args, env and cwd are for a `command:` server; an HTTP server takes "
                                "`headers:`"))
        ok = False
    if spec.command is not None and spec.headers:
        problems.append((where, "headers are for a `url:` server; a command takes `env:`"))
        ok = False
    timeout = _seconds(spec.timeout, DEFAULT_CALL_TIMEOUT_S, f"{where}.timeout", problems)
    connect = _seconds(spec.connect_timeout, DEFAULT_CONNECT_TIMEOUT_S, f"{where}.connect_timeout", problems)
    max_result = None
    if spec.max_result is not None:
        try:
            max_result = parse_size(spec.max_result, field="max_result")
        except LimitsError as e:
            problems.append((f"{where}.max_result", str(e)))
            ok = False
    if timeout is None or connect is None or not ok:
        return None
    command = spec.command
    if command is not None and "/" in command and not Path(command).is_absolute():
        command = str((root / command).resolve())  # a path beside the bundle; a bare name is found on PATH
    cwd = str((root / spec.cwd).resolve()) if spec.cwd is not None else None
    return McpServer(name=name, command=command, args=tuple(spec.args), cwd=cwd,
                     env=tuple(sorted(spec.env.items())), url=spec.url,
                     headers=tuple(sorted(spec.headers.items())),
                     call_timeout_s=timeout, connect_timeout_s=connect, max_result=max_result)


def _chosen(server: McpServer, spec: McpServerSpec, listed: list[dict[str, Any]], limits: Limits, where: str,
            problems: list[Problem]) -> list[McpTool]:
    """The listed tools the entry chooses (`allow:` less `deny:`), each named and configured."""
    from runtime.validate import schema_problems

    by_name = {str(t.get("name")): t for t in listed}
    offered = ", ".join(sorted(by_name)) or "none"
    for key, names in (("allow", spec.allow or []), ("deny", spec.deny), ("rename", list(spec.rename)),
                       ("repeatable", list(spec.repeatable) if isinstance(spec.repeatable, dict) else [])):
        for n in names:
            if n not in by_name:
                problems.append((f"{where}.{key}", f"{server.where()} has no tool {n!r} (it has: {offered})"))
    wanted = [n for n in by_name if (spec.allow is None or n in spec.allow) and n not in spec.deny]
    prefix = f"{server.name}_" if spec.prefix is None else spec.prefix
    out: list[McpTool] = []
    for remote in wanted:
        name = spec.rename.get(remote, prefix + remote)
        repeatable = spec.repeatable.get(remote) if isinstance(spec.repeatable, dict) else spec.repeatable
        try:
            tool = McpTool(server, by_name[remote], name=name, repeatable=repeatable, limits=limits,
                           requires_approval=spec.requires_approval, in_doubt=spec.in_doubt)
        except ValueError as e:
            problems.append((where, f"{server.name}'s tool {remote!r}: {e}"))
            continue
        bad = schema_problems(tool.schema.parameters)
        if bad:
            problems.append((where, f"{server.name}'s tool {remote!r} lists an input schema the argument "
                                    f"check and the decoding constraint cannot use: {'; '.join(bad)}"))
            continue
        out.append(tool)
    return out


def _seconds(value: float | str | None, default: float, where: str, problems: list[Problem]) -> float | None:
    if value is None:
        return default
    try:
        seconds = parse_duration(value, field=where.rpartition(".")[2])
    except LimitsError as e:
        problems.append((where, str(e)))
        return None
    if seconds <= 0:
        problems.append((where, "must be more than 0"))
        return None
    return seconds
