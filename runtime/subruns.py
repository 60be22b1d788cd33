"""Durable sub-runs: one agent's tool call that is another agent's run (`- agent: researcher`).

A tool worker runs the call: it publishes the child task through the normal task path and follows the
child's log to its end. Everything that makes this safe comes from determinism, not from memory:

- the child's task id is derived from the parent's run and call (`child_task_id`), so the child's run id
  is too: a redelivered job, or a parent's host recovering and re-publishing the job, finds the same
  child (the task's Msg-Id drops a second publish) and follows it instead of starting another;
- the child runs as its own instance of the agent (actor `<agent>:sub-…`, `child_actor`): an actor runs
  one task at a time, so a child queued behind its own parent (an agent delegating to itself, or a cycle)
  would wait forever, and two delegations of one turn would run one after the other;
- the child's `run.started` metadata names its parent (`sa.parent_run`, `sa.parent_call`) and its depth
  (`sa.depth`); a call deeper than the tool's `max_depth` is an error value, so a cycle of agents calling
  each other ends;
- the child's end is the call's result: `run.completed` gives its output, `run.failed` and
  `run.cancelled` are error values (`external`, `cancelled`) naming the child run;
- cancelling the parent stops the worker's wait, and the worker cancels the child.

While it waits, the call holds one of the worker's job slots (the job is heartbeated like any long tool):
size worker concurrency for the delegations you expect.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime.host.commands import actor_key, publish_command, publish_task, run_id_for
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import HostBeat
from runtime.nats.subjects import HOSTS_BUCKET
from runtime.tools.agent_tool import AgentTool
from runtime.types import ToolResult

__all__ = ["DEPTH", "PARENT_CALL", "PARENT_RUN", "child_actor", "child_run_id", "child_task_id", "run_child"]

log = logging.getLogger("runtime.subruns")

PARENT_RUN, PARENT_CALL, DEPTH = "sa.parent_run", "sa.parent_call", "sa.depth"


def child_task_id(parent_run: str, call_id: str) -> str:
    """The task id of the child a call starts: the same on every delivery and after every recovery."""
    return "sub-" + hashlib.blake2b(f"{parent_run}\x00{call_id}".encode(), digest_size=10).hexdigest()


def child_actor(agent: str, parent_run: str, call_id: str) -> str:
    """The actor the child runs as: an instance of `agent` of its own."""
    return actor_key(agent, child_task_id(parent_run, call_id))


def child_run_id(agent: str, parent_run: str, call_id: str) -> str:
    return run_id_for(child_actor(agent, parent_run, call_id), child_task_id(parent_run, call_id))


async def _depth_of(js: JetStreamContext, run_id: str, actor: str) -> int:
    """How deep `run_id` is below a top-level run (0 for one), from its `run.started` metadata."""
    started = await RunLog(js).started(run_id, actor)
    return int(started.metadata.get(DEPTH, 0) or 0) if started is not None else 0


async def _served(js: JetStreamContext, agent: str) -> list[str] | None:
    """The agents live hosts serve, if `agent` is not among them (None: it is, or it cannot be told)."""
    try:
        entries = await kv_entries(await fleet_kv(js, HOSTS_BUCKET))
        beats = [HostBeat.decode(e.value) for e in entries.values() if e.value]
    except Exception as e:  # best effort: without the list, the task waits for a host as any task does
        log.debug("cannot read the hosts bucket: %s", e)
        return None
    served = sorted({a for b in beats for a in b.agents})
    return None if not beats or agent in served else served


def _operator(js: JetStreamContext) -> str | None:
    """The user this worker's connection authenticated as (a secured server lets it command only under
    that name); None: the process's configured identity."""
    options = getattr(getattr(js, "_nc", None), "options", None) or {}
    user = options.get("user")
    return str(user) if user else None


async def run_child(js: JetStreamContext, tool: AgentTool, arguments: dict[str, Any], *, parent_run: str,
                    parent_actor: str, call_id: str) -> ToolResult:
    """Start (or find) the child run of this call and wait for its end; its outcome as a `ToolResult`."""
    task = arguments.get("task")
    if not isinstance(task, str) or not task.strip():
        return ToolResult.failure("input", f"{tool.name} needs `task`: the text of the task to delegate")
    depth = await _depth_of(js, parent_run, parent_actor) + 1
    if depth > tool.max_depth:
        return ToolResult.failure("policy", f"delegating to {tool.agent} would nest sub-runs {depth} deep, "
                                            f"over the limit of {tool.max_depth} (agents calling each "
                                            "other in a cycle?); raise `max_depth` on the agent tool entry "
                                            "if meant")
    served = await _served(js, tool.agent)
    if served is not None:
        return ToolResult.failure("input", f"no host serves agent {tool.agent!r} (hosts serve: "
                                           f"{', '.join(served) or 'none'}); start one with its bundle")
    task_id = child_task_id(parent_run, call_id)
    actor = child_actor(tool.agent, parent_run, call_id)
    child = await publish_task(js, actor, task, task_id=task_id,
                               metadata={PARENT_RUN: parent_run, PARENT_CALL: call_id, DEPTH: depth,
                                         "sa.parent_agent": parent_actor})
    end: ev.Event | None = None
    try:
        with anyio.move_on_after(tool.timeout_s):  # None: no timeout
            async for e in RunLog(js).follow(child, resolve=True):
                end = e
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await publish_command(js, actor, ev.Cancel(run_id=child, reason=f"its parent run "
                                                                f"{parent_run} was cancelled"),
                                      operator=_operator(js))
            except Exception as e:  # the child goes on; its parent no longer waits for it
                log.warning("cannot cancel child run %s of %s: %s", child, parent_run, e)
        raise
    if isinstance(end, ev.RunCompleted):
        return ToolResult(output=end.output)
    if isinstance(end, ev.RunFailed):
        return ToolResult.failure("external", f"sub-agent {tool.agent} (run {child}) failed: {end.reason}"
                                              + (f": {end.detail}" if end.detail else ""), detail="subrun")
    if isinstance(end, ev.RunCancelled):
        return ToolResult.failure("cancelled", f"sub-agent {tool.agent} (run {child}) was cancelled"
                                               + (f": {end.reason}" if end.reason else ""))
    return ToolResult.failure("timeout", f"sub-agent {tool.agent} (run {child}) did not finish within "
                                         f"{tool.timeout_s:g} s; it goes on, and a later call finds it")

