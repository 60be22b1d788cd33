"""One job to its outcome: what a worker does between decoding a job and publishing what became of it.

`execute` is steps 2 to 4 of the per-job protocol (`runtime.worker.loop` has all six): read arguments that
were too big for the job message from the object store; replay the recorded output of an earlier attempt
that already applied its writes (so a crash between "writes applied" and "ack" never writes twice); look
the tool up and resolve the job's limits; then load the data files, run the tool and persist its writes,
re-running on fresh data when another job's write landed first. The tool is a `.pym` script, run in the
Monty sandbox under the job's `Limits`, or a bundle's Python tool (`- python: module:function`), run under
its own timeout, concurrency limit and retry policy (`runtime.tools.hosted`); an agent tool is not run
but becomes a sub-run (`runtime.worker.subruns`). Every way a tool can fail is an outcome, an error value
for the run (`input` for a tool this worker lacks, `timeout`, `limit`, `output`, `cancelled`, ...); NATS
trouble is not: it comes back as a string saying why, and the loop gives the job back to be retried
later. Nothing here settles the job message or publishes its outcome.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from runtime.externals import ExecutionContext
from runtime.jobs import ToolJob, ToolOutcome
from runtime.log.payloads import PayloadError
from runtime.scripts import Limits, LimitsError
from runtime.tools import ToolContext
from runtime.tools.agent_tool import AgentTool
from runtime.tools.data import JobContext, WorkspaceConflict, WriteError
from runtime.types import ScriptNote, ToolResult
from runtime.worker.attempts import explain
from runtime.worker.externals import provide_externals, scrubbed, task_metadata
from runtime.worker.subruns import Delegated, delegate

if TYPE_CHECKING:
    from runtime.worker.loop import Worker

log = logging.getLogger("runtime.worker")

CONFLICT_RETRIES = 5  # each conflict means another job's write landed: progress is guaranteed


async def execute(worker: Worker, job: ToolJob, attempt: int) -> ToolOutcome | Delegated | str:
    """The job's outcome, or why NATS trouble means it should be retried later."""
    fields: dict[str, Any] = {"worker": worker.name, "attempt": attempt, "started": time.time(),
                              "earlier": await explain(worker.js, job.msg_id, attempt, worker.held.ack_wait)}
    if job.arguments_ref is not None:  # arguments too big for the job message: in the object store
        try:
            arguments = await worker.payloads.resolve(job.arguments_ref)
        except PayloadError as e:
            return ToolOutcome.for_job(job, ToolResult.failure("input", str(e)), **fields)
        except Exception as e:
            log.warning("worker %s: cannot read the arguments of %s: %s", worker.name, job.msg_id, e)
            return f"its arguments could not be read ({e})"
        job = msgspec.structs.replace(job, arguments=arguments, arguments_ref=None)
    provider, handler = worker.io_for(job)
    ctx = JobContext(job)
    try:
        if attempt > 1 and (prior := await handler.recorded(ctx)) is not None:
            worker.stats.replayed += 1
            return ToolOutcome.for_job(job, ToolResult(output=prior.output), writes=prior.writes,
                                       **fields)
    except Exception as e:
        log.warning("worker %s: cannot read the applied marker of %s: %s", worker.name, job.msg_id, e)
        return f"its applied-writes marker could not be read ({e})"

    tool = worker.registry.get(job.tool)
    if tool is None:  # `input`, as the kernel says of a tool it does not know
        known = ", ".join(sorted(worker.registry.tools)) or "none"
        return ToolOutcome.for_job(job, ToolResult.failure(
            "input", f"no tool named {job.tool!r} is loaded on worker {worker.name} (it has: {known})",
            detail="unknown_tool"), **fields)
    if job.tool_digest and tool.content_hash != job.tool_digest:
        log.warning("tool %s: the host expects version %s, this worker has %s",
                    tool.name, job.tool_digest, tool.content_hash)
    try:  # the job's limits dict, validated once per distinct value (Limits keeps the one cache)
        limits = Limits.resolve(job.limits) if job.limits else None  # None: the tool's own
    except LimitsError as e:
        return ToolOutcome.for_job(job, ToolResult.failure("limit", f"invalid limits in the job: {e}"),
                                   **fields)
    if isinstance(tool, AgentTool):  # a sub-run: started (or found); its end answers the call
        return await delegate(worker.js, tool, job, fields, worker=worker.name, cancels=worker.cancels)
    last_conflict = ""
    for _ in range(CONFLICT_RETRIES):
        if job.deadline is not None:
            left = job.deadline - time.time()
            if left <= 0:
                return ToolOutcome.for_job(job, ToolResult.failure(
                    "timeout", "the call's deadline passed before a worker could run it"), **fields)
            budget = tool.limits.merge(limits).effective().max_duration
            if budget and left < budget:
                limits = (limits or Limits()).merge(Limits(max_duration=left))
        ctx = JobContext(job)
        try:
            files = await provider.load_files(job.tool, job.arguments, ctx)
        except Exception as e:
            log.warning("worker %s: cannot load files for %s: %s", worker.name, job.msg_id, e)
            return f"its data files could not be loaded ({e})"
        notes: list[ScriptNote] = []  # shipped in the outcome as the sandbox made them
        if job.run_id in worker.cancels:
            return worker.cancels.outcome(job, notes, fields)
        execution = ExecutionContext.of(
            agent=job.actor.partition(":")[0], actor=job.actor, run_id=job.run_id, call_id=job.call_id,
            tool=job.tool, attempt=attempt, deadline=job.deadline, workspace=job.workspace,
            environ=getattr(tool, "environ", None),
            metadata=await task_metadata(worker.js, job, tool, worker=worker.name))
        provided = await provide_externals(tool, execution, notes, registry=worker.registry,
                                           factory=worker.externals, records=worker.records,
                                           secrets=worker.secrets)
        if isinstance(provided, ToolResult):
            return ToolOutcome.for_job(job, provided, **fields)
        assert not isinstance(tool, AgentTool)
        with worker.cancels.stoppable(job.run_id) as scope:
            result = await tool.execute(job.arguments, ToolContext(
                run_id=job.run_id, agent=job.actor, call_id=job.call_id, files=files, limits=limits,
                on_event=notes.append, externals=provided.externals or None, execution=execution))
        if scope.cancelled_caught:
            return worker.cancels.outcome(job, notes, fields)
        if provided.recorder is not None and provided.recorder.replayed:
            log.info("worker %s: %s replayed %d recorded external call(s), made %d", worker.name,
                     job.msg_id, provided.recorder.replayed, provided.recorder.made)
        if provided.secrets:
            result, notes = scrubbed(result, notes, provided.secrets)
        if result.error is not None:
            return ToolOutcome.for_job(job, result, notes=tuple(notes), **fields)
        try:
            await handler.handle(job.tool, result.output, ctx)
        except WriteError as e:
            failed = ToolResult.failure("output", str(e), duration_ms=result.duration_ms)
            return ToolOutcome.for_job(job, failed, notes=tuple(notes), **fields)
        except WorkspaceConflict as e:
            log.info("worker %s: %s; re-running on fresh data", worker.name, e)
            last_conflict = str(e)
            await anyio.sleep(random.uniform(0.0, 0.02))  # de-synchronise writers racing in lock-step
            continue
        except Exception as e:
            log.warning("worker %s: cannot persist writes of %s: %s", worker.name, job.msg_id, e)
            return f"its workspace writes could not be persisted ({e})"
        worker.stats.writes += ctx.writes_applied
        return ToolOutcome.for_job(job, result, notes=tuple(notes), writes=ctx.writes_applied, **fields)
    return ToolOutcome.for_job(job, ToolResult.failure(
        "external", f"{last_conflict} (gave up after {CONFLICT_RETRIES} attempts)", detail="conflict"),
        **fields)
