"""A worker's MCP sessions: one per server, opened on first use, reopened after the server died, closed when
the worker stops; and the one place a worker calls an MCP tool (`McpClients.call`).

Why one session per server: a stdio server is a process, and starting one per call costs a process start (a
second or more for a Python server) and loses whatever the server keeps between calls; an HTTP server keeps
a connection pool. Calls of many jobs share the session at once (JSON-RPC requests carry ids).

A session is owned by a task of its own (`_Session.own`): the SDK's client holds task groups that must be
entered and left by one task, while calls come from the job tasks. The owner opens the client, says it is
ready, and holds it until told to close or until the connection breaks (the process exited): then the next
call opens a new one. A call that breaks on the transport is a `crashed` failure naming the server; a call
that overruns its deadline is a `timeout`: a hung server never holds a job past it.

Effects. MCP has no idempotency key, so a call that may have reached the server is never made a second time
unless the tool is repeatable (`McpTool.repeatable`): a redelivered job (an earlier delivery's worker died,
maybe mid-call) of a tool that is not fails `in_doubt` (`in_doubt`), saying the call may or may not have
happened, and the server is not called again. A delivery that was only handed off (its worker lacked the tool
version, `runtime.worker.handoff`) never called it, so it does not count.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from runtime.jobs import Ask
from runtime.questions import elicit_resume, in_doubt_question
from runtime.scripts import check_arguments
from runtime.tools.mcp import McpServer, McpTool, call_result, connect, explain_failure, timed_out
from runtime.types import ToolResult

log = logging.getLogger("runtime.worker")

__all__ = ["McpClients", "in_doubt"]


def in_doubt(tool: McpTool, attempt: int, handed_off: set[int]) -> ToolResult | Ask | None:
    """What a redelivered call of `tool` does instead of calling, or None to call: a repeatable tool (or one
    whose earlier deliveries were only handed off, never called) and a bundle saying `in_doubt: recall` call;
    `in_doubt: ask` puts the question to a person (`runtime.questions.in_doubt_question`); `fail` (the
    default) is the `in_doubt` failure the model reads."""
    earlier = set(range(1, attempt))
    if tool.repeatable or earlier <= handed_off or tool.in_doubt == "recall":
        return None
    message = (f"the call to {tool.server.name}/{tool.remote} may or may not have happened: the worker that "
               f"ran it stopped before reporting a result (delivery {attempt} of this call).")
    if tool.in_doubt == "ask":
        question, schema, resume = in_doubt_question(message)
        return Ask(question=question, schema=schema, resume=resume)
    return ToolResult.failure("in_doubt", f"{message} It is not repeated because {tool.name} is not "
                                          "repeatable; check its effect before calling it again",
                              detail="mcp")


def _asked(tool: McpTool, raw: Any) -> Ask | ToolResult:
    """An input-required result as the run's question: one form `elicitation/create` becomes `question.asked`
    with the server's message and requested schema; anything else (sampling, roots, several requests at
    once, a URL) is a failure naming what the server wanted."""
    requests = dict(raw.input_requests or {})
    if len(requests) == 1:
        key, request = next(iter(requests.items()))
        params: Any = getattr(request, "params", None)
        form = getattr(params, "mode", "form") == "form"
        if getattr(request, "method", "") == "elicitation/create" and form:
            schema = params.requested_schema
            schema = schema if isinstance(schema, dict) else schema.model_dump(mode="json", by_alias=True,
                                                                                exclude_none=True)
            return Ask(question=f"{tool.server.name}/{tool.remote} asks: {params.message}", schema=schema,
                       resume=elicit_resume(key, raw.request_state))
    wanted = ", ".join(f"{getattr(r, 'method', '?')}" for r in requests.values()) or "nothing (state only)"
    return ToolResult.failure("external", f"{tool.server.name}/{tool.remote} asked for input this runtime "
                                          f"cannot give ({wanted}): only one form elicitation at a time "
                                          "becomes a question to a person", detail="mcp_input")


class _Session:
    """One server's live client, owned by a task of its own."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Any = None
        self.error: BaseException | None = None
        self.closing = anyio.Event()
        self.ended = anyio.Event()

    async def own(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            with anyio.fail_after(self.server.connect_timeout_s) as scope:
                async with connect(self.server) as client:
                    scope.deadline = float("inf")  # the connect timeout bounds the start, not the session
                    self.client = client
                    started = True
                    task_status.started()
                    await self.closing.wait()
        except Exception as e:
            self.error = e
            if started:
                log.warning("%s: its session ended: %s", self.server.where(), e)
        finally:
            self.client = None
            self.ended.set()
            if not started:
                with contextlib.suppress(RuntimeError):  # the caller of `start` may have given up already
                    task_status.started()

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.ended.is_set() and not self.closing.is_set()


class McpClients:
    """The sessions of one worker, by server name; `running()` is the scope they live in."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._opening: dict[str, anyio.Lock] = {}
        self._tg: TaskGroup | None = None
        self.calls = 0  # calls made to servers (not counting in-doubt refusals)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[McpClients]:
        """The scope the worker's sessions live in: each one is closed (its process stopped) on exit."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                self._tg = None
                for session in self._sessions.values():
                    session.closing.set()
                self._sessions.clear()

    async def _session(self, server: McpServer) -> _Session:
        """The server's live session, opened (again) if there is none."""
        lock = self._opening.setdefault(server.name, anyio.Lock())
        async with lock:
            session = self._sessions.get(server.name)
            if session is not None and session.alive:
                return session
            if session is not None:
                session.closing.set()
            session = _Session(server)
            if self._tg is None:
                raise RuntimeError("MCP sessions are opened inside McpClients.running()")
            await self._tg.start(session.own)
            if session.client is None:
                raise ConnectionError(_reason(session.error, server))
            self._sessions[server.name] = session
            return session

    async def call(self, tool: McpTool, arguments: dict[str, Any], *, deadline: float | None,
                   resume: dict[str, Any] | None = None) -> ToolResult | Ask:
        """One call of `tool` through its server's session, within the job's `deadline` (unix time). A
        server that answers with a request for input gets it asked of a person (`Ask`); `resume` carries the
        answer back in the call's next round."""
        error = check_arguments(tool.name, tool.schema.parameters, arguments)
        if error is not None:
            return ToolResult(error=error)
        t0 = time.perf_counter()
        with anyio.move_on_after(max(0.0, tool.call_timeout(deadline))) as scope:
            try:
                session = await self._session(tool.server)
            except (ConnectionError, RuntimeError) as e:
                return ToolResult.failure("crashed", str(e), detail="mcp_start")
            self.calls += 1
            try:
                raw = await _send(session.client, tool.remote, arguments, resume)
            except Exception as e:
                if resume and resume.get("kind") == "elicit" and _state_refused(e):
                    return _stale_state(tool, e, t0)
                return self._broken(session, tool, e, t0)
            if getattr(raw, "result_type", None) == "input_required" or hasattr(raw, "input_requests"):
                return _asked(tool, raw)
            return call_result(tool, raw, t0)
        assert scope.cancelled_caught
        return timed_out(tool, t0)

    def _broken(self, session: _Session, tool: McpTool, error: Exception, t0: float) -> ToolResult:
        """A call the server answered with a protocol error or with garbage (a result that is no tool result,
        or breaks the tool's own output schema): the session stays. Or one whose transport broke: the session
        is closed, and the next call starts the server again."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED
        from pydantic import ValidationError

        if isinstance(error, MCPError) and error.code != CONNECTION_CLOSED and session.alive:
            return ToolResult.failure("external", f"{tool.server.name}/{tool.remote}: {error}",
                                      detail="mcp_error", duration_ms=_ms(t0))
        if isinstance(error, ValidationError | RuntimeError) and session.alive:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return ToolResult.failure("output", f"{tool.server.where()} answered {tool.remote} with a "
                                                f"result that is not a valid tool result: {first}",
                                      detail="mcp_garbage", duration_ms=_ms(t0))
        session.closing.set()
        return ToolResult.failure("crashed", f"{tool.server.where()} broke during the call to {tool.remote}: "
                                             f"{_reason(error, tool.server)}", detail="mcp_crashed",
                                  duration_ms=_ms(t0))


async def _send(client: Any, remote: str, arguments: dict[str, Any], resume: dict[str, Any] | None) -> Any:
    """`tools/call` that returns an input-required result instead of answering it here (`Client.call_tool`
    would ask its callbacks, holding the call open), with the answers of an earlier round; resent once
    after a re-listing when the server says the client's listing is stale, as `Client.call_tool` does."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import HEADER_MISMATCH, ElicitResult

    given: dict[str, Any] = {}
    if resume and resume.get("kind") == "elicit":
        given["input_responses"] = {k: ElicitResult.model_validate(v)
                                    for k, v in dict(resume.get("input_responses") or {}).items()}
        given["request_state"] = resume.get("request_state")
    try:
        return await client.session.call_tool(remote, arguments, allow_input_required=True, **given)
    except MCPError as e:
        if e.code != HEADER_MISMATCH:
            raise
        await client.list_tools()
        return await client.session.call_tool(remote, arguments, allow_input_required=True, **given)


def _state_refused(error: Exception) -> bool:
    """Whether the server refused the `requestState` an answer was sent back with (the SDK says only
    "invalid or expired", on purpose)."""
    from mcp.shared.exceptions import MCPError

    if not isinstance(error, MCPError):
        return False
    data = getattr(getattr(error, "error", None), "data", None)
    return (isinstance(data, dict) and data.get("reason") == "invalid_request_state") or \
        "requeststate" in str(error).lower()


def _stale_state(tool: McpTool, error: Exception, t0: float) -> ToolResult:
    """The failure of an answer the server no longer takes: why that happens on a fleet, and the fix.

    A server seals the state it sends with its question, and the official SDK seals it by default with a
    key of its own process, valid for 10 minutes. A person's answer is durable (the run parks for as long as
    it takes) and its call's next round may run on any worker, whose own process of a stdio server never
    saw that key, or after the server restarted: the server then refuses it. The answer is not lost (it is
    in the log); the model reads this and may call the tool again to ask anew."""
    return ToolResult.failure(
        "external", f"{tool.server.name}/{tool.remote} refused the answer to its question ({error}): it no "
        "longer takes the state it sent with the question. A server seals that state with a key of its own "
        "process and for a limited time unless told otherwise, so an answer given later, or sent on from "
        "another worker or after the server restarted, is refused. Give the server a request-state key all "
        "its processes share and a lifetime as long as a person may take to answer (the official SDK: "
        "MCPServer(..., request_state_security=RequestStateSecurity(keys=[...], ttl=...))); calling the tool "
        "again asks anew", detail="mcp_state", duration_ms=_ms(t0))


def _reason(error: BaseException | None, server: McpServer) -> str:
    return explain_failure(error, server) if error is not None else "the session ended"


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
