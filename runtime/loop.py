"""The kernel driven in one process: the library path and the test bed.

    outcome = await run_task(Task(agent="calc", input="2+3?"), config,
                             client=ModelClient(...), adapter=get_adapter("qwen3"), tools=tools)
    outcome.output, outcome.status, outcome.events

This module is an effect runner, nothing more: it asks `kernel.decide` what is pending, performs it
(model calls through an adapter and a client, tool calls through `Tool.execute`), appends the events
that record what happened and folds them back with `kernel.evolve`. It holds no run state of its own
beyond the folded `State`, so the events it returns are exactly what the NATS host would have written,
and `kernel.fold(config, outcome.events)` reproduces the outcome.

Where the impure facts come from: `ts` is the injected `clock` (wall time by default), run ids are
random unless given, and deadlines are enforced with anyio timeouts so a hung model or tool cannot
outlive the task; the kernel then sees the timed-out call's event past the deadline and fails the run.

Effects of one `decide` are performed in order, each to completion (the tool calls inside one
`CallTools` run concurrently, at most `max_concurrent` at a time). A call's sandbox notes are gathered while
it runs and recorded in its `tool.completed`/`tool.failed` (`events.outcome_events`), as a host records a
worker's outcome, so `on_event` sees a script run when its call ends, not note by note. An approval is
asked of `approver` (no approver: denied, since nobody can grant it in-process; an approver still silent at
the deadline: denied by `deadline`). A question (`ask_human`, `runtime.questions`) is asked of `answerer`,
which returns the answer (sync or async): it is checked against the question's schema and recorded as
`question.answered`, or, if it does not fit, the call fails with `input` and what is wrong (code answering
in-process cannot be asked again). No answerer: the call fails with `policy` at once, since nobody can
answer in this process. An answerer still silent at the question's timeout gives the bundle's default (or
the `timeout` error), at the deadline the run fails, as on a host. If the caller cancels `run_task`, a
`run.cancelled` event is appended before the cancellation propagates.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import msgspec

from runtime import events as ev
from runtime import kernel
from runtime.model import DecodingConstraint, ModelAdapter, ModelStep
from runtime.model.limits import DailyBudget, Throttle, Ticket
from runtime.model.step import Admission
from runtime.types import ScriptNote, ToolCall, ToolError, ToolResult, Usage

if TYPE_CHECKING:
    from runtime.model.client import ModelClient
    from runtime.tools import Tool

class LocalData(Protocol):
    """Data in and out of a tool call in one process: the files it reads, and what its result writes."""

    def files(self, call: ToolCall) -> Mapping[str, str | bytes]: ...

    def apply(self, call: ToolCall, result: ToolResult) -> ToolResult: ...


OnEvent = Callable[[ev.Event], Awaitable[None] | None]
Approver = Callable[[ToolCall], Awaitable[str | None] | str | None]  # None grants; a string denies with it
Answerer = Callable[[str, dict[str, Any] | None], Any]  # (question, answer schema) -> answer (or awaitable)


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, and the complete event log that proves it."""

    run_id: str
    status: str  # completed | failed | cancelled (or running, if it stopped waiting for an approval)
    output: Any
    reason: str | None
    usage: Usage
    events: list[ev.Event]

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class _Runner:
    """One run's effect runner: appends events one at a time and keeps the folded state."""

    def __init__(
        self,
        config: kernel.KernelConfig,
        run_id: str,
        agent: str,
        *,
        client: ModelClient,
        adapter: ModelAdapter,
        tools: Sequence[Tool],
        on_event: OnEvent | None,
        constraint: DecodingConstraint | None,
        approver: Approver | None,
        clock: Callable[[], float],
        data: LocalData | None = None,
        budget: DailyBudget | None = None,
        answerer: Answerer | None = None,
    ) -> None:
        self.data, self.budget, self.answerer = data, budget, answerer
        self.config, self.run_id, self.agent = config, run_id, agent
        self.client, self.adapter, self.on_event, self.approver, self.clock = (
            client,
            adapter,
            on_event,
            approver,
            clock,
        )
        self.tools = {t.schema.name: t for t in tools}
        own = {*config.timers, *(("ask_human",) if config.questions is not None else ())}
        missing = [  # the terminal tool may return its arguments; a timer or a question is the runner's own
            s.name for s in config.tools
            if s.name not in self.tools and s.name != config.terminal_tool and s.name not in own
        ]
        if missing:
            raise ValueError(f"the config offers tools with no implementation: {', '.join(missing)}")
        self.step = ModelStep.for_config(adapter, config, constraint)  # a bad constraint fails here
        self.state = kernel.initial(config)
        self.events: list[ev.Event] = []
        self.lock = anyio.Lock()

    async def emit(self, event: ev.Event) -> ev.Event:
        """Append one event: stamp it (next seq, a timestamp, the actor), fold it, publish it. Serialised,
        so seq order is log order."""
        async with self.lock:
            event = ev.stamp(event, seq=self.state.seq, ts=self.clock(), actor=self.agent)
            self.state = kernel.evolve(self.state, event)
            self.events.append(event)
            if self.on_event is not None:
                result = self.on_event(event)
                if inspect.isawaitable(result):
                    await result
            return event

    def _timeout(self, deadline: float | None) -> AbstractContextManager[object]:
        return anyio.fail_after(max(deadline - self.clock(), 0.0)) if deadline is not None else nullcontext()

    async def drive(self) -> None:
        while True:
            effects = kernel.decide(self.state)
            if not effects and not await self.sleep():
                return
            for effect in effects:
                await self.perform(effect)

    async def sleep(self) -> bool:
        """In one process a timer (`runtime.timers`) is a plain wait: until the first pending one is due,
        then `timer.fired`; False if no timer is pending. Its due time is never past the deadline."""
        timers = kernel.pending_timers(self.state)
        if not timers:
            return False
        call_id, due = timers[0]
        await anyio.sleep(max(due - self.clock(), 0.0))
        await self.emit(ev.TimerFired(run_id=self.run_id, call_id=call_id, by="loop"))
        return True

    async def perform(self, decision: kernel.Decision) -> None:
        match decision:
            case kernel.CallModel():
                await self.call_model(decision)
            case kernel.CallTools():
                await self.call_tools(decision)
            case ev.ApprovalRequested():
                await self.emit(decision)
                await self.ask_approval(decision.call)
            case ev.QuestionAsked():
                await self.emit(decision)
                await self.ask_question(decision)
            case _:  # an event the kernel settled on by itself
                await self.emit(decision)

    async def call_model(self, effect: kernel.CallModel) -> None:
        await self.emit(self.step.requested(effect, self.run_id, self.client))
        left = effect.deadline - self.clock() if effect.deadline is not None else None

        async def throttled(t: Throttle) -> None:  # a 429/503 retried, or a wait for the daily budget
            await self.emit(ev.ModelThrottled(run_id=self.run_id, request_id=effect.id, turn=effect.turn,
                                              status=t.status, wait_s=t.wait_s, retry_after=t.retry_after,
                                              attempt=t.attempt, reason=t.reason))

        admission = Admission(Ticket(self.agent), self.budget, throttled)
        await self.emit(await self.step.call(self.client, effect, self.run_id, timeout=left,
                                             admission=admission))

    async def call_tools(self, effect: kernel.CallTools) -> None:
        for call in effect.calls:
            await self.emit(ev.ToolCalled(run_id=self.run_id, call=call))
        limiter = anyio.CapacityLimiter(effect.max_concurrent)

        async def one(call: ToolCall) -> None:
            notes: list[ScriptNote] = []  # the sandbox's notes, recorded in the call's outcome
            async with limiter:
                result = await self.execute(call, effect.deadline, notes)
            for event in ev.outcome_events(self.run_id, call.id, call.name, result, notes):
                await self.emit(event)

        async with anyio.create_task_group() as group:
            for call in effect.calls:
                group.start_soon(one, call)

    async def execute(self, call: ToolCall, deadline: float | None, notes: list[ScriptNote]) -> ToolResult:
        """One tool call as a value: a tool that raises or overruns the deadline still yields a result.
        What the sandbox reports while it runs goes to `notes`, as a tool worker ships it in its outcome."""
        tool = self.tools.get(call.name)
        if tool is None:  # only the terminal tool may lack an implementation: it returns its arguments
            return ToolResult(output=dict(call.arguments))
        from runtime.tools import ToolContext  # the sandbox layer loads only when a tool actually runs

        files = self.data.files(call) if self.data is not None else {}
        context = ToolContext(
            run_id=self.run_id, agent=self.agent, call_id=call.id, files=dict(files),
            on_event=notes.append,
        )
        started = time.perf_counter()
        try:
            with self._timeout(deadline):
                result = await tool.execute(dict(call.arguments), context)
            if self.data is not None and result.ok:
                result = self.data.apply(call, result)
            return result
        except TimeoutError:
            return ToolResult.failure(
                "timeout",
                f"{call.name} did not finish before the task's deadline",
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        except Exception as exc:  # Tool.execute must not raise; if it does, the model still gets a value
            return ToolResult.failure(
                "crashed",
                f"{call.name} raised {type(exc).__name__}: {exc}",
                duration_ms=(time.perf_counter() - started) * 1000,
            )

    async def ask_approval(self, call: ToolCall) -> None:
        """Ask the approver (the request is recorded), but no longer than the task's deadline: the kernel
        only sees time pass through events, so a run waiting on a silent approver would never fail. As the
        NATS host does, a deadline that passes while waiting denies the call (`by="deadline"`) and the next
        `decide` ends the run."""
        by = "approver"
        if self.approver is None:
            verdict: str | None = "no approver is configured for this in-process run"
        else:
            try:
                with self._timeout(self.state.deadline):
                    answer = self.approver(call)
                    verdict = await answer if inspect.isawaitable(answer) else answer
            except TimeoutError:
                verdict, by = "the task's deadline passed", "deadline"
        if verdict is None:
            await self.emit(ev.ApprovalGranted(run_id=self.run_id, call_id=call.id, by=by))
        else:
            await self.emit(ev.ApprovalDenied(run_id=self.run_id, call_id=call.id, reason=verdict, by=by))


    async def ask_question(self, asked: ev.QuestionAsked) -> None:
        """Ask the answerer, no longer than the question's timeout or the task's deadline (see the module
        docstring); record its answer, or what the timeout or the deadline gives."""
        from runtime.questions import wake_at
        from runtime.validate import validate

        fail: ToolError | None = ToolError("policy", "no answerer is configured for this in-process run: "
                                                     "nobody can answer")
        answer: Any = None
        if self.answerer is not None:
            opened = next(q for c, q in kernel.pending_questions(self.state) if c.id == asked.call_id)
            until = wake_at(opened, self.state.deadline)
            try:
                with anyio.fail_after(max(until - self.clock(), 0.0)) if until is not None else nullcontext():
                    answer = self.answerer(asked.question, asked.schema)
                    answer = await answer if inspect.isawaitable(answer) else answer
            except TimeoutError:
                await self.timed_out(asked.call_id, until)
                return
            errors = validate(answer, asked.schema) if asked.schema else []
            problem = f"the answer {answer!r} does not fit the question's schema: {'; '.join(errors)}"
            fail = ToolError("input", problem) if errors else None
        if fail is not None:
            await self.emit(ev.ToolFailed(run_id=self.run_id, call_id=asked.call_id, tool="ask_human",
                                          error=fail))
        else:
            await self.emit(ev.QuestionAnswered(run_id=self.run_id, call_id=asked.call_id, answer=answer,
                                                by="answerer"))

    async def timed_out(self, call_id: str, at: float | None) -> None:
        """The question of `call_id` was not answered by `at`: its timeout's verdict (stamped at the time it
        is judged by, as `verify` checks), or past the deadline a `timeout` failure the run then ends on."""
        at = max(self.clock(), at or 0.0)
        if self.state.deadline is not None and at >= self.state.deadline:
            await self.emit(ev.ToolFailed(run_id=self.run_id, call_id=call_id, tool="ask_human",
                                          error=ToolError("timeout", "no answer before the task's deadline")))
            return
        for verdict in kernel.expire(self.state, at):
            if isinstance(verdict, ev.QuestionAnswered | ev.ToolFailed) and verdict.call_id == call_id:
                await self.emit(msgspec.structs.replace(verdict, ts=at))


async def run_task(
    task: ev.Task,
    config: kernel.KernelConfig,
    *,
    client: ModelClient,
    adapter: ModelAdapter,
    tools: Sequence[Tool],
    on_event: OnEvent | None = None,
    constraint: DecodingConstraint | None = None,
    approver: Approver | None = None,
    run_id: str | None = None,
    bundle_digest: str = "",
    clock: Callable[[], float] = time.time,
    data: LocalData | None = None,
    budget: DailyBudget | None = None,
    answerer: Answerer | None = None,
) -> RunOutcome:
    """Run one task to its end in this process and return the outcome with its full event log.

    `tools` are `runtime.tools.Tool`s; every tool in `config.tools` needs one, except the terminal tool,
    which without an implementation simply returns its arguments as the run's output. `constraint` is a
    `runtime.model.DecodingConstraint` (None: no decoding constraint; the openai family still
    gets `tools=`). `on_event` (sync or async) sees each event as it is appended, in order. `data` gives
    each call its files and persists a successful call's writes (`runtime.loop.LocalData`), as a
    bundle's data provider and result handler do on a worker. `budget` is the agent's tokens per day
    (`runtime.model.limits.DailyBudget`): checked before each model call, charged after it. `answerer`
    answers the questions the model asks (`ask_human`: question, schema -> answer; see the module docstring).
    """
    runner = _Runner(config, run_id or uuid.uuid4().hex[:12], task.agent, client=client, adapter=adapter,
                     tools=tools, on_event=on_event, constraint=constraint, approver=approver, clock=clock,
                     data=data, budget=budget, answerer=answerer)
    await runner.emit(ev.RunStarted(run_id=runner.run_id, input=task.input, task_id=task.task_id,
                                    instance=task.instance, timeout_s=task.timeout_s,
                                    metadata=dict(task.metadata), bundle_digest=bundle_digest))
    try:
        await runner.drive()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            if not runner.state.done:
                await runner.emit(ev.RunCancelled(run_id=runner.run_id, reason="the caller cancelled the run",
                                                  by="loop"))
        raise
    state = runner.state
    return RunOutcome(run_id=runner.run_id, status=state.status, output=state.output, reason=state.reason,
                      usage=state.usage, events=list(runner.events))


__all__ = ["Answerer", "Approver", "OnEvent", "RunOutcome", "run_task"]
