"""MCP servers' tools as tools of a bundle: `McpServer` (how to reach one), `McpTool` (one of its tools as the
model sees it), listing a server's tools at load, and one call's result as a value.

    mcp:
      time:                                   # the server's name in errors, and the tools' default prefix
        command: mcp-server-time              # stdio: started by each worker on first use
        args: [--local-timezone, UTC]
        env: {API_TOKEN: "${TIME_TOKEN}"}     # ${NAME}: read from the environment when the server starts
        allow: [get_current_time]             # which of its tools the agent gets (default: all), or deny:
        prefix: time_                         # the model calls `time_get_current_time` (default `time_`)
        repeatable: true                      # may a redelivered job call again? (default: the tool's hints)
        in_doubt: ask                         # if not, after its worker died mid-call: fail, ask, recall

Why the schemas are read from the server at load: the host builds the decoding constraint and the kernel
config from every tool's schema before any call, so a host (and `sa check`, and each worker) lists the
server's tools when it loads the bundle. A server that cannot be reached then is a bundle error naming
it. The listed names, descriptions and schemas hash into each tool's `content_hash`, so a server whose tools
changed is a new tool version: a run resumed on it fails (`resume: same-version`) and a worker holding the
other version never runs its jobs (`runtime.worker.registry`).

Secrets. `${NAME}` references in `env:` and `headers:` are kept as written in the bundle, its digest and
every event; they are resolved from the process environment only when a connection is made (`resolved_env`),
and a missing one is an error naming the variable, never its value.

Results are values (`call_result`): `isError` is an `external` failure carrying the server's text;
`structuredContent` is the output as structure, else the text content (non-text blocks as dicts). Calls run on
workers through one session per server (`runtime.worker.mcp_clients`); `McpTool.execute` makes a one-off
connection, for a run in process (`runtime.agent`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from runtime.scripts import Limits, check_arguments
from runtime.tools.schemas import MAX_DESCRIPTION, TOOL_NAME
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolResult, ToolSchema

__all__ = ["IN_DOUBT_POLICIES", "McpError", "McpServer", "McpTool", "call_result", "connect",
           "explain_failure", "list_server_tools", "resolved_env", "strict_parameters"]

_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_CALL_TIMEOUT_S = 60.0
# What a redelivered call of a tool that may not be repeated does (its worker died mid-call, so the call may
# or may not have happened): `fail` it `in_doubt` (the model reads that), `ask` a person whether to re-call
# it or treat it as failed (`runtime.questions`), or `recall` it (the bundle accepts a second effect).
IN_DOUBT_POLICIES = ("fail", "ask", "recall")
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class McpError(Exception):
    """A server that cannot be reached, started or listed: the message names the server and says why."""


@dataclass(frozen=True)
class McpServer:
    """How to reach one MCP server: a stdio `command` (with `args`, `cwd`, `env`) or a streamable-HTTP `url`
    (with `headers`). `env` and `headers` values may hold `${NAME}` references, resolved only on connect."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_result: int | None = None  # bytes of a result's JSON; a bigger one is a `limit` failure

    def where(self) -> str:
        """`MCP server 'time' (mcp-server-time)`: how errors name it (references stay as written)."""
        target = self.url if self.url else " ".join((str(self.command), *self.args))
        return f"MCP server {self.name!r} ({target})"


def resolved_env(values: tuple[tuple[str, str], ...], environ: Mapping[str, str],
                 what: str) -> dict[str, str]:
    """`values` with each `${NAME}` replaced from `environ`; an unset one is an `McpError` naming it."""
    out: dict[str, str] = {}
    for key, value in values:
        for ref in _REF.findall(value):
            if ref not in environ:
                raise McpError(f"{what}: {key} refers to ${{{ref}}}, which is not set in this process's "
                               "environment: set it where the host and workers run")
        out[key] = _REF.sub(lambda m: environ[m.group(1)], value)
    return out


@asynccontextmanager
async def connect(server: McpServer, environ: Mapping[str, str] | None = None) -> AsyncIterator[Any]:
    """An open `mcp.Client` session to the server (a stdio process started, or an HTTP connection pool);
    closed (the process stopped) on exit. Raises `McpError` for references that cannot be resolved."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = os.environ if environ is None else environ
    async with AsyncExitStack() as stack:
        if server.url:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = resolved_env(server.headers, env, server.where())
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30.0))
            target: Any = streamable_http_client(server.url, http_client=http)
        else:
            assert server.command is not None
            target = StdioServerParameters(command=server.command, args=list(server.args),
                                           env=resolved_env(server.env, env, server.where()) or None,
                                           cwd=server.cwd)
        client = await stack.enter_async_context(Client(target, cache=None,
                                                        elicitation_callback=_refuse_mid_call))
        yield client


async def _refuse_mid_call(context: Any, params: Any) -> Any:
    """The answer to a server's request for input that a client must give at once: a server on the 2025
    protocols sends `elicitation/create` in the middle of a call, and nobody can answer it then (a person
    answers a run's question later, the run parked holding nothing), so it is declined, saying why; on the
    2026 protocol the request comes back as an input-required result, which a worker makes the run's
    question (`runtime.worker.mcp_clients`). Declaring the callback also declares the elicitation
    capability, without which a 2026 server does not ask at all."""
    from mcp_types import INVALID_REQUEST, ErrorData

    return ErrorData(code=INVALID_REQUEST, message="this client takes requests for input only as an "
                                                   "input-required result (MCP 2026-07-28), not in the "
                                                   "middle of a call: a person answers later")


def list_server_tools(server: McpServer, environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The server's tools as plain dicts (`name`, `description`, `inputSchema`, `outputSchema`,
    `annotations`), every page. Synchronous, for `load_bundle`: it runs in a thread of its own, so it works
    whether or not the caller is inside an event loop.
    Raises `McpError` naming the server and what went wrong."""
    box: dict[str, Any] = {}

    async def listing() -> None:
        with anyio.fail_after(server.connect_timeout_s):
            async with connect(server, environ) as client:
                tools: list[dict[str, Any]] = []
                cursor: str | None = None
                for _ in range(100):
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True)
                                 for t in page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                box["tools"] = tools

    def run() -> None:
        try:
            anyio.run(listing)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=run, name=f"mcp-list-{server.name}", daemon=True)
    thread.start()
    thread.join(server.connect_timeout_s + 10)
    if "tools" in box:
        return list(box["tools"])
    error = box.get("error")
    if isinstance(error, McpError):  # a setting (a ${NAME} not set), not the server
        raise error
    raise McpError(f"{server.where()} cannot be reached: {explain_failure(error, server)}")


def explain_failure(error: BaseException | None, server: McpServer) -> str:
    """One line saying why a connection failed (the innermost error of an exception group)."""
    if error is None or isinstance(error, TimeoutError):
        return f"it did not list its tools within {server.connect_timeout_s:g} s"
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, McpError):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return f"the command {server.command!r} was not found (is it installed and on PATH?)"
    text = str(error) or type(error).__name__
    if "closed" in text.lower():
        return f"it exited or closed the connection before answering ({text})"
    return f"{type(error).__name__}: {text}"


def strict_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A server's `inputSchema` closed like a script tool's: the root and every nested object that declares
    `properties` admits no undeclared key (unless it says otherwise), and meta keywords (`$schema`, `title`)
    are dropped. A call valid under this schema is valid under the server's own."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items() if k not in ("$schema", "$id", "title")}
        for key in ("properties", "$defs", "definitions"):  # maps of schemas: their keys are names
            if isinstance(node.get(key), dict):
                out[key] = {k: walk(v) for k, v in node[key].items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out

    out = walk(dict(schema))
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    out.setdefault("required", [])
    out.setdefault("additionalProperties", False)
    return dict(out)


def model_description(text: str, server: str, remote: str) -> str:
    """The description the model reads: the server's first paragraph, cut to the tool rules' length."""
    first = (text or "").strip().split("\n\n")[0].strip()
    first = " ".join(first.split()) or f"The {remote} tool of the {server} MCP server."
    return first if len(first) <= MAX_DESCRIPTION else first[: MAX_DESCRIPTION - 1].rstrip() + "…"


def default_repeatable(annotations: Mapping[str, Any]) -> bool:
    """Whether a call may be made again after a worker died mid-call, from the server's own hints: a
    read-only or idempotent tool may; anything else (no hints, or a destructive tool) may not."""
    return bool(annotations.get("readOnlyHint") or annotations.get("idempotentHint"))


class McpTool(Described):
    """One tool of an MCP server, as a bundle offers it: the local name (prefix + the server's name, or a
    rename), the strict parameter schema, the server to call and whether a call may be repeated."""

    def __init__(self, server: McpServer, listed: Mapping[str, Any], *, name: str,
                 repeatable: bool | None = None, limits: Limits | None = None,
                 requires_approval: bool = False, in_doubt: str = "fail") -> None:
        if not TOOL_NAME.match(name):
            raise ValueError(f"tool name {name!r} is invalid: names must match ^[a-z0-9_-]{{1,64}}$; give "
                             f"the tool a `rename:` or the server another `prefix:`")
        self.server = server
        self.remote = str(listed["name"])
        self.listed = dict(listed)
        self.annotations: dict[str, Any] = dict(listed.get("annotations") or {})
        self.repeatable = default_repeatable(self.annotations) if repeatable is None else repeatable
        if in_doubt not in IN_DOUBT_POLICIES:
            raise ValueError(f"in_doubt must be one of {', '.join(IN_DOUBT_POLICIES)}, not {in_doubt!r}")
        self.in_doubt = in_doubt  # what a redelivered call that may not be repeated does
        self.output_schema: dict[str, Any] | None = listed.get("outputSchema")
        self.limits = limits or Limits.default()
        self.output_model: Any = None
        self.requires_approval = requires_approval
        self.description_source = "server"
        self._schema = ToolSchema(name, model_description(str(listed.get("description") or ""), server.name,
                                                          self.remote),
                                  strict_parameters(listed.get("inputSchema") or {}))

    @property
    def path(self) -> str | None:
        return None

    @property
    def effect(self) -> str:
        """`repeatable` or `once` (what `sa tools` and the docs call its effect class)."""
        return "repeatable" if self.repeatable else "once"

    @property
    def content_hash(self) -> str:
        """The version: the server's name, the tool as the server listed it (name, description, schemas,
        hints) and how the bundle offers it. Never the command, the URL or an env value: those may differ
        between machines and may hold secrets."""
        pinned = {"server": self.server.name, "listed": self.listed, "name": self.name,
                  "repeatable": self.repeatable}
        if self.in_doubt != "fail":  # (the default is left out, so versions pinned before it stay the same)
            pinned["in_doubt"] = self.in_doubt
        return hashlib.sha256(json.dumps(pinned, sort_keys=True).encode()).hexdigest()[:16]

    def call_timeout(self, deadline: float | None) -> float:
        """Seconds a call may take: the server's call timeout, cut to what the job's deadline leaves."""
        left = self.server.call_timeout_s
        if deadline is not None:
            left = min(left, deadline - time.time())
        return left

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        """One call over a connection of its own (in process; workers keep one session per server)."""
        error = check_arguments(self.name, self._schema.parameters, arguments)
        if error is not None:
            return ToolResult(error=error)
        deadline = context.execution.deadline if context and context.execution else None
        t0 = time.perf_counter()
        try:
            with anyio.fail_after(max(0.0, self.call_timeout(deadline))):
                async with connect(self.server) as client:
                    raw = await client.call_tool(self.remote, arguments)
        except TimeoutError:
            return timed_out(self, t0)
        except Exception as e:
            return ToolResult.failure("external", f"{self.server.where()}: {explain_failure(e, self.server)}",
                                      detail="mcp_unreachable")
        return call_result(self, raw, t0)

    def __repr__(self) -> str:
        return f"McpTool({self.name!r}, server={self.server.name!r}, remote={self.remote!r})"


def timed_out(tool: McpTool, t0: float) -> ToolResult:
    return ToolResult.failure("timeout", f"{tool.server.where()} did not answer {tool.remote} in time (the "
                                         "call's deadline or the server's `timeout:`)",
                              duration_ms=_ms(t0))


def call_result(tool: McpTool, raw: Any, t0: float) -> ToolResult:
    """A `CallToolResult` as a value: `isError` -> an `external` failure with the server's text;
    `structuredContent` -> the output as it is; else the text blocks (one: its text; several: a list), with
    any non-text block (image, audio, resource) as its dict."""
    duration = _ms(t0)
    try:
        blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in raw.content or []]
        structured = raw.structured_content
        is_error = bool(raw.is_error)
    except AttributeError as e:
        return ToolResult.failure("external", f"{tool.server.where()} answered {tool.remote} with something "
                                              f"that is not a tool result ({e})", detail="mcp_garbage",
                                  duration_ms=duration)
    texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    if is_error:
        message = "\n".join(texts).strip() or "the server reported an error without a message"
        return ToolResult.failure("external", f"{tool.server.name}/{tool.remote}: {message}", detail="mcp",
                                  duration_ms=duration)
    if structured is not None:
        output: Any = structured
    elif blocks and len(texts) == len(blocks):
        output = texts[0] if len(texts) == 1 else texts
    else:
        output = [b.get("text") if b.get("type") == "text" else b for b in blocks]
    size = len(json.dumps(output, ensure_ascii=False).encode()) if tool.server.max_result else 0
    if tool.server.max_result and size > tool.server.max_result:
        return ToolResult.failure("limit", f"{tool.server.name}/{tool.remote} answered {size} bytes, more "
                                           f"than the server's max_result of {tool.server.max_result} bytes",
                                  detail="output", duration_ms=duration)
    return ToolResult(output=output, duration_ms=duration)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
