"""Agent tools on a worker: a bundle's `- agent: name` call is not run here, it becomes a child run.

The worker starts (or finds, on a redelivery) the child run of the called agent and acks the job without
publishing an outcome (`delegate` returns `Delegated`): the child's end answers the call, through the
`SubrunWatch` that every worker serving agent tools runs beside its job loop (`open_watch`). The protocol
itself, and why it is safe without memory (ids derived from the parent's run and call, depth limits, a
parent's cancel reaching its children), is `runtime.subruns`; this module is only the worker's wiring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from runtime.jobs import ToolJob, ToolOutcome
from runtime.nats.retry import retrying
from runtime.subruns import SubrunWatch, start_child
from runtime.tools.agent_tool import AgentTool
from runtime.types import ToolResult
from runtime.worker.cancel import Cancels
from runtime.worker.registry import ToolRegistry

log = logging.getLogger("runtime.worker")


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
    if not any(isinstance(t, AgentTool) for t in registry.tools.values()):
        return None
    watch = SubrunWatch(js, worker=worker)
    await retrying(watch.open, what="opening the sub-run watch", give_up=patience, logger=log)
    return watch
