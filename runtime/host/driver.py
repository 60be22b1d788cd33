"""One run, driven: the host's effect runner for the kernel (the distributed twin of `runtime.loop`).

    state = fold(events)          # a new run: just `run.started`; a recovered run: its whole log
    loop:  apply what arrived     # tool outcomes, cancel / approve / deny commands
           effects = decide(state)
           perform them           # model calls here; tool calls as jobs on TOOLS; endings
           nothing to perform? -> wait for the inbox (or the deadline)

Every event goes through `append`: the next `seq`, `Nats-Msg-Id = <run>/<seq>`, and the expected last
stream sequence of the run's subjects (`bus.occ_headers`). So the driver is the single writer of its run
(DESIGN rule 4): if another host appended in between, the append fails with 10071 and this driver stops
(`Superseded`) instead of writing a second branch. A retried append whose first attempt did land is
recognised (its Msg-Id is already the run's last) and not written twice.

What is never done twice (the recovery contract of `runtime.kernel`):
* a model call whose reply is in the log (`decide` does not return it); a `model.requested` already
  recorded for the current attempt is not recorded again, the call is simply made;
* a tool job: re-published with the same Msg-Id `<run>/<call>` (deduplicated by TOOLS within its window;
  beyond it the workers' `applied` markers keep writes exactly-once), and `tool.called` is recorded once;
* an outcome: a second outcome for a call that already has a result is acked and dropped without an
  event (the kernel would ignore it anyway; the log stays clean).

A RESULTS message is acked only after its events are appended: a host killed in between gets it again.

Staged appends (why a turn costs few round trips)
------------------------------------------------
`append` folds the event at once and stages it; `_flush` writes what is staged, in order, each event with
its OCC expectation (one writer, no gap, no fork: exactly as one-by-one appends). Nothing leaves the
process on the strength of a staged event: the driver flushes before a tool job is published (its
`tool.called` is durable first), before a RESULTS or command message is acked, before it waits, and when
the run ends. The one overlap is the model call: the events before it (an outcome's `script.*`/`tool.*`,
`turn.completed`, `model.requested`) are appended *while* the request is in flight, and `model.responded`
is staged only after both finished. A host killed during that window has not recorded the reply, so the
restarted host makes the call again, which the recovery contract allows (only recorded steps are never
repeated); a driver that turns out to be superseded cancels its call.

Why not one atomic batch per group (`Nats-Batch-*`, server 2.12+): an R1 file-backed stream syncs every
atomic batch to disk on commit; measured here that is ~5 ms per batch, serialised server-wide (~250
batches/s with 100 writers), against ~0.25 ms for a plain OCC append. Events stay one message each.

Big payloads: each event is offloaded (`Payloads.offload_event`) as it is written, so the log holds a
`PayloadRef` while the state folds the full value; an outcome whose output is in the object store is
resolved (`resolve_outcome`) before its events are made, because the model's next prompt needs it.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError

from runtime import events as ev
from runtime import kernel
from runtime import nats as bus
from runtime.host.agent import AgentRuntime
from runtime.jobs import ToolJob, ToolOutcome
from runtime.payloads import Payloads
from runtime.types import ToolError

log = logging.getLogger("runtime.host")

APPEND_RETRY_S = 0.25


class Superseded(RuntimeError):
    """Another writer appended to this run (rule 4): this driver must stop."""


@dataclass
class Inbound:
    """Something for a run from outside: a tool outcome or a command, with the message to ack after."""

    item: ToolOutcome | ev.Cancel | ev.Approve | ev.Deny
    msg: Msg | None = None


class RunDriver:
    """Drives one run to its end (see the module docstring). Created by an actor; fed by the host."""

    def __init__(self, js: JetStreamContext, agent: AgentRuntime, actor: str, run_id: str, partition: int,
                 *, state: kernel.State, last_seq: int, on_event: Callable[[ev.Event], Any] | None = None,
                 clock: Callable[[], float] = time.time, payloads: Payloads | None = None) -> None:
        self.js, self.agent, self.actor, self.run_id, self.partition = js, agent, actor, run_id, partition
        self.state, self.last_seq = state, last_seq
        self.task_id: str | None = None  # for the runs index
        self.on_event, self.clock = on_event, clock
        self.payloads = payloads or payloads_for(js)
        self.inbox: deque[Inbound] = deque()
        self._wake = anyio.Event()
        self.in_flight: set[str] = set()  # call ids whose job this driver published and that have no result
        self._model_scope: anyio.CancelScope | None = None
        self._cancelling = False
        self._staged: deque[ev.Event] = deque()  # folded, not yet in the log (see "Staged appends")
        self._acks: list[Any] = []  # messages to ack once everything staged before them is in the log

    # -- fed by the host ---------------------------------------------------------------------------------

    def deliver(self, item: Inbound) -> None:
        self.inbox.append(item)
        if isinstance(item.item, ev.Cancel):
            self._cancelling = True
            if self._model_scope is not None:
                self._model_scope.cancel()  # a cancel must not wait for a slow model
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self) -> kernel.State:
        """Drive until the run is over; returns the final state. Raises `Superseded` on a lost OCC race."""
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
                await self._wait()
        await self._drain_inbox()  # ack whatever arrived for a run that is over
        await self._flush()
        return self.state

    async def _wait(self) -> None:
        """Block until something arrives; at the deadline, record why the pending work timed out."""
        await self._flush()
        if self.inbox:
            return
        self._wake = anyio.Event()
        deadline = self.state.deadline
        if deadline is None:
            await self._wake.wait()
            return
        with anyio.move_on_after(max(deadline - self.clock(), 0.0)):
            await self._wake.wait()
            return
        await self._deadline_passed()

    async def _deadline_passed(self) -> None:
        """Give the kernel an event past the deadline: the calls still out fail with `timeout`; a call
        waiting for an approver is denied. The next `decide` then ends the run with `deadline`."""
        turn = self.state.turn
        if turn is None:
            return
        for call in turn.calls:
            if call.id in turn.results:
                continue
            if call.id in self.in_flight or call.id in turn.called:
                await self.append(ev.ToolFailed, call_id=call.id, tool=call.name, error=ToolError(
                    "timeout", f"{call.name} did not finish before the task's deadline"))
                self.in_flight.discard(call.id)
            elif call.id in turn.approvals_requested and call.id not in turn.approvals:
                await self.append(ev.ApprovalDenied, call_id=call.id, reason="the task's deadline passed",
                                  by="deadline")

    async def _drain_inbox(self) -> None:
        """Apply what arrived; each message is acked after the next flush (its events are then durable).
        A message whose apply fails is not acked: it is redelivered (to whoever owns the run then)."""
        while self.inbox:
            item = self.inbox.popleft()
            await self._apply(item.item)
            if item.msg is not None:
                self._acks.append(item.msg)

    async def _apply(self, item: Any) -> None:
        state = self.state
        if isinstance(item, ToolOutcome):
            self.in_flight.discard(item.call_id)
            turn = state.turn
            if state.done or turn is None or turn.call(item.call_id) is None or item.call_id in turn.results:
                log.debug("run %s: outcome of %s changes nothing (duplicate or stale)", self.run_id,
                          item.call_id)
                return
            item = await self.payloads.resolve_outcome(item)  # the next prompt needs the real output
            for event in item.events(state.seq):
                fields = {f: getattr(event, f) for f in event.__struct_fields__
                          if f not in ("run_id", "seq", "ts", "agent", "v")}
                await self.append(type(event), ts=event.ts, **fields)
        elif isinstance(item, ev.Cancel):
            self._cancelling = False
            if not state.done:
                await self.append(ev.RunCancelled, reason=item.reason or "cancelled", by=item.by or "command")
        elif isinstance(item, ev.Approve | ev.Deny):
            turn = state.turn
            if state.done or turn is None or item.call_id not in turn.approvals_requested or \
                    item.call_id in turn.approvals:
                log.info("run %s: %s for %s changes nothing", self.run_id, type(item).__name__, item.call_id)
                return
            if isinstance(item, ev.Approve):
                await self.append(ev.ApprovalGranted, call_id=item.call_id, by=item.by)
            else:
                await self.append(ev.ApprovalDenied, call_id=item.call_id, reason=item.reason, by=item.by)

    # -- effects -----------------------------------------------------------------------------------------

    async def _perform(self, effect: kernel.Effect) -> bool:
        """Perform one effect; True if it appended something (the state moved)."""
        match effect:
            case kernel.CallModel():
                await self._call_model(effect)
                return True
            case kernel.CallTools():
                return await self._dispatch(effect)
            case kernel.DenyCall():
                await self.append(ev.ToolFailed, call_id=effect.call.id, tool=effect.call.name,
                                  error=effect.error)
            case kernel.RequestApproval():
                await self.append(ev.ApprovalRequested, call=effect.call)
            case kernel.EndTurn():
                await self.append(ev.TurnCompleted, turn=effect.turn, calls_ok=effect.calls_ok,
                                  calls_failed=effect.calls_failed)
            case kernel.Complete():
                await self.append(ev.RunCompleted, output=effect.output)
            case kernel.Fail():
                await self.append(ev.RunFailed, reason=effect.reason, detail=effect.detail)
        return True

    async def _call_model(self, effect: kernel.CallModel) -> None:
        """Call the model while what is staged (ending with `model.requested`) is written; then stage
        the reply. A lost OCC race cancels the call (the task group) and raises `Superseded`."""
        turn = self.state.turn
        if not (turn is not None and turn.requested):  # recovered after `model.requested`: don't record twice
            await self.append(ev.ModelRequested, **self.agent.step.requested(effect))
        left = effect.deadline - self.clock() if effect.deadline is not None else None
        reply: list[tuple[type[ev.Event], dict[str, Any]]] = []

        async def call() -> None:
            if self._cancelling:  # a cancel arrived before this task started
                return
            with anyio.CancelScope() as scope:
                self._model_scope = scope
                try:
                    reply.append(await self.agent.step.call(self.agent.client, effect, self.run_id,
                                                            timeout=left))
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
        if not reply:
            return  # a cancel arrived: the inbox records it
        cls, fields = reply[0]
        await self.append(cls, **fields)

    async def _dispatch(self, effect: kernel.CallTools) -> bool:
        """Publish a job for each call not yet out, keeping at most `max_concurrent` of this run's out:
        every `tool.called` first (staged, then flushed: a job never goes out before its call is in the
        log), then the jobs all at once (one round trip for a turn's parallel calls, not one each)."""
        progressed = False
        turn = self.state.turn
        jobs: list[ToolJob] = []
        for call in effect.calls:
            if call.id in self.in_flight:
                continue
            if len(self.in_flight) + len(jobs) >= effect.max_concurrent:
                break
            if turn is not None and call.id not in turn.called:
                await self.append(ev.ToolCalled, call=call)
                progressed = True
            jobs.append(ToolJob(run_id=self.run_id, agent=self.actor, call_id=call.id, tool=call.name,
                                arguments=dict(call.arguments), partition=self.partition,
                                limits=self._job_limits(call.name), workspace=self.agent.bundle.workspace,
                                deadline=effect.deadline, tool_digest=self.agent.tool_digest(call.name)))
        if not jobs:
            return progressed
        await self._flush()
        if len(jobs) == 1:
            await self._publish_job(jobs[0])
        else:
            try:
                async with anyio.create_task_group() as tg:
                    for job in jobs:
                        tg.start_soon(self._publish_job, job)
            except ExceptionGroup as group:  # a rejected job (not an outage): the error itself, not a group
                raise group.exceptions[0] from None
        self.in_flight.update(job.call_id for job in jobs)
        return progressed

    def _job_limits(self, tool: str) -> dict[str, Any]:
        """`AgentRuntime.job_limits`, computed once per tool and agent (a pydantic dump per job otherwise)."""
        cache = _LIMITS.setdefault(id(self.agent), (self.agent, {}))[1]
        limits = cache.get(tool)
        if limits is None:
            limits = cache[tool] = self.agent.job_limits(tool)
        return limits

    async def _publish_job(self, job: ToolJob) -> None:
        while True:
            try:
                await self.js.publish(job.subject, job.encode(), headers=job.headers())
                return
            except BadRequestError:
                raise
            except Exception as e:  # NATS unavailable (leader election, reconnect): same Msg-Id, retry
                log.warning("run %s: publishing job %s failed (%s); retrying", self.run_id, job.msg_id, e)
                await anyio.sleep(APPEND_RETRY_S)

    # -- the log -----------------------------------------------------------------------------------------

    async def append(self, cls: type, *, ts: float | None = None, **fields: Any) -> ev.Event:
        """Stage one event and fold it; `_flush` writes it (see "Staged appends" in the module docstring)."""
        event = cls(run_id=self.run_id, seq=self.state.seq, ts=self.clock() if ts is None else ts,
                    agent=self.actor, **fields)
        self.state = kernel.evolve(self.state, event)
        self._staged.append(event)
        return event

    async def _flush(self) -> None:
        """Write every staged event in order as the run's single writer, then ack what waited for them."""
        while self._staged:
            event = self._staged[0]
            self.last_seq = await append_event(self.js, self.actor, self.run_id, self.last_seq, event,
                                               payloads=self.payloads)
            self._staged.popleft()
            if self.on_event is not None:
                self.on_event(event)
        if self._acks:
            acks, self._acks = self._acks, []
            for msg in acks:
                await _ack(msg)


# job limits per agent runtime (keyed by id, the runtime kept alive beside it) and tool
_LIMITS: dict[int, tuple[AgentRuntime, dict[str, dict[str, Any]]]] = {}
_PAYLOADS: weakref.WeakKeyDictionary[JetStreamContext, Payloads] = weakref.WeakKeyDictionary()


def payloads_for(js: JetStreamContext) -> Payloads:
    """One `Payloads` per JetStream context (its object store handle is opened once, on first use)."""
    payloads = _PAYLOADS.get(js)
    if payloads is None:
        payloads = _PAYLOADS[js] = Payloads(js)
    return payloads


async def append_event(js: JetStreamContext, actor: str, run_id: str, last_seq: int, event: ev.Event, *,
                       payloads: Payloads | None = None) -> int:
    """Append `event` to its run expecting `last_seq` as the run's last stream sequence; return the new one.

    A big field goes to the object store first (`payloads`, default: this context's); the message carries
    the ref. Retries through NATS outages with the same Msg-Id and expectation (idempotent); raises
    `Superseded` when another writer got there first.
    """
    msg_id = f"{run_id}/{event.seq}"
    subject = bus.event_subject(actor, run_id, ev.kind_of(event))
    data = ev.encode(event)
    if type(event) in ev.PAYLOAD_FIELDS:
        payloads = payloads or payloads_for(js)
        if payloads.is_big(data):  # the whole event is small (the common case): its big field is too
            data = ev.encode(await payloads.offload_event(event))
    headers = bus.occ_headers(actor, run_id, last_seq, msg_id)
    while True:
        try:
            ack = await js.publish(subject, data, headers=headers)
            return ack.seq
        except BadRequestError as e:
            if e.err_code != bus.ERR_WRONG_LAST_SEQUENCE:
                raise
            landed = await _last_of_run(js, actor, run_id)
            if landed is not None and landed[1] == msg_id:
                return landed[0]  # our own earlier attempt landed; its ack was lost
            raise Superseded(f"run {run_id}: another writer appended (expected last sequence {last_seq})") \
                from None
        except Exception as e:  # timeouts, no responders during an election, reconnects
            log.warning("run %s: append of seq %d failed (%s: %s); retrying", run_id, event.seq,
                        type(e).__name__, e)
            await anyio.sleep(APPEND_RETRY_S)


async def _last_of_run(js: JetStreamContext, actor: str, run_id: str) -> tuple[int, str] | None:
    try:
        msg = await js.get_last_msg(bus.EVENTS, bus.run_events_filter(actor, run_id), direct=True)
    except NotFoundError:
        return None
    return msg.seq, (msg.headers or {}).get(bus.HDR_MSG_ID, "")


async def _ack(msg: Msg) -> None:
    try:
        await msg.ack()
    except Exception as e:  # the connection dropped: the message is redelivered and found a no-op
        log.debug("ack failed: %s", e)


__all__ = ["Inbound", "RunDriver", "Superseded", "append_event", "payloads_for"]
