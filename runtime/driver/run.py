"""One run, driven: the one effect runner for the kernel, on a host of the fleet and in one process alike.

    state = fold(events)          # a new run: just `run.started`; a recovered run: its whole log
    loop:  apply what arrived     # tool outcomes, cancel / approve / deny / answer / wake commands
           effects = decide(state)
           perform them           # model calls here; tool calls through the ports; endings
           nothing to perform? -> park (the ports hold the wake-ups) or wait for the inbox (or a timer)

Why one driver: approvals, questions, timers, timeouts, the deadline, cancel and throttles are decided here
once, whatever the run is written to. What differs between the fleet and one process is only where things
go, so it is behind two narrow interfaces:

* the run log (`EventLog` below): `runtime.log.RunLog` over JetStream, or `runtime.log.memory.MemoryRunLog`;
  both are held to one conformance suite (`tests/log/test_log_conformance.py`);
* the ports (`Ports` below): where a tool call goes (a job on TOOLS for a worker, or `Tool.execute` here),
  how a run that only waits on time or on a person is let go (wake-ups scheduled in the cluster, or no
  parking at all: the driver waits here), and who is asked for outside input (commands from `sa approve` /
  `sa answer` / the client, or the in-process approver and answerer, whose replies arrive as the same
  commands: one primitive for outside input, `runtime.driver.inputs`).

Every event is written through the run log (`runtime.driver.staging`): stamped with the run's next
`seq` by `RunDriver.append`, written with the expected last sequence of the run. So the driver is the single
writer of its run: if another writer appended in between, the log raises `Superseded` and this driver stops
instead of writing a second branch. What `decide` settles by itself (a denial, an approval request, a turn's
end, the run's end) arrives as an event and is appended as it is; the driver performs only the two effects
that need the world.

What is never done twice (the recovery contract of `runtime.kernel`):
* a model call whose reply is in the log (`decide` does not return it); a `model.requested` already
  recorded for the current attempt is not recorded again, the call is simply made;
* a tool call: dispatched again under the same id `<run>/<call>` (on a host TOOLS deduplicates it within its
  window; beyond it the workers' `applied` markers keep writes exactly-once), `tool.called` recorded once;
* an outcome: a second outcome for a call that already has a result is acked and dropped without an event
  (the kernel would ignore it anyway; the log stays clean).

An inbound message is acked only after its events are appended: a host killed in between gets it again.

Staged appends (why a turn costs few round trips): `append` folds an event and stages it; a flush writes
what is staged, several events as one message (`runtime.driver.staging`, which says when the driver flushes
and why). An event the log can never take (`LogRejected`) must not wedge the run: the driver drops it and
what was staged after it, and ends the run with `run.failed` (reason `log_rejected`, saying which event and
why). The actor then takes its next task.

The endpoint's share: a model call waits for its turn at the endpoint (`runtime.model.limits`: the fleet's
permits, in priority order and round robin across actors, and the agent's daily budget) inside the call,
so a cancel or the deadline ends the wait like the call. Each 429/503 the client retries, and each wait
for a budget, is staged as `model.throttled` while the call goes on: an input to replay, never a new call.

Big payloads: the log offloads an event as it is written, so the log holds a stub while the state folds
the whole event; an outcome whose output is in the object store is resolved (`resolve_outcome`) before
its events are made, because the model's next prompt needs it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

from runtime import events as ev
from runtime import kernel
from runtime.driver.inputs import apply_answer, apply_verdict, parked_wakes, settle_due
from runtime.driver.ports import EventLog, Inbound, Item, Model, Ports, release_quietly
from runtime.driver.staging import Staged
from runtime.jobs import ToolOutcome
from runtime.log import LogRejected, Superseded
from runtime.model.limits import Throttle, Ticket
from runtime.model.step import Admission
from runtime.types import ToolCall, ToolError

if TYPE_CHECKING:
    from runtime.streaming import StreamPublisher

log = logging.getLogger("runtime.driver")

CANCEL_GRACE_S = 5.0  # how long a cancelled run waits for its stopped calls' reports before it lets go

A = TypeVar("A", bound=Model)


class RunDriver(Generic[A]):
    """Drives one run to its end (see the module docstring). On a host it is created when an actor starts a
    task's run, or when a run is folded from its log (`runtime.host.recovery`), and fed by
    `runtime.host.routing`; in one process by `runtime.driver.local.run_task`."""

    def __init__(self, log: EventLog, agent: A, ports: Ports, actor: str, run_id: str, *, state: kernel.State,
                 last_seq: int, partition: int = 0, on_event: Callable[[ev.Event], Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.log, self.agent, self.ports, self.actor, self.run_id = log, agent, ports, actor, run_id
        self.partition = partition  # the run's partition of its bundle in the fleet (0 in one process)
        self.state = state
        self.staged = Staged(log, last_seq, on_event)  # folded, not yet in the log; what waits for it
        self.task_id: str | None = None  # for the runs index
        self.forked: tuple[str, int] | None = None  # a fork's source run and seq, for the runs index
        self.thread: str | None = None  # the conversation the run belongs to (`runtime.log.threads`)
        self.streamer: StreamPublisher | None = None  # set: model output is published as it is generated
        self.priority = ev.DEFAULT_PRIORITY  # its model calls' place in the endpoint's queue (run.started)
        self.on_event, self.clock = on_event, clock
        self.inbox: deque[Inbound] = deque()
        self._wake = anyio.Event()
        self.in_flight: set[str] = set()  # call ids dispatched by this driver that have no result yet
        self._model_scope: anyio.CancelScope | None = None
        self._cancelling = False
        # called when the run starts or stops waiting for an approver (the host rewrites its index entry)
        self.on_status: Callable[[RunDriver[Any]], Awaitable[None]] | None = None
        self._waiting_indexed = False
        # the ports let the run go while it waits (`run` returned; a host indexes it as sleeping or waiting);
        # set by whoever folds a parked run back for a command, until the host re-indexes it
        self.parked = False

    # -- fed from outside --------------------------------------------------------------------------------

    def deliver(self, item: Inbound) -> None:
        self.inbox.append(item)
        if isinstance(item.item, ev.Cancel):
            self._cancelling = True
            if self._model_scope is not None:
                self._model_scope.cancel()  # a cancel must not wait for a slow model
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------------------

    async def end(self, reason: str, detail: str) -> None:
        """End the run as failed on the runner's own authority (not a kernel decision), durably."""
        await self.append(ev.RunFailed(run_id=self.run_id, reason=reason, detail=detail))
        await self._flush()

    async def cancel(self, reason: str, by: str) -> None:
        """Cancel the run now, durably, as a `Cancel` command would (for a caller that stops driving it)."""
        await self._apply(ev.Cancel(run_id=self.run_id, reason=reason, by=by))
        await self._flush()

    async def run(self) -> kernel.State:
        """Drive until the run is over (or parked); returns the state. `Superseded`: a lost OCC race (or
        the ports said this process may act for the run no more); the messages this driver held unacked
        are handed back first, so their redelivery does not wait for the AckWait."""
        try:
            return await self._run()
        except Superseded:
            held = [item.msg for item in self.inbox if item.msg is not None]
            held += self.staged.release()
            self.inbox.clear()
            for msg in held:
                await release_quietly(msg)
            raise

    async def _run(self) -> kernel.State:
        while not self.state.done:
            await self._drain_inbox()
            if self.state.done:
                break
            progressed = False
            for effect in kernel.decide(self.state):
                if self.state.done or self._cancelling:
                    break
                progressed |= await self._perform(effect)
            if not progressed and not self.state.done and not self._cancelling:
                if await self._timers_due():
                    continue
                if await self._park():
                    return self.state  # let go: a wake-up or a command brings it back
                await self._wait()
        await self._drain_inbox()  # ack whatever arrived for a run that is over
        await self._stopped_calls()
        await self._flush()
        await self.ports.ended(self)
        return self.state

    # -- time and waiting --------------------------------------------------------------------------------

    async def _timers_due(self) -> bool:
        """Fire the timers already due by this clock (a wait_until in the past, a run folded back after its
        instant), and time out the questions due (`runtime.driver.inputs`); True if any did."""
        now = self.clock()
        due = [call_id for call_id, at in kernel.pending_timers(self.state) if at <= now]
        for call_id in due:
            await self.append(ev.TimerFired(run_id=self.run_id, call_id=call_id, by=self.ports.who))
        return await settle_due(self.state, now, self.append, self._deadline_passed) or bool(due)

    async def _park(self) -> bool:
        """If the run now only waits on timers and people (questions, approvals), make what is staged durable
        and ask the ports to let it go (a host schedules the wake-ups and returns, holding nothing: its actor
        takes its next task, other runs' timers are not held up)."""
        if kernel.parked_until(self.state) is None:
            return False
        await self._flush()
        if not await self.ports.park(self):
            return False
        self.parked = True
        return True

    async def _stopped_calls(self) -> None:
        """A cancelled run with calls out: they are stopped (workers follow `run.cancelled`; in one process
        their tasks are cancelled) and report each as cancelled; record those reports, so the log says the
        tool really stopped, for a short while (a job no worker holds never reports), then let go."""
        if self.state.status != "cancelled" or not self.in_flight:
            return
        await self._flush()
        with anyio.move_on_after(CANCEL_GRACE_S):
            while self.in_flight:
                if not self.inbox:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                await self._drain_inbox()
                await self._flush()

    def _next_instant(self) -> float | None:
        """When time alone next settles something: an approval's or question's timeout, the deadline
        (`kernel.next_timer`), or a timer's due time (a run that was not parked waits for it here)."""
        times = [at for _, at in parked_wakes(self.state)]
        timer = kernel.next_timer(self.state)
        if timer is not None:
            times.append(timer)
        return min(times, default=None)

    async def _wait(self) -> None:
        """Block until something arrives; when time alone settles something, wake then and record it."""
        await self._flush()
        await self._index_waiting()
        if self.inbox:
            return
        self._wake = anyio.Event()
        instant = self._next_instant()
        if instant is None:
            await self._wake.wait()
            return
        with anyio.move_on_after(max(instant - self.clock(), 0.0)):
            await self._wake.wait()
            return
        verdicts = kernel.expire(self.state, self.clock())
        for verdict in verdicts:  # an approval or a question timed out: the verdict its rule names
            await self.append(verdict)
        deadline = self.state.deadline
        if not verdicts and deadline is not None and self.clock() >= deadline:
            await self._deadline_passed()

    async def _index_waiting(self) -> None:
        """Tell the host when the run starts or stops waiting for an approver (`sa runs` shows it)."""
        waiting = bool(kernel.pending_approvals(self.state))
        if waiting != self._waiting_indexed and self.on_status is not None:
            self._waiting_indexed = waiting
            await self.on_status(self)

    async def _deadline_passed(self) -> None:
        """Give the kernel an event past the deadline: the calls still out fail with `timeout`; a call
        waiting for an approver is denied. The next `decide` then ends the run with `deadline`."""
        turn = self.state.turn
        if turn is None:
            return
        for call in turn.calls:
            if call.id in turn.results:
                continue
            if call.id in self.in_flight or call.id in {*turn.called, *turn.timers, *turn.questions}:
                await self.append(ev.ToolFailed(run_id=self.run_id, call_id=call.id, tool=call.name,
                                                error=ToolError("timeout", f"{call.name} did not finish "
                                                                "before the task's deadline")))
                self.in_flight.discard(call.id)
            elif call.id in turn.approvals_requested and call.id not in turn.approvals:
                await self.append(ev.ApprovalDenied(run_id=self.run_id, call_id=call.id,
                                                    reason="the task's deadline passed", by="deadline"))

    # -- what arrives ------------------------------------------------------------------------------------

    async def _drain_inbox(self) -> None:
        """Apply what arrived; each message is acked after the next flush (its events are then durable).
        A message whose apply fails is not acked: it is redelivered (to whoever owns the run then)."""
        while self.inbox:
            item = self.inbox.popleft()
            await self._apply(item.item)
            if item.msg is not None:
                self.staged.ack_after(item.msg)

    async def _apply(self, item: Item) -> None:
        state = self.state
        if isinstance(item, ev.Wake):
            if any(c == item.call_id for c, _ in kernel.pending_timers(state)):
                await self.append(ev.TimerFired(run_id=self.run_id, call_id=item.call_id, by="schedule"))
            await settle_due(state, self.clock(), self.append, self._deadline_passed, call_id=item.call_id)
        elif isinstance(item, ev.Answer):
            await apply_answer(state, item, self.append)
        elif isinstance(item, ev.ToolFailed):
            if any(c.id == item.call_id for c, _ in kernel.pending_questions(state)):
                await self.append(item)
        elif isinstance(item, ToolOutcome):
            await self._outcome(item)
        elif isinstance(item, ev.Cancel):
            self._cancelling = False
            if not state.done:
                by = item.by or "command"
                for call in kernel.pending_approvals(state):  # a cancel closes what waits for a person
                    await self.append(ev.ApprovalDenied(run_id=self.run_id, call_id=call.id, by=by,
                                                        reason="the run was cancelled"))
                await self.append(ev.RunCancelled(run_id=self.run_id, reason=item.reason or "cancelled",
                                                  by=by))
        else:
            await apply_verdict(state, item, self.append)

    async def _outcome(self, item: ToolOutcome) -> None:
        state = self.state
        was_out = item.call_id in self.in_flight
        self.in_flight.discard(item.call_id)
        turn = state.turn
        if state.status == "cancelled" and was_out and turn is not None and \
                turn.call(item.call_id) is not None and item.call_id not in turn.results:
            for event in item.events():  # a stopped call's report: it explains, it changes nothing
                await self.append(event)
            return
        current = turn.resumed[item.call_id][0] if turn is not None and item.call_id in turn.resumed else 0
        if state.done or turn is None or turn.call(item.call_id) is None or item.call_id in turn.results or \
                item.round != current:  # an earlier round's report, after a person's answer sent it again
            log.debug("run %s: outcome of %s changes nothing (duplicate or stale)", self.run_id, item.call_id)
            return
        item = await self.log.payloads.resolve_outcome(item)  # the next prompt needs the real output
        call = turn.call(item.call_id)
        if call is not None and item.call_id not in turn.called:  # sent, but its record never landed
            edited = turn.edited.get(call.id)  # as it was sent: with an approver's arguments, if edited
            call = call if edited is None else ToolCall(call.id, call.name, dict(edited))
            await self.append(ev.ToolCalled(run_id=self.run_id, call=call))
        for event in item.events():
            await self.append(event)

    # -- effects -----------------------------------------------------------------------------------------

    async def _perform(self, decision: kernel.Decision) -> bool:
        """Perform one decision; True if it appended something (the state moved)."""
        match decision:
            case kernel.CallModel():
                await self._call_model(decision)
            case kernel.CallTools():
                return await self._dispatch(decision)
            case ev.ApprovalRequested() | ev.QuestionAsked():
                await self.append(decision)
                await self.ports.awaiting(self, decision)
            case _:  # an event the kernel settled on by itself
                await self.append(decision)
        return True

    async def _call_model(self, effect: kernel.CallModel) -> None:
        """Call the model while what is staged (ending with `model.requested`) is written; then stage
        the reply. A lost OCC race cancels the call (the task group) and raises `Superseded`."""
        turn = self.state.turn
        if not (turn is not None and turn.requested):  # recovered after `model.requested`: don't record twice
            await self.append(self.agent.step.requested(effect, self.run_id, self.agent.client))
        self._may_act("send its model request")
        left = effect.deadline - self.clock() if effect.deadline is not None else None
        reply: list[ev.ModelResponded | ev.ModelFailed] = []

        async def call() -> None:
            if self._cancelling:  # a cancel arrived before this task started
                return
            with anyio.CancelScope() as scope:
                self._model_scope = scope
                try:
                    stream = self.streamer.request(effect.id, effect.turn) if self.streamer else None
                    reply.append(await self.agent.step.call(self.agent.client, effect, self.run_id,
                                                            timeout=left, stream=stream,
                                                            admission=self._admission(effect)))
                finally:
                    self._model_scope = None

        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            try:
                await self._flush()
            except Exception as exc:  # raised below, not as an ExceptionGroup: callers catch `Superseded`
                failed = exc
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        if not reply or self.state.done:
            return  # a cancel arrived (the inbox records it), or the run ended while the call was out
        await self.append(reply[0])

    def _admission(self, effect: kernel.CallModel) -> Admission:
        """The call's place at the endpoint (this actor's flow, the run's priority), the agent's budget,
        and each wait staged as `model.throttled` (written with what is staged next)."""
        async def throttled(t: Throttle) -> None:
            await self.append(ev.ModelThrottled(run_id=self.run_id, request_id=effect.id, turn=effect.turn,
                                                status=t.status, wait_s=t.wait_s, retry_after=t.retry_after,
                                                attempt=t.attempt, reason=t.reason))

        return Admission(Ticket(self.actor, self.priority), self.agent.budget, throttled)

    async def _dispatch(self, effect: kernel.CallTools) -> bool:
        """Dispatch each call not yet out (at most `max_concurrent` of this run's out), all at once.

        No call leaves before the reply holding it is in the log. Each call's `tool.called` (a record that
        the call was sent) is staged; when the reply is still staged too (the turn's first dispatch), the
        reply and the records go as one message before the calls leave: one round trip and one disk sync,
        the round trip the reply needed anyway. Otherwise (the reply is durable: calls sent after an
        approval, or as others finish) the calls leave first and their records are written while they
        travel: a runner killed between a call and its record is a case recovery handles anyway (the call,
        without a result, is sent again under the same id; an outcome found first gets `tool.called` in
        `_outcome`)."""
        reply_staged = bool(self.staged)
        progressed = False
        turn = self.state.turn
        calls: list[ToolCall] = []
        for call in effect.calls:
            if call.id in self.in_flight:
                continue
            if len(self.in_flight) + len(calls) >= effect.max_concurrent:
                break
            if turn is not None and call.id not in turn.called:
                await self.append(ev.ToolCalled(run_id=self.run_id, call=call))
                progressed = True
            calls.append(call)
        if reply_staged:
            await self._flush()
        if self.state.done:  # the log refused what was staged and the run ended: send out nothing
            return True
        if not calls:
            return progressed
        self._may_act(f"dispatch {len(calls)} tool call(s)")
        await self.ports.dispatch(self, calls, effect.deadline, self._flush)
        self.in_flight.update(call.id for call in calls)
        return progressed

    def _may_act(self, what: str) -> None:
        """Stop (`Superseded`) unless the ports say this process still owns the run (`Ports.may_act`):
        asked before each append, model request and dispatch, so a host that wakes from a pause past its
        lease stops at its first step, before its lease watch has run; the log's fence (`events.RunTaken`)
        refuses what a host whose clock cannot tell (one running slow) still tries to append."""
        if not self.ports.may_act(self):
            raise Superseded(f"run {self.run_id}: this host can no longer show it holds the run's partition; "
                             f"it does not {what}")

    # -- the log -----------------------------------------------------------------------------------------

    async def append(self, event: ev.Event) -> ev.Event:
        """Stamp one event (next seq, now unless it carries its own time, this actor), fold it and stage
        it; `_flush` writes it (see "Staged appends" in the module docstring)."""
        event = ev.stamp(event, seq=self.state.seq, ts=self.clock(), actor=self.actor)
        before, self.state = self.state, kernel.evolve(self.state, event)
        self.staged.add(event, before)
        return event

    async def flush(self) -> None:
        """Write what is staged now (see "Staged appends")."""
        await self._flush()

    async def _flush(self) -> None:
        await self.staged.flush(self._may_act, self._rejected)

    @property
    def last_seq(self) -> int:
        """The stream sequence of the run's last event written: what the next append expects."""
        return self.staged.last_seq

    async def _rejected(self, event: ev.Event, before: kernel.State, error: LogRejected) -> None:
        """The log can never take `event`: forget it and what was staged after it (the state goes back
        to before it) and end the run saying why, so the actor is free for its next task."""
        if isinstance(event, ev.RunFailed) and event.reason == "log_rejected":
            raise error  # not even the ending fits: nothing more this driver can do
        log.error("run %s: %s; the run fails", self.run_id, error)
        self.staged.drop()  # what waited for the dropped events waits for the ending instead
        self.state = before
        await self.append(ev.RunFailed(run_id=self.run_id, reason="log_rejected",
                                       detail=f"{ev.kind_of(event)} (seq {event.seq}) could not be recorded: "
                                              f"{error}"))


__all__ = ["RunDriver"]
