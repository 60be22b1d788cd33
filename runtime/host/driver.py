"""The run driver on a host: the one driver (`runtime.driver.run.RunDriver`) with the fleet's ports.

What is the host's own here is only where effects go:
* a tool call is a `ToolJob` on TOOLS (Msg-Id `<run>/<call>`, its big arguments in the object store by
  reference), handed to the connection, its `tool.called` record written while it travels, its ack awaited
  after (`runtime.host.jobs_out`); its outcome comes back on RESULTS through `runtime.host.routing`;
* a run that only waits on timers or questions is parked: its wake-ups are scheduled in the cluster
  (`runtime.host.sleep`) and the driver lets it go, holding nothing until a `Wake` or an `Answer` command
  folds it back (`runtime.host.recovery`); an ended run's unfired wake-ups are deleted;
* a person's input arrives as commands from outside (`sa approve`, `sa answer`, the client, the inspector),
  so there is nobody to ask here.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.driver.inputs import parked_wakes
from runtime.driver.ports import Driven, Inbound, ack_quietly
from runtime.driver.run import RunDriver as Driver
from runtime.host.jobs_out import job_acked, send_job
from runtime.host.runs_index import Standing
from runtime.host.served import AgentRuntime
from runtime.host.sleep import forget_wakes, schedule_wakes
from runtime.jobs import ToolJob
from runtime.log import RunLog
from runtime.types import ToolCall

RunDriver: TypeAlias = Driver[AgentRuntime]  # the driver of a run this host serves


class HostPorts:
    """A host's ports for one run (see the module docstring)."""

    who = "host"

    def __init__(self, js: JetStreamContext, agent: AgentRuntime, partition: int,
                 holds: Callable[[str, int], bool] | None = None) -> None:
        self.js, self.agent, self.partition = js, agent, partition
        self.holds = holds  # (actor, partition) -> whether this host holds its slot now, by its lease
        self._wakes: set[str] = set()  # timers and questions whose wake-up this run's driver scheduled

    async def dispatch(self, driver: Driven, calls: Sequence[ToolCall], deadline: float | None,
                       flush: Callable[[], Awaitable[None]]) -> None:
        """Publish a job per call, all at once: the jobs are handed to the connection, the records staged
        for them written, and only then the jobs' acks awaited. Waiting for the record first cost a round
        trip per call, and writing it first put its encoding on the job's way (~0.2 ms of a turn)."""
        jobs: list[ToolJob] = []
        turn = driver.state.turn
        resumed = turn.resumed if turn is not None else {}
        for call in calls:
            round_, resume = resumed.get(call.id, (0, None))  # sent out again after a person's answer
            arguments = await driver.log.payloads.offload(dict(call.arguments), run=driver.run_id)  # big: ref
            by_ref = isinstance(arguments, ev.PayloadRef)
            jobs.append(ToolJob(run_id=driver.run_id, actor=driver.actor, call_id=call.id, tool=call.name,
                                arguments={} if by_ref else arguments,
                                arguments_ref=arguments if by_ref else None, partition=self.partition,
                                limits=self.agent.job_limits(call.name),
                                workspace=self.agent.bundle.workspace, deadline=deadline,
                                tool_digest=self.agent.tool_digest(call.name), round=round_,
                                resume=dict(resume) if resume is not None else None))
        sent = [(job, await send_job(self.js, job)) for job in jobs]  # on their way before their records
        try:
            await flush()
            for job, pending in sent:
                await job_acked(self.js, job, pending)
        finally:
            for _, pending in sent:  # a refused append or a rejected job: stop waiting for the other acks
                if pending is not None:
                    pending.drop()

    async def awaiting(self, driver: Driven, asked: ev.ApprovalRequested | ev.QuestionAsked) -> None:
        return None  # a person's input arrives as a command

    def may_act(self, driver: Driven) -> bool:
        """Whether this host still holds the run's slot by a lease it can show is live (`Leases.valid`):
        after a pause (SIGSTOP, a stalled VM) the monotonic clock has jumped past the lease's life, so the
        answer is no before the host's own fence watch has woken to notice."""
        return self.holds is None or self.holds(driver.actor, self.partition)

    async def park(self, driver: Driven) -> bool:
        """Schedule the wake-up of every pending timer and question timeout (what is staged is durable
        already); True if the run now only waits for them, so the driver lets it go."""
        await schedule_wakes(self.js, driver.actor, driver.run_id, parked_wakes(driver.state), self._wakes)
        return not (driver.inbox or driver.in_flight or kernel.parked_until(driver.state) is None)

    async def ended(self, driver: Driven) -> None:
        await forget_wakes(self.js, driver.run_id, driver.state)


def host_driver(js: JetStreamContext, agent: AgentRuntime, actor: str, run_id: str, partition: int, *,
                state: kernel.State, last_seq: int, on_event: Callable[[ev.Event], Any] | None = None,
                clock: Callable[[], float] = time.time, log: RunLog | None = None,
                holds: Callable[[str, int], bool] | None = None) -> RunDriver:
    """The driver of one run on this host: created when an actor starts a task's run, or when a run is
    folded from its log (`runtime.host.recovery`); fed by `runtime.host.routing`. `holds(actor, p)`: whether
    this host holds that slot's lease now (`HostPorts.may_act`)."""
    return Driver(log or run_log_for(js), agent, HostPorts(js, agent, partition, holds), actor, run_id,
                     state=state, last_seq=last_seq, partition=partition, on_event=on_event, clock=clock)


def standing(driver: RunDriver) -> Standing:
    """What the runs index records of a run this host drives, now (`RunsIndex.record`)."""
    return Standing(run_id=driver.run_id, actor=driver.actor, partition=driver.partition,
                    last_seq=driver.last_seq, state=driver.state, bundle=str(driver.agent.bundle.path),
                    task_id=driver.task_id, forked=driver.forked, parked=driver.parked)


_LOGS: weakref.WeakKeyDictionary[JetStreamContext, RunLog] = weakref.WeakKeyDictionary()


def run_log_for(js: JetStreamContext) -> RunLog:
    """One `RunLog` per JetStream context, so its object store handle is opened once per process."""
    run_log = _LOGS.get(js)
    if run_log is None:
        run_log = _LOGS[js] = RunLog(js)
    return run_log


__all__ = ["HostPorts", "Inbound", "RunDriver", "ack_quietly", "host_driver", "run_log_for", "standing"]
