"""The one run driver in one process: the library path and the test bed.

    outcome = await run_task(Task(agent="calc", input="2+3?"), config,
                             client=ModelClient(...), adapter=get_adapter("qwen3"), tools=tools)
    outcome.output, outcome.status, outcome.events

Nothing here decides what a run does: `runtime.driver.run.RunDriver` does, exactly as on a host, over a log
in memory (`runtime.log.memory.MemoryRunLog`). This module is only the in-process ports: a tool call is
`Tool.execute` in a task of this process (its sandbox notes recorded in its outcome, as a worker ships them),
a run that waits on a timer or a question is waited for here (nothing to park it on), and a person is the
caller's `approver` / `answerer`, whose replies arrive at the driver as the same `Approve` / `Deny` / `Answer`
commands `sa approve` and `sa answer` send a host. So the events a run returns are what a host would have
written, and `kernel.fold(config, outcome.events)` reproduces the outcome.

Who answers in one process:
* an approval is asked of `approver(call)` (sync or async): None grants, a string denies with that reason.
  No approver: denied at once, since nobody can grant it in this process. Still silent at the approval
  rule's timeout or the deadline: the rule's verdict, or denied by `deadline`, as on a host.
* a question (`ask_human`, `runtime.questions`) is asked of `answerer(question, schema)` (sync or async):
  its answer is checked against the schema and recorded as `question.answered`, or, if it does not fit, the
  call fails with `input` saying what is wrong (code answering in-process cannot be asked again). No
  answerer: the call fails with `policy` at once. Still silent at the question's timeout: the bundle's
  default (or the `timeout` error); at the deadline the run fails, as on a host.

The injected `clock` stamps events (wall time by default); run ids are random unless given; a tool that
outlives the deadline is stopped and fails with `timeout`. If the caller cancels `run_task`, the run is
cancelled durably (`run.cancelled`) before the cancellation propagates.
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
from anyio.abc import TaskGroup

from runtime import events as ev
from runtime import kernel
from runtime.driver.ports import Driven, Inbound
from runtime.driver.run import RunDriver
from runtime.jobs import ToolOutcome
from runtime.log.memory import MemoryRunLog
from runtime.model import DecodingConstraint, ModelAdapter, ModelStep
from runtime.model.limits import DailyBudget
from runtime.types import ScriptNote, ToolCall, ToolError, ToolResult, Usage

if TYPE_CHECKING:
    from runtime.externals.provide import ToolSetup
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
    status: str  # completed | failed | cancelled
    output: Any
    reason: str | None
    usage: Usage
    events: list[ev.Event]

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass
class LocalModel:
    """The model side of a run in this process (on a host: `runtime.host.served.AgentRuntime`)."""

    step: ModelStep
    client: ModelClient
    budget: DailyBudget | None = None


async def _settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class LocalPorts:
    """The driver's ports in one process (see the module docstring); tasks run in the run's task group."""

    who = "loop"

    def may_act(self, driver: Driven) -> bool:
        return True  # one process, the only writer of its runs

    def __init__(self, group: TaskGroup, tools: Mapping[str, Tool], *, data: LocalData | None,
                 approver: Approver | None, answerer: Answerer | None, clock: Callable[[], float],
                 setups: Mapping[str, ToolSetup] | None = None) -> None:
        self.group, self.tools, self.data = group, tools, data
        self.approver, self.answerer, self.clock = approver, answerer, clock
        self.setups = setups or {}  # per tool: what a script's @external functions are bound to

    async def dispatch(self, driver: Driven, calls: Sequence[ToolCall], deadline: float | None,
                       flush: Callable[[], Awaitable[None]]) -> None:
        for call in calls:
            self.group.start_soon(self._call, driver, call, deadline)
        await flush()

    async def _call(self, driver: Driven, call: ToolCall, deadline: float | None) -> None:
        notes: list[ScriptNote] = []  # the sandbox's notes, recorded in the call's outcome
        result = await self._execute(driver, call, deadline, notes)
        driver.deliver(Inbound(ToolOutcome(run_id=driver.run_id, actor=driver.actor, call_id=call.id,
                                           tool=call.name, result=result, notes=tuple(notes),
                                           finished=self.clock())))

    def _timeout(self, deadline: float | None) -> AbstractContextManager[object]:
        return anyio.fail_after(max(deadline - self.clock(), 0.0)) if deadline is not None else nullcontext()

    async def _execute(self, driver: Driven, call: ToolCall, deadline: float | None,
                       notes: list[ScriptNote]) -> ToolResult:
        """One tool call as a value: a tool that raises or overruns the deadline still yields a result."""
        tool = self.tools.get(call.name)
        if tool is None:  # only the terminal tool may lack an implementation: it returns its arguments
            return ToolResult(output=dict(call.arguments))
        from runtime.tools import ToolContext  # the sandbox layer loads only when a tool actually runs

        files = self.data.files(call) if self.data is not None else {}
        context = ToolContext(run_id=driver.run_id, agent=driver.actor, call_id=call.id, files=dict(files),
                              on_event=notes.append)
        started = time.perf_counter()
        try:
            with self._timeout(deadline):
                externals = await self._externals(driver, tool, call, deadline, notes)
                if isinstance(externals, ToolError):
                    return ToolResult(error=externals)
                context.externals = externals
                result = await tool.execute(dict(call.arguments), context)
            if self.data is not None and result.ok:
                result = self.data.apply(call, result)
            return result
        except TimeoutError:
            return ToolResult.failure("timeout", f"{call.name} did not finish before the task's deadline",
                                      duration_ms=(time.perf_counter() - started) * 1000)
        except Exception as exc:  # Tool.execute must not raise; if it does, the model still gets a value
            return ToolResult.failure("crashed", f"{call.name} raised {type(exc).__name__}: {exc}",
                                      duration_ms=(time.perf_counter() - started) * 1000)

    async def _externals(self, driver: Driven, tool: Tool, call: ToolCall, deadline: float | None,
                         notes: list[ScriptNote]) -> dict[str, Callable[..., Any]] | ToolError | None:
        """A script's declared @external functions, from what its bundle grants it and the bundle's
        `externals:` factory, exactly as a worker binds them (`runtime.externals.provide`), unrecorded: in
        one process a call is never redelivered. None for a tool that declares none."""
        from runtime.externals import ExecutionContext, Secrets
        from runtime.externals.provide import provide
        from runtime.tools import ScriptTool

        if not isinstance(tool, ScriptTool) or not tool.script.externals:
            return None
        execution = ExecutionContext(agent=driver.actor.partition(":")[0], actor=driver.actor,
                                     run_id=driver.run_id, call_id=call.id, tool=call.name, deadline=deadline)

        def printed(text: str) -> None:
            notes.append(ScriptNote(kind="printed", ts=self.clock(), text=text, stream="external",
                                    script=call.name, call_id=call.id))

        provided = await provide(tool.script, call.name, self.setups.get(call.name), None, execution, None,
                                 Secrets(), printed)
        return provided if isinstance(provided, ToolError) else provided.externals

    async def awaiting(self, driver: Driven, asked: ev.ApprovalRequested | ev.QuestionAsked) -> None:
        if isinstance(asked, ev.ApprovalRequested):
            if self.approver is None:
                driver.deliver(Inbound(ev.Deny(run_id=driver.run_id, call_id=asked.call.id, by="approver",
                                               reason="no approver is configured for this in-process run")))
            else:
                self.group.start_soon(self._approve, driver, asked.call)
        elif self.answerer is None:
            driver.deliver(Inbound(ev.ToolFailed(
                run_id=driver.run_id, call_id=asked.call_id, tool="ask_human",
                error=ToolError("policy", "no answerer is configured for this in-process run: nobody can "
                                          "answer"))))
        else:
            self.group.start_soon(self._answer, driver, asked)

    async def _approve(self, driver: Driven, call: ToolCall) -> None:
        assert self.approver is not None
        verdict = await _settled(self.approver(call))
        item: ev.Approve | ev.Deny = (ev.Approve(run_id=driver.run_id, call_id=call.id, by="approver")
                                      if verdict is None else
                                      ev.Deny(run_id=driver.run_id, call_id=call.id, reason=verdict,
                                              by="approver"))
        driver.deliver(Inbound(item))

    async def _answer(self, driver: Driven, asked: ev.QuestionAsked) -> None:
        from runtime.validate import validate

        assert self.answerer is not None
        answer = await _settled(self.answerer(asked.question, asked.schema))
        errors = validate(answer, asked.schema) if asked.schema else []
        if errors:
            problem = f"the answer {answer!r} does not fit the question's schema: {'; '.join(errors)}"
            failed = ev.ToolFailed(run_id=driver.run_id, call_id=asked.call_id, tool="ask_human",
                                   error=ToolError("input", problem))
            driver.deliver(Inbound(failed))
        else:
            driver.deliver(Inbound(ev.Answer(run_id=driver.run_id, call_id=asked.call_id, answer=answer,
                                             by="answerer")))

    async def park(self, driver: Driven) -> bool:
        return False  # nothing outside this process holds wake-ups: the driver waits here

    async def ended(self, driver: Driven) -> None:
        return None  # the run's task group stops what is still running (`run_task`)


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
    setups: Mapping[str, ToolSetup] | None = None,
    dialect: str = "vllm",
) -> RunOutcome:
    """Run one task to its end in this process and return the outcome with its full event log.

    `tools` are `runtime.tools.Tool`s; every tool in `config.tools` needs one, except the terminal tool,
    which without an implementation simply returns its arguments as the run's output. `constraint` is a
    `runtime.model.DecodingConstraint` (None: no decoding constraint; the openai family still
    gets `tools=`). `on_event` (sync or async) sees each event once it is in the log, in order. `data` gives
    each call its files and persists a successful call's writes (`runtime.driver.local.LocalData`), as a
    bundle's data provider and result handler do on a worker. `budget` is the agent's tokens per day
    (`runtime.model.limits.DailyBudget`): checked before each model call, charged after it. `approver` and
    `answerer` answer for a person (see the module docstring). `setups` binds each script's @external
    functions (`Bundle.setup_for`: its grants and the bundle's `externals:` factory). `dialect` is the model
    server's request dialect (`runtime.model.dialects`), as on a host.
    """
    by_name = {t.schema.name: t for t in tools}
    own = {*config.timers, *(("ask_human",) if config.questions is not None else ())}
    missing = [  # the terminal tool may return its arguments; a timer or a question is the driver's own
        s.name for s in config.tools
        if s.name not in by_name and s.name != config.terminal_tool and s.name not in own
    ]
    if missing:
        raise ValueError(f"the config offers tools with no implementation: {', '.join(missing)}")
    step = ModelStep.for_config(adapter, config, constraint, dialect=dialect)  # a bad constraint fails here
    run_id = run_id or uuid.uuid4().hex[:12]
    log = MemoryRunLog()
    async with anyio.create_task_group() as group:
        ports = LocalPorts(group, by_name, data=data, approver=approver, answerer=answerer, clock=clock,
                           setups=setups)
        driver: RunDriver[LocalModel] = RunDriver(log, LocalModel(step, client, budget), ports, task.agent,
                                                  run_id, state=kernel.initial(config), last_seq=0,
                                                  on_event=on_event, clock=clock)
        await driver.append(ev.RunStarted(run_id=run_id, input=task.input, task_id=task.task_id,
                                          instance=task.instance, timeout_s=task.timeout_s,
                                          metadata=dict(task.metadata), bundle_digest=bundle_digest))
        try:
            state = await driver.run()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if not driver.state.done:
                    await driver.cancel("the caller cancelled the run", "loop")
            raise
        group.cancel_scope.cancel()  # an approver or answerer still asked, a call the deadline outran
    events = (await log.read(run_id)).events
    return RunOutcome(run_id=run_id, status=state.status, output=state.output, reason=state.reason,
                      usage=state.usage, events=events)


__all__ = ["Answerer", "Approver", "LocalData", "LocalModel", "LocalPorts", "OnEvent", "RunOutcome",
           "run_task"]
