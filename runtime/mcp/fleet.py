"""The fleet as MCP tools and resources: what `sa mcp serve` answers, over any transport.

    fleet = FleetTools(client, agents=["calc"])        # None: every bundle a live host serves
    server = fleet.server()                             # an `mcp` low-level Server: tools, resources

Each agent is a tool named after its bundle, described by the bundle's `description:`, taking
``{input, task_id?, thread?}``. A call starts a run with `Client.start` and waits for its end, following
the run's events through the hosts as it goes: every turn and tool call becomes an MCP progress notification
(when the caller sent a progress token), and the ending becomes the call's result: the output (as
`structuredContent` too when it is an object), or ``isError`` naming the reason and detail the log
recorded. A run is a resource, ``run://<run_id>``, whose text is the timeline `sa replay` prints: any run
for credentials that may read the log, the runs this server started for any.

Why a call is idempotent, and how: MCP has no idempotency key, and a client (or the proxy in front of it) may
send a call again after a broken connection. The task id decides the run (`runtime.commands.run_id_for`), so a
call that names a `task_id` starts that task's run at most once, whatever repeats it. Without one, the task id
is derived from the call's request id where that id names one call: on stdio (one client per process, so
this process's nonce and the request id name it) and on a stateful HTTP session (its session id and the
request id).
A session-less HTTP request's id is the client's own counter, which two clients share, so such a call gets a
fresh task id: pass `task_id` to make it repeatable.

Why a client's cancel cancels the run: an MCP client that gives up on a call means the work is not wanted, and
a run left going would spend model tokens for nobody. The SDK cancels the handler's scope when the client
sends ``notifications/cancelled`` (or, on the 2026 HTTP wire, closes the call's stream, which is how that
wire says cancel); the handler then asks a host to cancel the run, shielded, before it lets the
cancellation through. A connection that merely ends (a stdio client that exits, this server stopping, an
older HTTP client's stream dropping, which the specification says is not a cancel) leaves the run going:
runs are durable, and a call with the same task id picks it up again.

Why a publisher's credentials suffice: the call publishes the task (a publisher's right) with the digest of
a key only this server holds, and follows and cancels the run by asking the hosts with that key
(`runtime.mcp.started`), never by reading the log or sending commands itself, so `sa mcp serve` can do
nothing a publisher cannot, and nothing at all to a run it did not start. Reading a run it did not start (a
resource) needs an operator's rights to the log, and is offered to credentials that have them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from runtime import events as ev
from runtime.client import Client, NotSent, RunFailedError
from runtime.client.handle import outcome
from runtime.commands import run_id_for
from runtime.mcp.started import NotStarted, StartedRuns, StarterRefused
from runtime.nats.connection import explain_refusal

log = logging.getLogger("runtime.mcp")

RUN_SCHEME = "run://"
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource that does not exist
CANCEL_WAIT_S = 10.0  # how long a cancelled call waits for the host to record the run's cancel
TIMELINE_WIDTH = 160  # the columns a run's timeline is rendered in (a resource has no terminal)
RUNS_LISTED = 50  # the most recent runs `resources/list` names

INSTRUCTIONS = ("Each tool is an agent of a structured-agents fleet: a call gives it a task and returns its "
                "run's output (or why the run failed). Runs are durable: a call that names a task_id used "
                "before returns that task's run. Read a run's timeline as the resource run://<run_id>.")

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "The task for the agent, as a person would write it."},
        "task_id": {"type": "string", "description": "Names the task: a call with a task id already used "
                                                     "returns that task's run and starts nothing new."},
        "thread": {"type": "string", "description": "A conversation of the agent to continue (its earlier "
                                                    "runs on this thread are the context)."},
    },
    "required": ["input"],
    "additionalProperties": False,
}


class FleetTools:
    """The agents of a fleet as MCP tools, their runs as resources (see the module docstring).

    `agents` chooses the tools (bundle names); None offers every bundle a live host serves, read from the
    hosts' heartbeats at each `tools/list`. `scope` names this server process in derived task ids (a fresh one
    by default: two `sa mcp serve` processes never derive the same task id). `secret` makes the keys of the
    runs it starts (`runtime.mcp.started`; a fresh one by default: only this process follows its runs)."""

    def __init__(self, client: Client, *, agents: Sequence[str] | None = None,
                 scope: str | None = None, secret: bytes | None = None) -> None:
        self.client = client
        self.agents = list(agents) if agents else None
        self.scope = scope or uuid.uuid4().hex[:12]
        self.runs = StartedRuns(client.nc, secret or os.urandom(32))
        self.reads_log: bool | None = None  # whether the credentials may read the run log (None: not tried)

    # -- tools -----------------------------------------------------------------------------------------

    async def offered(self) -> dict[str, str]:
        """The agents offered as tools, each with its description. A chosen agent no live host serves now is
        still offered (its task waits in the queue until a host serving it starts), and said to be so."""
        served: dict[str, str] | None
        try:
            served = await self.client.agents()
        except Exception as e:  # credentials that may not read the hosts' heartbeats (a publisher)
            if self.agents is None:
                raise MCPError(INVALID_PARAMS, "these NATS credentials may not read which agents the fleet "
                                               f"serves ({e}); name the agents with --agents") from None
            served = None  # unknown: described without saying whether a host serves them
        chosen = self.agents if self.agents is not None else sorted(served or {})
        return {name: _description(name, served) for name in chosen}

    async def list_tools(self, ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=name, description=text, input_schema=INPUT_SCHEMA)
            for name, text in (await self.offered()).items()])

    async def call_tool(self, ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        agent = params.name
        if self.agents is not None and agent not in self.agents:
            raise MCPError(INVALID_PARAMS, f"unknown tool {agent!r}: this server offers "
                                           f"{', '.join(self.agents)}")
        args = params.arguments or {}
        problem = _check_arguments(args)
        if problem is not None:
            return _error(problem)
        task_id = args.get("task_id") or self.derived_task_id(ctx, agent, args) or uuid.uuid4().hex
        try:
            run_id = run_id_for(agent, task_id)
            # shielded: a task stored while the call is being cancelled is a run to cancel, not to lose
            with anyio.CancelScope(shield=True):
                await self.client.start(agent, args["input"], task_id=task_id, thread=args.get("thread"),
                                        metadata=self.runs.metadata(run_id))
        except NotSent as e:
            return _error(f"the task for {agent} was not sent ({e.reason}): {e}")
        except ValueError as e:  # a name that can never be (an agent, a thread)
            return _error(str(e))
        self.runs.remember(agent, run_id)
        log.info("call %s started run %s (task %s)", agent, run_id, task_id)
        try:
            ending = await self._follow(ctx, agent, run_id)
        except anyio.get_cancelled_exc_class():
            if _client_cancelled(ctx):
                with anyio.CancelScope(shield=True):
                    await self._cancel(agent, run_id, "cancelled by the MCP client")
            else:
                log.info("run %s goes on: its call ended with the connection, not by a cancel (a call with "
                         "its task id returns it)", run_id)
            raise
        except StarterRefused as e:  # its task id was used before, by another starter
            return _error(f"task {task_id} of {agent} is run {run_id}, which this server did not start, so "
                          f"it may not follow it: {e}. Call with another task_id", run_id=run_id)
        except Exception as e:  # NATS refused or failed: say so, with the run to look at later
            why = explain_refusal(e) or f"{type(e).__name__}: {e}"
            return _error(f"run {run_id} was started but cannot be followed ({why}); read it with an "
                          f"operator's credentials (`sa replay {run_id}`)", run_id=run_id)
        return _result(run_id, ending)

    def derived_task_id(self, ctx: ServerRequestContext[Any], agent: str, args: dict[str, Any]) -> str | None:
        """The task id of a call that names none: from its request id where that id names one call (stdio, an
        HTTP session), with the arguments in it so a request id reused for another call is another task;
        None (a fresh task id) for a session-less HTTP request (see the module docstring)."""
        if ctx.request_id is None:
            return None
        headers = getattr(ctx.request, "headers", None)
        if ctx.request is None:
            where = self.scope  # stdio: this process has one client
        elif headers is not None and headers.get("mcp-session-id"):
            where = f"{self.scope}/{headers['mcp-session-id']}"
        else:
            return None
        what = json.dumps([agent, args.get("input"), args.get("thread")], sort_keys=True)
        key = f"{where}\x00{ctx.request_id}\x00{what}".encode()
        return f"mcp-{hashlib.blake2b(key, digest_size=10).hexdigest()}"

    async def _follow(self, ctx: ServerRequestContext[Any], agent: str, run_id: str) -> ev.Event:
        """Follow the run to its end through the hosts, reporting each turn and tool call as progress; its
        terminal event."""
        steps = 0
        turn = 1
        last: ev.Event | None = None
        async with aclosing(self.runs.events(agent, run_id)) as events:
            async for event in events:
                last = event
                message = _progress(event, turn)
                if isinstance(event, ev.TurnCompleted):
                    turn += 1
                if message is not None:
                    steps += 1
                    try:
                        await ctx.session.report_progress(steps, None, message)
                    except Exception as e:  # a client gone: the run is followed to its end all the same
                        log.debug("run %s: progress not sent (%s)", run_id, e)
        if last is None:
            raise RuntimeError(f"the log of run {run_id} ended without a terminal event")
        return last

    async def _cancel(self, agent: str, run_id: str, reason: str) -> None:
        """Cancel the run of a call its client cancelled, within `CANCEL_WAIT_S`. A run is cancelled by a
        command its host applies, so a run no host has started yet (its task still queued) is waited for
        first; one that does not start in time is left to run, and the log says so."""
        with anyio.move_on_after(CANCEL_WAIT_S) as waited:
            while True:
                try:
                    await self.runs.cancel(agent, run_id, reason)
                    log.info("run %s cancelled: the MCP client cancelled its call", run_id)
                    return
                except NotStarted:
                    await anyio.sleep(0.2)
                except Exception:
                    log.exception("run %s: the cancel of a call its client cancelled was not sent", run_id)
                    return
        if waited.cancelled_caught:
            log.warning("run %s: its call was cancelled but the run was not within %.0f s (no host has "
                        "started it yet?); an operator cancels it with `sa cancel %s`", run_id, CANCEL_WAIT_S,
                        run_id)

    # -- resources -------------------------------------------------------------------------------------

    async def list_resource_templates(self, ctx: ServerRequestContext[Any],
                                      params: types.PaginatedRequestParams | None
                                      ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            name="run", uri_template=f"{RUN_SCHEME}{{run_id}}", mime_type="text/plain",
            description="A run of the fleet by id: its timeline (model requests, tool calls, scripts, "
                        "durations, tokens), as `sa replay` prints it.")])

    async def list_resources(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        """The most recent runs of the agents offered (from the runs index, an operator's read); for
        credentials that may not read it, the runs this process started."""
        chosen = set(self.agents) if self.agents is not None else None
        if self.reads_log is not False:
            try:
                runs = await self.client.runs()
            except Exception as e:
                log.info("the runs index cannot be read (%s): resources are the runs this server started",
                         explain_refusal(e) or e)
                self.reads_log = False
            else:
                self.reads_log = True
                rows = [r for r in runs if chosen is None or r.actor.split(":")[0] in chosen][:RUNS_LISTED]
                return types.ListResourcesResult(resources=[
                    types.Resource(name=r.run_id, uri=f"{RUN_SCHEME}{r.run_id}", mime_type="text/plain",
                                   description=f"a run of {r.actor}: {r.status}") for r in rows])
        mine = list(self.runs.actors.items())[::-1][:RUNS_LISTED]
        return types.ListResourcesResult(resources=[
            types.Resource(name=run_id, uri=f"{RUN_SCHEME}{run_id}", mime_type="text/plain",
                           description=f"a run of {actor} this server started") for run_id, actor in mine])

    async def read_resource(self, ctx: ServerRequestContext[Any],
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if not uri.startswith(RUN_SCHEME) or not uri[len(RUN_SCHEME):]:
            raise MCPError(RESOURCE_NOT_FOUND, f"unknown resource {uri!r}: runs are read as "
                                               f"{RUN_SCHEME}<run_id>")
        run_id = uri[len(RUN_SCHEME):].strip("/")
        actor, events = await self._read_run(run_id)
        if not events:
            raise MCPError(RESOURCE_NOT_FOUND, f"no events for run {run_id!r}")
        text = replay_text(events, title=f"run {run_id} · {actor}")
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="text/plain",
                                                                             text=text)])

    async def _read_run(self, run_id: str) -> tuple[str, list[ev.Event]]:
        """(its actor, its events): a run this process started through the hosts; any run from the log
        where the credentials may read it; else, through the hosts, a run of an offered agent started with
        this server's secret (an earlier process given the same `--key-file`)."""
        known = self.runs.actors.get(run_id)
        if known is not None:
            with contextlib.suppress(StarterRefused):  # a run its task id had started before (another's)
                return known, await self._read_started(known, run_id)
        why = "these credentials may not read the run log"
        if self.reads_log is not False:
            handle = self.client.get(run_id)
            try:
                return handle.actor or "", await handle.replay()
            except ValueError as e:  # not a run id (a subject token)
                raise MCPError(RESOURCE_NOT_FOUND, f"{RUN_SCHEME}{run_id}: {e}") from None
            except Exception as e:
                why = explain_refusal(e) or f"{type(e).__name__}: {e}"
                self.reads_log = False
        for agent in self.agents or []:
            try:
                return agent, await self._read_started(agent, run_id)
            except (StarterRefused, MCPError):
                continue
        raise MCPError(RESOURCE_NOT_FOUND, f"run {run_id!r} is not one this server started, and reading any "
                                           f"other run needs an operator's credentials ({why})")

    async def _read_started(self, actor: str, run_id: str) -> list[ev.Event]:
        """The events the log holds now of a run this server started, through the hosts."""
        try:
            async with aclosing(self.runs.events(actor, run_id, follow=False)) as events:
                return [event async for event in events]
        except NotStarted:
            raise MCPError(RESOURCE_NOT_FOUND, f"no events for run {run_id!r} yet (its task waits for a "
                                               "host)") from None

    # -- the server ------------------------------------------------------------------------------------

    def server(self, name: str = "structured-agents") -> Server[Any]:
        """An `mcp` low-level server answering with this fleet's tools and resources."""
        return Server(name, version=_version(), instructions=INSTRUCTIONS,
                      on_list_tools=self.list_tools, on_call_tool=self.call_tool,
                      on_list_resources=self.list_resources,
                      on_list_resource_templates=self.list_resource_templates,
                      on_read_resource=self.read_resource)


def replay_text(events: Sequence[ev.Event], *, title: str = "") -> str:
    """A run's timeline as plain text: the table `sa replay` prints into a pipe (no colours, no markup)."""
    from rich.console import Console

    from runtime.client.replay import timeline

    out = io.StringIO()
    Console(file=out, width=TIMELINE_WIDTH, color_system=None, force_terminal=False,
            highlight=False).print(timeline(events, title=title))
    return out.getvalue()


def _description(name: str, served: dict[str, str] | None) -> str:
    """The bundle's description, or a plain one; a note when no live host serves it (`served` None: unknown,
    these credentials may not read the hosts' heartbeats)."""
    said = (served or {}).get(name) or (f"The agent {name} of a structured-agents fleet: give it a task, get "
                                        "its run's output.")
    if served is not None and name not in served:
        said += " (No live host serves this agent now: a call waits until one starts.)"
    return said


def _check_arguments(args: dict[str, Any]) -> str | None:
    """What is wrong with a call's arguments, in a sentence that says what to send; None when they fit."""
    unknown = sorted(set(args) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        return f"unknown argument(s) {', '.join(unknown)}: an agent takes input, task_id and thread"
    if not isinstance(args.get("input"), str) or not args["input"].strip():
        return "the argument `input` (the task, a non-empty string) is missing"
    for key in ("task_id", "thread"):
        if key in args and not (isinstance(args[key], str) and args[key]):
            return f"the argument `{key}` must be a non-empty string"
    return None


def _progress(event: ev.Event, turn: int) -> str | None:
    """What a progress notification says of `event`; None for an event not worth one."""
    if isinstance(event, ev.RunStarted):
        return f"run {event.run_id} started"
    if isinstance(event, ev.ModelRequested):
        return f"turn {turn}: asking the model"
    if isinstance(event, ev.ToolCalled):
        return f"turn {turn}: tool {event.call.name} called"
    if isinstance(event, ev.ToolCompleted):
        return f"turn {turn}: tool {event.tool} completed"
    if isinstance(event, ev.ToolFailed):
        return f"turn {turn}: tool {event.tool} failed ({event.error.kind})"
    if isinstance(event, ev.TurnCompleted):
        return f"turn {turn} completed"
    if isinstance(event, ev.ApprovalRequested):
        return (f"turn {turn}: tool {event.call.name} waits for a person's approval (sa approve "
                f"{event.run_id} {event.call.id}, or sa deny)")
    if isinstance(event, ev.ApprovalGranted | ev.ApprovalDenied):
        verdict = "approved" if isinstance(event, ev.ApprovalGranted) else "denied"
        return f"turn {turn}: call {event.call_id} {verdict}{f' by {event.by}' if event.by else ''}"
    if isinstance(event, ev.QuestionAsked):
        return (f"turn {turn}: the agent asks a person: {event.question} (sa answer {event.run_id} "
                f"{event.call_id} ANSWER)")
    return None


def _client_cancelled(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the call's scope was cancelled by its client: a ``notifications/cancelled`` for it arrived, or
    it came over the 2026 HTTP wire, where a client cancels by closing the call's stream. The SDK keeps the
    first on the request's dispatch context (``cancel_requested``), which its server context does not expose
    yet, hence the private attribute (`mcp` is pinned; the cancel test fails if it goes)."""
    dispatch = getattr(ctx.session, "_request_outbound", None)
    requested = getattr(dispatch, "cancel_requested", None)
    if isinstance(requested, anyio.Event) and requested.is_set():
        return True
    return ctx.request is not None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _result(run_id: str, ending: ev.Event) -> types.CallToolResult:
    """A run's ending as a call's result: the output, or the error naming why the run did not complete."""
    try:
        output = outcome(run_id, ending)
    except RunFailedError as e:
        return _error(str(e), run_id=run_id, reason=e.reason, detail=e.detail)
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2)
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=output if isinstance(output, dict) else None,
                                _meta={"structured-agents/run_id": run_id})


def _error(message: str, *, run_id: str | None = None, reason: str | None = None,
           detail: str | None = None) -> types.CallToolResult:
    meta = {key: value for key, value in (("structured-agents/run_id", run_id),
                                          ("structured-agents/reason", reason),
                                          ("structured-agents/detail", detail)) if value}
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True, _meta=meta or None)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("structured-agents")
    except PackageNotFoundError:
        return ""


__all__ = ["INPUT_SCHEMA", "RUN_SCHEME", "FleetTools", "replay_text"]
