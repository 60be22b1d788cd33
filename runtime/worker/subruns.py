"""Durable sub-runs: one agent's tool call that is another agent's run (`- agent: researcher`).

A tool worker takes the call's job, publishes the child task through the normal task path, and acks the
job: nothing waits while the child runs, no worker slot and no host. When the child ends, the workers'
`SubrunWatch` (one durable consumer of every run's end, `RunLog.ends`) turns its end into the parent
call's `ToolOutcome` on RESULTS, as if a worker had run the call: the parent's host applies it as any
outcome. Everything that makes this safe comes from determinism, not from memory:

- the child's task id is derived from the parent's run and call (`child_task_id`), so the child's run id
  is too: a redelivered job, or a parent's host recovering and re-publishing the job, finds the same
  child (the task's Msg-Id drops a second publish; a child that already ended answers at once);
- the child runs as its own instance of the agent (actor `<agent>:sub-…`, `child_actor`): an actor runs
  one task at a time, so a child queued behind its own parent (an agent delegating to itself, or a cycle)
  would wait forever, and two delegations of one turn would run one after the other;
- the child's `run.started` metadata names its parent (`sa.parent_run`, `sa.parent_call`, and the actor,
  partition and tool the outcome goes to) and its depth (`sa.depth`); a call deeper than the tool's
  `max_depth` is an error value, so a cycle of agents calling each other ends;
- the child's end is the call's result: `run.completed` gives its output, `run.failed` and
  `run.cancelled` are error values (`external`, `cancelled`) naming the child run; the outcome carries
  the Msg-Id `<parent run>/<call>`, so an end handled twice (a watch killed before its ack) is stored once;
- a parent's `run.cancelled` reaches the same watch, which cancels the children its pending agent calls
  started.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime.commands import (
    DEPTH,
    PARENT_ACTOR,
    PARENT_CALL,
    PARENT_PARTITION,
    PARENT_RUN,
    PARENT_TOOL,
    SUB_PREFIX,
    child_actor,
    child_run_id,
    child_task_id,
    publish_command,
    publish_task,
    split_actor,
)
from runtime.jobs import ToolJob, ToolOutcome
from runtime.log import TERMINAL_KINDS, RunLog, Tail
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import HostBeat
from runtime.nats.retry import retrying
from runtime.nats.subjects import HOSTS_BUCKET, SUBRUNS_CONSUMER
from runtime.tools.agent_tool import AgentTool
from runtime.types import ToolResult
from runtime.worker.cancel import Cancels
from runtime.worker.registry import ToolRegistry

__all__ = ["Delegated", "SubrunWatch", "delegate", "open_watch", "start_child"]

log = logging.getLogger("runtime.worker.subruns")

def child_result(end: ev.Event, agent: str) -> ToolResult:
    """The parent call's result for the child's terminal event."""
    if isinstance(end, ev.RunCompleted):
        return ToolResult(output=end.output)
    if isinstance(end, ev.RunFailed):
        return ToolResult.failure("external", f"sub-agent {agent} (run {end.run_id}) failed: {end.reason}"
                                              + (f": {end.detail}" if end.detail else ""), detail="subrun")
    reason = end.reason if isinstance(end, ev.RunCancelled) else ""
    return ToolResult.failure("cancelled", f"sub-agent {agent} (run {end.run_id}) was cancelled"
                                           + (f": {reason}" if reason else ""))


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


async def _ended(js: JetStreamContext, run_id: str, actor: str) -> ev.Event | None:
    """The run's terminal event, if it has ended (one direct get of its last event, then its read)."""
    last = await RunLog(js).last(run_id, actor)
    if last is None:
        return None
    history = await RunLog(js).read(run_id, actor, timeout=10.0)
    end = history.events[-1] if history.events else None
    return end if end is not None and ev.kind_of(end) in TERMINAL_KINDS else None


async def start_child(js: JetStreamContext, tool: AgentTool, job: ToolJob) -> ToolResult | str:
    """Start (or find) the child run of this call: its run id once its task is published (the outcome
    comes from `SubrunWatch` when it ends), or the call's result now (bad input, too deep, no host serves
    the agent, or the child already ended)."""
    task = job.arguments.get("task")
    if not isinstance(task, str) or not task.strip():
        return ToolResult.failure("input", f"{tool.name} needs `task`: the text of the task to delegate")
    depth = await _depth_of(js, job.run_id, job.actor) + 1
    if depth > tool.max_depth:
        return ToolResult.failure("policy", f"delegating to {tool.agent} would nest sub-runs {depth} deep, "
                                            f"over the limit of {tool.max_depth} (agents calling each "
                                            "other in a cycle?); raise `max_depth` on the agent tool entry "
                                            "if meant")
    actor = child_actor(tool.agent, job.run_id, job.call_id)
    child = child_run_id(tool.agent, job.run_id, job.call_id)
    end = await _ended(js, child, actor)
    if end is not None:  # a job run again after its child ended: answer from the child's log
        return child_result(end, tool.agent)
    served = await _served(js, tool.agent)
    if served is not None:
        return ToolResult.failure("input", f"no host serves agent {tool.agent!r} (hosts serve: "
                                           f"{', '.join(served) or 'none'}); start one with its bundle")
    await publish_task(js, actor, task, task_id=child_task_id(job.run_id, job.call_id),
                       metadata={PARENT_RUN: job.run_id, PARENT_CALL: job.call_id, DEPTH: depth,
                                 PARENT_ACTOR: job.actor, PARENT_PARTITION: job.partition,
                                 PARENT_TOOL: job.tool}, subrun=True)
    return child


def _operator(js: JetStreamContext) -> str | None:
    """The user this worker's connection authenticated as (a secured server lets it command only under
    that name); None: the process's configured identity."""
    options = getattr(getattr(js, "_nc", None), "options", None) or {}
    user = options.get("user")
    return str(user) if user else None


class SubrunWatch:
    """Turns every sub-run's end into its parent call's outcome, and a parent's cancel into its children's.

    One durable consumer shared by the workers that serve agent tools: each end is handled by one of
    them, acked after its outcome is published (a crash in between publishes it again, deduplicated)."""

    def __init__(self, js: JetStreamContext, *, worker: str = "") -> None:
        self.js = js
        self.worker = worker
        self.answered = 0
        self.cancelled = 0
        self._tail: Tail | None = None

    async def open(self) -> None:
        """Make sure the consumer exists before any child can start: it delivers only ends appended after
        it was first made, so a worker opens it before it takes a job."""
        self._tail = await RunLog(self.js).ends(SUBRUNS_CONSUMER)

    async def run(self) -> None:
        if self._tail is None:
            await self.open()
        tail = self._tail
        assert tail is not None
        try:
            while True:
                for item in await tail.fetch(32, timeout=1.0):
                    try:
                        # a run's end shares its message with the events written with it (a group)
                        if item.event is not None and ev.kind_of(item.event) in TERMINAL_KINDS:
                            await self.handle(item.event)
                    except Exception as e:  # NATS trouble: the end comes back after AckWait
                        log.warning("sub-run watch: cannot handle %s: %s", item.msg.subject, e)
                        continue
                    await item.ack()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await tail.close()
                except Exception as e:  # the connection is closing
                    log.debug("sub-run watch close: %s", e)

    async def handle(self, end: ev.Event) -> None:
        """One run's end: answer its parent if it is a child; cancel its children if it was cancelled."""
        actor = end.actor
        if isinstance(end, ev.RunCancelled):
            await self._cancel_children(end)
        _, instance = split_actor(actor)
        if not instance or not instance.startswith(SUB_PREFIX):
            return
        started = await RunLog(self.js).started(end.run_id, actor)
        meta = started.metadata if started is not None else {}
        if PARENT_RUN not in meta:
            return
        agent = split_actor(actor)[0]
        outcome = ToolOutcome(run_id=str(meta[PARENT_RUN]), actor=str(meta.get(PARENT_ACTOR, "")),
                              call_id=str(meta[PARENT_CALL]), tool=str(meta.get(PARENT_TOOL, agent)),
                              partition=int(meta.get(PARENT_PARTITION, 0)), result=child_result(end, agent),
                              worker=self.worker, started=started.ts if started is not None else 0.0,
                              finished=time.time())
        await self.js.publish(outcome.subject, outcome.encode(), headers=outcome.headers())
        self.answered += 1

    async def _cancel_children(self, cancelled: ev.RunCancelled) -> None:
        """Cancel the children the cancelled run's unanswered calls started (a call's tool name is the
        agent's name for an agent tool; a call that started no child has no child log, and is skipped)."""
        history = await RunLog(self.js).read(cancelled.run_id, cancelled.actor, timeout=10.0)
        answered = {e.call_id for e in history.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)}
        for e in history.events:
            if not isinstance(e, ev.ToolCalled) or e.call.id in answered:
                continue
            actor = child_actor(e.call.name, cancelled.run_id, e.call.id)
            child = child_run_id(e.call.name, cancelled.run_id, e.call.id)
            if await RunLog(self.js).last(child, actor) is None or await _ended(self.js, child, actor):
                continue
            reason = f"its parent run {cancelled.run_id} was cancelled"
            await publish_command(self.js, actor, ev.Cancel(run_id=child, reason=reason),
                                  operator=_operator(self.js))
            self.cancelled += 1


@dataclass(frozen=True)
class Delegated:
    """A job whose call became a child run: acked without an outcome (the child's end brings it)."""

    child_run: str


async def delegate(js: JetStreamContext, tool: AgentTool, job: ToolJob, fields: dict[str, Any], *,
                   worker: str, cancels: Cancels) -> ToolOutcome | Delegated | str:
    """A sub-run started for the call: `Delegated`; or the call's outcome now (its run was cancelled; bad
    input, too deep, no host serves the agent, or the child already ended); or why NATS trouble means the
    job should be retried later."""
    if job.run_id in cancels:
        return cancels.outcome(job, [], fields)
    try:
        started = await start_child(js, tool, job)
    except Exception as e:
        log.warning("worker %s: cannot start the sub-run of %s: %s", worker, job.msg_id, e)
        return f"its sub-run could not be started ({e})"
    if isinstance(started, ToolResult):
        return ToolOutcome.for_job(job, started, **fields)
    return Delegated(started)


async def open_watch(js: JetStreamContext, registry: ToolRegistry, *, worker: str,
                     patience: float) -> SubrunWatch | None:
    """The watch that answers a call when its child run ends, opened (retrying NATS trouble for up to
    `patience` seconds), for a worker that serves agent tools; None for one that does not."""
    if not any(isinstance(served.tool, AgentTool) for served in registry.served()):
        return None
    watch = SubrunWatch(js, worker=worker)
    await retrying(watch.open, what="opening the sub-run watch", give_up=patience, logger=log)
    return watch
