"""The run driver's ports for a regression: what the source run recorded is served, nothing touches the world.

    ports = RegressPorts(group, tools, recorded, rules, data=scratch_workspace(static_files), clock=time.time)

`runtime.driver.run.RunDriver` drives a regression run exactly as any other; only where its effects go
differs, and these ports decide it:

* a tool call the source made too (same tool, arguments equal after canonicalisation: `Recorded`) gets the
  source's recorded outcome, with the script run it recorded, as if the tool had just answered;
* a call with no recorded match follows its tool's `Rule`:
  - `run`: run it here, as one process runs it (`runtime.driver.local.LocalPorts`), reading and writing the
    regression's own scratch workspace (`scratch_workspace`): its writes land there and are never applied
    anywhere else. A script's `@external` functions answer with an error instead of reaching the world (an
    external is a door to the world, and nothing recorded what it said to these arguments). The default for
    `.pym` scripts only, which are pure: data in, result out;
  - `error`: the call fails (`policy`) saying no recorded result exists; the model sees that and goes on.
    The default for Python tools, MCP tools and agents called as tools;
  - `diverge`: the run stops there (`run.cancelled` by `regression`, the call's own failure saying why), and
    the report calls it diverged;
* an approval the source asked for the same call gets the source's verdict (by whom it was given, with the
  arguments an approver edited); a question the source asked in the same words gets its recorded answer.
  A new one is denied / fails saying no recorded verdict or answer exists, or stops the run (`diverge`).

Timers wait here, in real time (nothing parks a regression run): a run that sleeps for an hour takes one.

Why a subclass of `LocalPorts` and not ports of their own: a call that runs in a regression runs exactly as in
one process (the same sandbox, notes, deadline and data handling), so only what differs is written here: the
recorded results, the rules, the refusing externals, the recorded verdicts and answers.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from anyio.abc import TaskGroup

from runtime import events as ev
from runtime.agent import LocalWorkspace
from runtime.driver.local import LocalPorts
from runtime.driver.ports import Driven, Inbound
from runtime.jobs import ToolOutcome
from runtime.regress.recorded import Recorded, RecordedCall
from runtime.tools import ScriptTool, Tool
from runtime.types import ScriptNote, ToolCall, ToolError, ToolResult

BY = "regression"  # who a regression's own verdicts, failures and stops are recorded as by


class Rule(StrEnum):
    """What a call with no recorded match does in a regression (see the module docstring)."""

    RUN = "run"
    ERROR = "error"
    DIVERGE = "diverge"


def default_rule(tool: Tool | None) -> Rule:
    """`run` for a `.pym` script (and a terminal tool with no implementation, which returns its arguments),
    `error` for everything else: a Python tool, an MCP tool, an agent called as a tool."""
    return Rule.RUN if tool is None or isinstance(tool, ScriptTool) else Rule.ERROR


def scratch_workspace(static: Mapping[str, str | bytes] | None = None) -> LocalWorkspace:
    """The regression run's own workspace: the bundle's static files, and the writes of the scripts it ran,
    kept in memory for the rest of this run only (never applied to a workspace anyone else reads): the
    in-process agent's workspace, with no folder behind it."""
    return LocalWorkspace(static=static)


@dataclass
class Tally:
    """What the ports did for one run: calls served from the log, run here, refused; the stop, if any."""

    served: int = 0
    ran: int = 0
    refused: int = 0
    verdicts: int = 0
    answers: int = 0
    stopped: str | None = None  # why a `diverge` rule stopped the run
    unmatched: list[str] = field(default_factory=list)  # the tools called with no recorded match


class RegressPorts(LocalPorts):
    """The driver's ports for one regression run (see the module docstring)."""

    who = BY

    def __init__(self, group: TaskGroup, tools: Mapping[str, Tool], recorded: Recorded,
                 rules: Mapping[str, Rule] | None = None, *, data: LocalWorkspace | None = None,
                 clock: Callable[[], float] = time.time, source_run: str = "") -> None:
        super().__init__(group, tools, data=data, approver=None, answerer=None, clock=clock)
        self.recorded, self.rules, self.source_run = recorded, dict(rules or {}), source_run
        self.tally = Tally()

    def rule(self, tool: str) -> Rule:
        return self.rules.get(tool) or default_rule(self.tools.get(tool))

    async def dispatch(self, driver: Driven, calls: Sequence[ToolCall], deadline: float | None,
                       flush: Callable[[], Awaitable[None]]) -> None:
        for call in calls:
            hit = await self.recorded.take_call(call.name, call.arguments)
            if hit is not None:
                self.tally.served += 1
                driver.deliver(Inbound(self._served(driver, call, hit)))
                continue
            self.tally.unmatched.append(call.name)
            rule = self.rule(call.name)
            if rule is Rule.RUN:
                self.tally.ran += 1
                self.group.start_soon(self._call, driver, call, deadline)
            elif rule is Rule.ERROR:
                self.tally.refused += 1
                error = ToolError("policy", self._no_record(call))
                driver.deliver(Inbound(self._failed(driver, call, error)))
            else:
                self._stop(driver, f"{call.name} was called with arguments run {self.source_run} never used "
                                   f"(its regression rule is diverge)")
                driver.deliver(Inbound(self._failed(driver, call, ToolError(
                    "policy", f"not run: the regression stopped here ({self._no_record(call)})"))))
        await flush()

    def _no_record(self, call: ToolCall) -> str:
        return (f"no recorded result exists for this call of {call.name}: run {self.source_run} never made "
                "it with these arguments, and in a regression this tool does not reach the world")

    def _stop(self, driver: Driven, why: str) -> None:
        if self.tally.stopped is None:
            self.tally.stopped = why
            driver.deliver(Inbound(ev.Cancel(run_id=driver.run_id, reason=f"diverged: {why}", by=BY)))

    def _failed(self, driver: Driven, call: ToolCall, error: ToolError) -> ToolOutcome:
        return ToolOutcome(run_id=driver.run_id, actor=driver.actor, call_id=call.id, tool=call.name,
                           result=ToolResult(error=error), finished=self.clock())

    def _served(self, driver: Driven, call: ToolCall, hit: RecordedCall) -> ToolOutcome:
        """The recorded outcome, for this call, with the notes of the script run it recorded (so the
        regression's log holds what the source's did: the same printed lines, the same ending)."""
        recorded = hit.outcome
        result = ev.tool_result(recorded)
        return ToolOutcome(run_id=driver.run_id, actor=driver.actor, call_id=call.id, tool=call.name,
                           result=result, notes=_notes(recorded, call), finished=self.clock())

    async def _externals(self, driver: Driven, tool: Tool, call: ToolCall, deadline: float | None,
                         notes: list[ScriptNote]) -> dict[str, Callable[..., Any]] | ToolError | None:
        """A script run in a regression: each declared @external refuses, saying so (see the module
        docstring), so the script fails with an `external` error if it reaches one."""
        if not isinstance(tool, ScriptTool) or not tool.script.externals:
            return None
        source = self.source_run

        def refusing(name: str) -> Callable[..., Any]:
            def external(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"in a regression the external {name} does not reach the world, and run "
                                   f"{source} recorded no result for this call of {call.name}")
            return external

        return {name: refusing(name) for name in tool.script.externals}

    async def awaiting(self, driver: Driven, asked: ev.ApprovalRequested | ev.QuestionAsked) -> None:
        if isinstance(asked, ev.ApprovalRequested):
            verdict = self.recorded.take_verdict(asked.call)
            if isinstance(verdict, ev.ApprovalGranted):
                self.tally.verdicts += 1
                driver.deliver(Inbound(ev.Approve(run_id=driver.run_id, call_id=asked.call.id, by=verdict.by,
                                                  arguments=verdict.arguments, note=verdict.note)))
            elif isinstance(verdict, ev.ApprovalDenied):
                self.tally.verdicts += 1
                driver.deliver(Inbound(ev.Deny(run_id=driver.run_id, call_id=asked.call.id, by=verdict.by,
                                               reason=verdict.reason)))
            elif self.rule(asked.call.name) is Rule.DIVERGE:
                self._stop(driver, f"an approval of {asked.call.name} was asked that run {self.source_run} "
                                   "never asked")
            else:
                driver.deliver(Inbound(ev.Deny(run_id=driver.run_id, call_id=asked.call.id, by=BY, reason=(
                    f"no recorded verdict exists: run {self.source_run} never asked to approve this call"))))
            return
        reply = self.recorded.take_answer(asked.question, asked.schema)
        if isinstance(reply, ev.QuestionAnswered):
            self.tally.answers += 1
            driver.deliver(Inbound(ev.Answer(run_id=driver.run_id, call_id=asked.call_id, answer=reply.answer,
                                             by=reply.by)))
        elif isinstance(reply, ev.ToolFailed):
            self.tally.answers += 1
            driver.deliver(Inbound(ev.ToolFailed(run_id=driver.run_id, call_id=asked.call_id, tool=reply.tool,
                                                 error=reply.error)))
        elif self.rule("ask_human") is Rule.DIVERGE:
            self._stop(driver, f"a question was asked that run {self.source_run} never asked")
        else:
            error = ToolError("policy", f"no recorded answer exists: run {self.source_run} never asked this "
                                        "question")
            driver.deliver(Inbound(ev.ToolFailed(run_id=driver.run_id, call_id=asked.call_id,
                                                 tool="ask_human", error=error)))


def _notes(recorded: ev.ToolCompleted | ev.ToolFailed, call: ToolCall) -> tuple[ScriptNote, ...]:
    """The sandbox notes the recorded outcome's script run stands for (`events.script_run` reads them back
    into the same `ScriptRun`)."""
    run = recorded.script
    if run is None:
        return ()
    ids: dict[str, Any] = {"script": call.name, "call_id": call.id}
    notes = [ScriptNote(kind="started", ts=run.started, **ids)]
    notes += [ScriptNote(kind="printed", ts=line.ts, text=line.text, **ids) for line in run.printed]
    if run.ended is not None:
        if run.failed:
            error = run.error or (recorded.error if isinstance(recorded, ev.ToolFailed) else None)
            notes.append(ScriptNote(kind="failed", ts=run.ended, duration_ms=run.duration_ms, error=error,
                                    **ids))
        else:
            notes.append(ScriptNote(kind="completed", ts=run.ended, duration_ms=run.duration_ms, **ids))
    return tuple(notes)


__all__ = ["BY", "RegressPorts", "Rule", "Tally", "default_rule", "scratch_workspace"]
