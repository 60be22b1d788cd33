"""One job to its outcome: what a worker does between decoding a job and publishing what became of it.

`execute` is steps 2 to 4 of the per-job protocol (`runtime.worker.loop` has all six): read arguments that
were too big for the job message from the object store; replay the recorded output of an earlier attempt
that already applied its writes (so a crash between "writes applied" and "ack" never writes twice); look the
tool up (the exact version the job names: a worker that lacks it leaves the job to one that has it, or fails
it naming the version, `runtime.worker.handoff`) and resolve the job's limits; then load the data files, run
the tool and persist its writes, re-running on fresh data when another job's write landed first; a job
still running after a moment is announced to the run's followers meanwhile (`runtime.streaming`). The tool is
a `.pym` script, run in the Monty sandbox under the job's `Limits`, or a bundle's Python tool (`- python:
module:function`), run under its own timeout, concurrency limit and retry policy (`runtime.tools.hosted`);
an agent tool is not run but becomes a sub-run (`runtime.worker.subruns`). Every way a tool can fail is an
outcome, an error value for the run (`input` for a tool this worker lacks, `timeout`, `limit`, `output`,
`cancelled`, ...); NATS trouble is not: it comes back as a string saying why, and the loop gives the job
back to be retried later. Nothing here settles the job message or publishes its outcome.

What a job may touch of the worker running it is a `JobEnv`, built once by the worker: its name, its
connection, the registry, what the other workers serve, the payload store, where files come from and writes
go, the cancels, the counters, the AckWait and MaxDeliver in force and what externals are bound to. Naming
it keeps this module below the loop (it never imports `runtime.worker.loop`) and makes the dependencies of a
job visible in one place.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from nats.js import JetStreamContext

from runtime.externals import ExecutionContext, ExternalsFactory, Secrets
from runtime.jobs import Ask, ToolJob, ToolOutcome
from runtime.log.payloads import PayloadError, Payloads
from runtime.scripts import Limits, LimitsError
from runtime.streaming import ScriptNotices
from runtime.tools import ToolContext
from runtime.tools.agent_tool import AgentTool
from runtime.tools.data import DataProvider, JobContext, ResultHandler, WorkspaceConflict, WriteError
from runtime.tools.mcp import McpTool
from runtime.types import ScriptNote, ToolResult
from runtime.worker.attempts import explain, handed_off
from runtime.worker.cancel import Cancels
from runtime.worker.externals import ExternalRecords, provide_externals, scrubbed, task_metadata
from runtime.worker.handoff import Fleet, HandOff, decide
from runtime.worker.mcp_clients import in_doubt
from runtime.worker.registry import Served, ToolRegistry, WorkerTool
from runtime.worker.stats import WorkerStats
from runtime.worker.subruns import Delegated, delegate

log = logging.getLogger("runtime.worker")

CONFLICT_RETRIES = 5  # each conflict means another job's write landed: progress is guaranteed


@dataclass(frozen=True)
class JobEnv:
    """What running a job needs of its worker, and nothing more (the worker builds it once).

    `ack_wait` and `max_deliver` are functions because they follow the shared consumer while the worker
    runs;
    `stats` is the worker's own counters (a job adds its replays and writes). `externals` is the worker's
    own factory (`sa worker --externals`): a bundle's factory comes first."""

    js: JetStreamContext
    worker: str  # the worker's name, in outcomes and the log
    registry: ToolRegistry
    fleet: Fleet  # what the other live workers serve (for a job whose tool version this one lacks)
    payloads: Payloads
    io_for: Callable[[ToolJob], tuple[DataProvider, ResultHandler]]
    cancels: Cancels
    stats: WorkerStats
    ack_wait: Callable[[], float]
    max_deliver: Callable[[], int]
    records: ExternalRecords
    externals: ExternalsFactory | None = None
    secrets: Secrets = field(default_factory=Secrets)
    notices: ScriptNotices | None = None  # tells followers of a job still running (None: nobody)


async def execute(env: JobEnv, job: ToolJob, attempt: int) -> ToolOutcome | Delegated | HandOff | str:
    """The job's outcome, a hand-off to another worker (this one lacks the tool version the job names), or
    why NATS trouble means it should be retried later."""
    started = time.time()
    earlier = await explain(env.js, job.msg_id, attempt, env.ack_wait())
    return await _Delivery(env, job, attempt, started, earlier).outcome()


class _Delivery:
    """One delivery of a job on its way to an outcome: the steps share the job, the environment and the
    fields every outcome of this delivery carries (worker, attempt, start time, earlier deliveries)."""

    def __init__(self, env: JobEnv, job: ToolJob, attempt: int, started: float,
                 earlier: tuple[str, ...]) -> None:
        self.env, self.job, self.attempt = env, job, attempt
        self.fields: dict[str, Any] = {"worker": env.worker, "attempt": attempt, "started": started,
                                       "earlier": earlier}

    def done(self, result: ToolResult, **more: Any) -> ToolOutcome:
        return ToolOutcome.for_job(self.job, result, **more, **self.fields)

    async def outcome(self) -> ToolOutcome | Delegated | HandOff | str:
        trouble = await self._resolve_arguments()
        if trouble is not None:
            return trouble
        provider, handler = self.env.io_for(self.job)
        replayed = await self._replayed(handler)
        if replayed is not None:
            return replayed
        served = await self._served()
        if not isinstance(served, Served):
            return served
        limits = self._limits()
        if isinstance(limits, ToolOutcome):
            return limits
        if isinstance(served.tool, AgentTool):  # a sub-run: started (or found); its end answers the call
            return await delegate(self.env.js, served.tool, self.job, self.fields, worker=self.env.worker,
                                  cancels=self.env.cancels)
        if isinstance(served.tool, McpTool):  # a call through this worker's session with its server
            return await self._call_mcp(served.tool)
        if self.env.notices is None:
            return await self._run(served, limits, provider, handler)
        job = self.job
        async with self.env.notices.running(job.actor, job.run_id, job.call_id, job.tool,
                                            attempt=self.attempt, started=self.fields["started"]):
            return await self._run(served, limits, provider, handler)

    async def _resolve_arguments(self) -> ToolOutcome | str | None:
        """Arguments too big for the job message are in the object store: read them into the job."""
        job = self.job
        if job.arguments_ref is None:
            return None
        try:
            arguments = await self.env.payloads.resolve(job.arguments_ref)
        except PayloadError as e:
            return self.done(ToolResult.failure("input", str(e)))
        except Exception as e:
            log.warning("worker %s: cannot read the arguments of %s: %s", self.env.worker, job.msg_id, e)
            return f"its arguments could not be read ({e})"
        self.job = msgspec.structs.replace(job, arguments=arguments, arguments_ref=None)
        return None

    async def _replayed(self, handler: ResultHandler) -> ToolOutcome | str | None:
        """The recorded output of an earlier delivery that already applied its writes, if there was one."""
        if self.attempt <= 1:
            return None
        try:
            prior = await handler.recorded(JobContext(self.job))
        except Exception as e:
            log.warning("worker %s: cannot read the applied marker of %s: %s", self.env.worker,
                        self.job.msg_id, e)
            return f"its applied-writes marker could not be read ({e})"
        if prior is None:
            return None
        self.env.stats.replayed += 1
        return self.done(ToolResult(output=prior.output), writes=prior.writes)

    async def _served(self) -> Served | ToolOutcome | HandOff:
        """The tool version the job names; if this worker lacks it, a hand-off or an `input` failure (as
        the kernel says of a tool it does not know), `runtime.worker.handoff`."""
        env = self.env
        served = env.registry.find(self.job)
        if served is not None:
            return served
        return await decide(env.fleet, env.registry, self.job, attempt=self.attempt,
                            max_deliver=env.max_deliver(), worker=env.worker, done=self.done)

    async def _call_mcp(self, tool: McpTool) -> ToolOutcome:
        """An MCP server's tool: no files, no sandbox, no writes. A redelivery of a call that must not be
        repeated is `in_doubt` without calling (`runtime.worker.mcp_clients`); a cancel of the run stops
        the call."""
        env, job = self.env, self.job
        if job.deadline is not None and job.deadline <= time.time():
            return self.done(ToolResult.failure("timeout", "the call's deadline passed before a worker could "
                                                           "run it"))
        if self.attempt > 1 and not tool.repeatable:
            doubt = in_doubt(tool, self.attempt, await handed_off(env.js, job.msg_id))
            if doubt is not None:
                return self._answered(doubt)
        if job.run_id in env.cancels:
            return env.cancels.outcome(job, [], self.fields)
        with env.cancels.stoppable(job.run_id) as scope:
            result = await env.registry.mcp.call(tool, job.arguments, deadline=job.deadline,
                                                 resume=job.resume)
        if scope.cancelled_caught:
            return env.cancels.outcome(job, [], self.fields)
        return self._answered(result)

    def _answered(self, result: ToolResult | Ask) -> ToolOutcome:
        """The outcome of a result, or of a question the call puts to a person (the result then says the
        same, for a host that does not know questions from calls)."""
        if isinstance(result, Ask):
            doubt = result.resume.get("kind") == "in_doubt"
            said = ToolResult.failure("in_doubt" if doubt else "external", result.question, detail="asked")
            return self.done(said, ask=result)
        return self.done(result)

    def _limits(self) -> Limits | ToolOutcome | None:
        """The job's limits dict, validated once per distinct value (Limits keeps the one cache); None:
        the tool's own."""
        try:
            return Limits.resolve(self.job.limits) if self.job.limits else None
        except LimitsError as e:
            return self.done(ToolResult.failure("limit", f"invalid limits in the job: {e}"))

    async def _run(self, served: Served, limits: Limits | None, provider: DataProvider,
                   handler: ResultHandler) -> ToolOutcome | str:
        """Run the tool and persist its writes, on fresh data again after each write conflict."""
        last_conflict = ""
        for _ in range(CONFLICT_RETRIES):
            capped = self._within_deadline(served.tool, limits)
            if isinstance(capped, ToolOutcome):
                return capped
            limits = capped
            ran = await self._run_once(served, limits, provider, handler)
            if not isinstance(ran, WorkspaceConflict):
                return ran
            log.info("worker %s: %s; re-running on fresh data", self.env.worker, ran)
            last_conflict = str(ran)
            await anyio.sleep(random.uniform(0.0, 0.02))  # de-synchronise writers racing in lock-step
        return self.done(ToolResult.failure(
            "external", f"{last_conflict} (gave up after {CONFLICT_RETRIES} attempts)", detail="conflict"))

    def _within_deadline(self, tool: WorkerTool, limits: Limits | None) -> Limits | ToolOutcome | None:
        """The limits cut to the time the call's deadline leaves, or a `timeout` if it has passed."""
        if self.job.deadline is None:
            return limits
        left = self.job.deadline - time.time()
        if left <= 0:
            return self.done(ToolResult.failure(
                "timeout", "the call's deadline passed before a worker could run it"))
        budget = tool.limits.merge(limits).effective().max_duration
        if budget and left < budget:
            return (limits or Limits()).merge(Limits(max_duration=left))
        return limits

    async def _run_once(self, served: Served, limits: Limits | None, provider: DataProvider,
                        handler: ResultHandler) -> ToolOutcome | str | WorkspaceConflict:
        """Load the files, run the tool in a scope a cancel of its run stops, then persist its writes."""
        env, job, tool = self.env, self.job, served.tool
        ctx = JobContext(job)
        try:
            files = await provider.load_files(job.tool, job.arguments, ctx)
        except Exception as e:
            log.warning("worker %s: cannot load files for %s: %s", env.worker, job.msg_id, e)
            return f"its data files could not be loaded ({e})"
        notes: list[ScriptNote] = []  # shipped in the outcome as the sandbox made them
        if job.run_id in env.cancels:
            return env.cancels.outcome(job, notes, self.fields)
        execution = ExecutionContext.of(
            agent=job.actor.partition(":")[0], actor=job.actor, run_id=job.run_id, call_id=job.call_id,
            tool=job.tool, attempt=self.attempt, deadline=job.deadline, workspace=job.workspace,
            environ=getattr(tool, "environ", None),
            metadata=await task_metadata(env.js, job, tool, worker=env.worker))
        provided = await provide_externals(tool, execution, notes, setup=served.setup, factory=env.externals,
                                           records=env.records, secrets=env.secrets)
        if isinstance(provided, ToolResult):
            return self.done(provided)
        assert not isinstance(tool, AgentTool | McpTool)
        with env.cancels.stoppable(job.run_id) as scope:
            result = await tool.execute(job.arguments, ToolContext(
                run_id=job.run_id, agent=job.actor, call_id=job.call_id, files=files, limits=limits,
                on_event=notes.append, externals=provided.externals or None, execution=execution))
        if scope.cancelled_caught:
            return env.cancels.outcome(job, notes, self.fields)
        if provided.recorder is not None and provided.recorder.replayed:
            log.info("worker %s: %s replayed %d recorded external call(s), made %d", env.worker,
                     job.msg_id, provided.recorder.replayed, provided.recorder.made)
        if provided.secrets:
            result, notes = scrubbed(result, notes, provided.secrets)
        if result.error is not None:
            return self.done(result, notes=tuple(notes))
        return await self._persist(result, notes, handler, ctx)

    async def _persist(self, result: ToolResult, notes: list[ScriptNote], handler: ResultHandler,
                       ctx: JobContext) -> ToolOutcome | str | WorkspaceConflict:
        """Apply the run's writes: an `output` failure for malformed ones, the conflict for a stale read."""
        try:
            await handler.handle(self.job.tool, result.output, ctx)
        except WriteError as e:
            failed = ToolResult.failure("output", str(e), duration_ms=result.duration_ms)
            return self.done(failed, notes=tuple(notes))
        except WorkspaceConflict as e:
            return e
        except Exception as e:
            log.warning("worker %s: cannot persist writes of %s: %s", self.env.worker, self.job.msg_id, e)
            return f"its workspace writes could not be persisted ({e})"
        self.env.stats.writes += ctx.writes_applied
        return self.done(result, notes=tuple(notes), writes=ctx.writes_applied)
