"""Run control for operators: cancel a run, list the calls waiting for a person, approve or deny them,
answer the questions runs ask (`ask_human`).

    control = Control(js)
    waiting = await control.pending("payments")                    # [Pending(run, call, tool, args, ...)]
    granted = await control.approve(run, call, arguments={"amount": 90}, note="capped")
    denied = await control.deny(run, call, reason="not this account")   # the model reads the reason
    cancelled = await control.cancel(run, reason="wrong customer")      # the running tool stops too
    asked = await control.questions("planner")                    # [Question(run, call, question, schema)]
    answered = await control.answer(run, call, {"approved": True})  # checked against the question's schema

Every operation checks its input against the run's log first (read through `runtime.log.RunLog`): an
unknown run, an unknown call, a call already decided, edited arguments that fail the tool's schema, a
run that already ended: each is a `ControlError` whose message says what was wrong and what to do, and
nothing is published, so nothing is appended. Otherwise the command is published where the run's host
reads it (`runtime.commands.publish_command`) and the operation waits until the host has recorded
the verdict in the log, returning that event: an operator learns what happened, not only what was
asked (a timeout verdict or the run's end may have come first).

Who decides. Every command carries `by`, the operator's identity, made in one place (`operator`): the
NATS user this process authenticates as, else `user@host`. On a server with authentication the host
records the operator its command subject proves (`ops.<agent>.<operator>`), whatever `by` says; the role
a rule names (`Pending.role`) is recorded in the log.

The runs waiting for a person are found through the runs index, which a host marks
`waiting for approval` (`runtime.nats.records.WAITING_FOR_APPROVAL`) or, parked on a question,
`waiting for an answer` (`WAITING_FOR_ANSWER`); their pending calls and open questions come from their logs.
An answer that does not fit its question's schema, a question already answered (by a person or by its
timeout's default) or one never asked is refused the same way: a `ControlError` saying so, nothing sent.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime.commands import publish_command
from runtime.log import RunLog
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import WAITING_FOR_ANSWER, WAITING_FOR_APPROVAL, RunIndex
from runtime.nats.subjects import check_token
from runtime.validate import validate

RECORD_WAIT_S = 30.0  # how long an operation waits for a host to record its verdict


class ControlError(ValueError):
    """An operator command that cannot be carried out; the message says what was wrong and how to fix it.
    Nothing was published."""


def operator(explicit: str | None = None) -> str:
    """The identity recorded as `by` in a command: the one given, else the NATS user this process
    authenticates as (the host records that one whatever a message says), else `user@host`."""
    from runtime.nats.credentials import identity
    from runtime.nats.subjects import ANONYMOUS

    if explicit:
        return explicit
    authenticated = identity()
    if authenticated != ANONYMOUS:
        return authenticated
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Pending:
    """A call waiting for a person, as its `approval.requested` recorded it."""

    run_id: str
    actor: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    requested_at: float  # the approval.requested timestamp
    condition: str = ""  # why it waits (empty: the tool always waits)
    role: str = ""  # the operator role that may decide
    timeout_s: float | None = None
    on_timeout: str = "deny"
    parameters: dict[str, Any] | None = None  # the tool's argument schema (what edits are checked against)
    run_deadline: float | None = None

    @property
    def times_out_at(self) -> float | None:
        return self.requested_at + self.timeout_s if self.timeout_s is not None else None

    def to_json(self, now: float) -> dict[str, Any]:
        return {"run_id": self.run_id, "agent": self.actor, "call_id": self.call_id, "tool": self.tool,
                "arguments": self.arguments, "requested_at": self.requested_at,
                "age_s": round(now - self.requested_at, 3), "condition": self.condition, "role": self.role,
                "timeout_s": self.timeout_s, "times_out_at": self.times_out_at, "on_timeout": self.on_timeout,
                "run_deadline": self.run_deadline}


@dataclass(frozen=True)
class _Run:
    run_id: str
    actor: str
    events: list[ev.Event]

    @property
    def ending(self) -> ev.Event | None:
        ends = (e for e in self.events if isinstance(e, ev.RunCompleted | ev.RunFailed | ev.RunCancelled))
        return next(ends, None)


_Waiting = TypeVar("_Waiting", "Pending", "Question")


def _still_waiting(events: Sequence[ev.Event], opens: type[Any], closes: tuple[type[Any], ...],
                   make: Callable[[Any, float | None], _Waiting]) -> list[_Waiting]:
    """What a run's log still waits for a person on: each `opens` event made into an item by `make(event,
    run deadline)`, dropped by a `closes` event or the call's result naming its call, and nothing at all once
    the run has ended. One fold for approvals and questions, so the two cannot disagree on what is open."""
    waiting: dict[str, _Waiting] = {}
    deadline: float | None = None
    for e in events:
        if isinstance(e, ev.RunStarted):
            deadline = e.ts + e.timeout_s if e.timeout_s is not None else None
        elif isinstance(e, opens):
            item = make(e, deadline)
            waiting[item.call_id] = item
        elif isinstance(e, (*closes, ev.ToolCompleted, ev.ToolFailed)):  # each of them names a call_id
            waiting.pop(cast(Any, e).call_id, None)
        elif isinstance(e, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
            return []
    return list(waiting.values())


def pending_in(run_id: str, actor: str, events: Sequence[ev.Event]) -> list[Pending]:
    """The calls of a run's log that wait for a person: requested, with no verdict and no result, in a
    run that has not ended."""
    def make(e: ev.ApprovalRequested, deadline: float | None) -> Pending:
        return Pending(run_id=run_id, actor=actor, call_id=e.call.id, tool=e.call.name,
                       arguments=dict(e.call.arguments), requested_at=e.ts, condition=e.condition,
                       role=e.role, timeout_s=e.timeout_s, on_timeout=e.on_timeout,
                       parameters=e.parameters or None, run_deadline=deadline)
    return _still_waiting(events, ev.ApprovalRequested, (ev.ApprovalGranted, ev.ApprovalDenied), make)


@dataclass(frozen=True)
class Question:
    """A question a run asks a person (`ask_human`), as its `question.asked` recorded it."""

    run_id: str
    actor: str
    call_id: str
    question: str
    schema: dict[str, Any] | None  # what the answer must fit (None: any JSON value)
    asked_at: float
    due: float | None = None  # when the timeout answers it (None: it waits for a person, or the deadline)
    default: Any = None  # what the timeout answers, if `has_default`; else the call fails `timeout`
    has_default: bool = False
    run_deadline: float | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        return {"run_id": self.run_id, "agent": self.actor, "call_id": self.call_id,
                "question": self.question, "schema": self.schema, "asked_at": self.asked_at,
                "age_s": round(now - self.asked_at, 3),
                "times_out_at": self.due, "default": self.default, "has_default": self.has_default,
                "run_deadline": self.run_deadline}


def questions_in(run_id: str, actor: str, events: Sequence[ev.Event]) -> list[Question]:
    """The questions of a run's log still waiting for an answer: asked, with no answer and no result, in a
    run that has not ended."""
    def make(e: ev.QuestionAsked, deadline: float | None) -> Question:
        return Question(run_id=run_id, actor=actor, call_id=e.call_id, question=e.question, schema=e.schema,
                        asked_at=e.ts, due=e.due, default=e.default, has_default=e.has_default,
                        run_deadline=deadline)
    return _still_waiting(events, ev.QuestionAsked, (ev.QuestionAnswered,), make)


def check_answer(question: Question, answer: Any) -> None:
    """Raise `ControlError` saying what is wrong if `answer` does not fit the question's schema."""
    errors = validate(answer, question.schema) if question.schema else []
    if errors:
        raise ControlError(f"the answer does not fit the question's schema: {'; '.join(errors)} (the "
                           f"question: {question.question!r}; the schema: {question.schema})")


def _ended(event: ev.Event) -> str:
    return ev.kind_of(event).split(".", 1)[1]


class Control:
    """Operator commands on runs over one JetStream context (see the module docstring)."""

    def __init__(self, js: JetStreamContext, *, record_wait: float = RECORD_WAIT_S) -> None:
        self.js = js
        self.log = RunLog(js)
        self.record_wait = record_wait

    # -- reading ---------------------------------------------------------------------------------------

    async def _run(self, run_id: str) -> _Run:
        try:
            check_token(run_id, "run id")
        except ValueError as e:
            raise ControlError(str(e)) from None
        history = await self.log.read(run_id)
        if not history.events:
            raise ControlError(f"unknown run {run_id!r}: it has no events (list runs with `sa runs`)")
        return _Run(run_id, history.actor, history.events)

    async def pending(self, agent: str | None = None) -> list[Pending]:
        """Every call waiting for a person, oldest first; only `agent`'s (a bundle or bundle:instance)."""
        out = await self._waiting_in_runs(WAITING_FOR_APPROVAL, agent, pending_in)
        return sorted(out, key=lambda p: p.requested_at)

    async def _waiting_call(self, run_id: str, call_id: str) -> tuple[_Run, Pending]:
        def settled(e: ev.Event, call_id: str) -> str | None:
            if isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied) and e.call_id == call_id:
                verdict = "approved" if isinstance(e, ev.ApprovalGranted) else "denied"
                by = f" by {e.by}" if e.by else ""
                return f"call {call_id} was already {verdict}{by}: a decision is final"
            return None
        return await self._still_open(run_id, call_id, pending_in, settled, nothing="nothing left to decide",
                                      what="call {call_id} waiting for approval", see="sa approvals")

    async def questions(self, agent: str | None = None) -> list[Question]:
        """Every question waiting for an answer, oldest first; only `agent`'s (bundle or bundle:instance)."""
        out = await self._waiting_in_runs(WAITING_FOR_ANSWER, agent, questions_in)
        return sorted(out, key=lambda q: q.asked_at)

    async def _waiting_in_runs(
            self, status: str, agent: str | None,
            fold: Callable[[str, str, Sequence[ev.Event]], list[_Waiting]]) -> list[_Waiting]:
        """`fold` over the log of every run the index says is `status` (of `agent`, if given)."""
        out: list[_Waiting] = []
        for run_id in await self._runs_with(status, agent):
            history = await self.log.read(run_id)
            out.extend(fold(run_id, history.actor, history.events))
        return out

    async def _runs_with(self, status: str, agent: str | None) -> list[str]:
        kv = await runs_kv(self.js)
        runs = []
        for run_id, entry in (await kv_entries(kv)).items():
            if not entry.value:
                continue
            ix = RunIndex.decode(entry.value)
            if ix.status == status and (agent is None or agent in (ix.actor, ix.actor.split(":")[0])):
                runs.append(run_id)
        return runs

    async def _open_question(self, run_id: str, call_id: str) -> tuple[_Run, Question]:
        def settled(e: ev.Event, call_id: str) -> str | None:
            if isinstance(e, ev.QuestionAnswered) and e.call_id == call_id:
                who = "its timeout's default" if e.by == "timeout" else e.by or "someone"
                return (f"the question of call {call_id} was already answered by {who} "
                        f"({json_text(e.answer)}): an answer is final")
            if isinstance(e, ev.ToolFailed) and e.call_id == call_id:
                return f"the question of call {call_id} is closed: {e.error.message}"
            return None
        return await self._still_open(run_id, call_id, questions_in, settled,
                                      nothing="no question left to answer",
                                      what="question {call_id} waiting for an answer", see="sa questions")

    async def _still_open(self, run_id: str, call_id: str,
                          fold: Callable[[str, str, Sequence[ev.Event]], list[_Waiting]],
                          settled: Callable[[ev.Event, str], str | None], *, nothing: str, what: str,
                          see: str) -> tuple[_Run, _Waiting]:
        """The run and what in it still waits for a person on `call_id` (`fold` of its log), or a
        `ControlError` saying why not: the run ended, the wait was `settled` already, or no such wait."""
        run = await self._run(run_id)
        ending = run.ending
        if ending is not None:
            raise ControlError(f"run {run_id} already {_ended(ending)}: there is {nothing}")
        call_id = _full_call_id(run_id, call_id)
        waiting = {w.call_id: w for w in fold(run_id, run.actor, run.events)}
        if call_id in waiting:
            return run, waiting[call_id]
        for e in run.events:
            why = settled(e, call_id)
            if why is not None:
                raise ControlError(why)
        listed = ", ".join(sorted(waiting)) or "none"
        raise ControlError(f"run {run_id} has no {what.format(call_id=call_id)}; waiting: {listed} "
                           f"(see `{see}`)")

    # -- commands --------------------------------------------------------------------------------------

    async def answer(self, run_id: str, call_id: str, answer: Any, *,
                     by: str | None = None) -> ev.QuestionAnswered | ev.ToolFailed:
        """Answer a run's question (checked against its schema first: a bad answer is refused, nothing
        sent). Returns what the host recorded: this answer, or what closed the question first (its
        timeout's default or error, a second answer that won the race)."""
        run, question = await self._open_question(run_id, call_id)
        check_answer(question, answer)
        await publish_command(self.js, run.actor, ev.Answer(run_id=run_id, call_id=question.call_id,
                                                            answer=answer, by=operator(by)))
        after = run.events[-1].seq if run.events else -1  # not an earlier round's answer to the same call
        event = await self._recorded(run, lambda e: isinstance(e, ev.QuestionAnswered | ev.ToolFailed)
                                     and e.call_id == question.call_id and e.seq > after, stop_at_end=True)
        assert isinstance(event, ev.QuestionAnswered | ev.ToolFailed)
        return event


    async def approve(self, run_id: str, call_id: str, *, arguments: dict[str, Any] | None = None,
                      note: str = "", by: str | None = None) -> ev.ApprovalGranted | ev.ApprovalDenied:
        """Let a waiting call run, with `arguments` instead of the model's when given (checked against
        the tool's schema first). Returns the verdict the host recorded."""
        run, pending = await self._waiting_call(run_id, call_id)
        if arguments is not None:
            if not isinstance(arguments, dict):
                raise ControlError(f"the edited arguments must be a JSON object, got {arguments!r}")
            errors = validate(arguments, pending.parameters) if pending.parameters else []
            if errors:
                raise ControlError(f"the edited arguments do not fit {pending.tool}'s schema: "
                                   + "; ".join(errors) + f" (the model asked for {pending.arguments})")
        cmd = ev.Approve(run_id=run_id, call_id=pending.call_id, by=operator(by), arguments=arguments,
                         note=note)
        return await self._send(run, cmd, pending.call_id)

    async def deny(self, run_id: str, call_id: str, *, reason: str,
                   by: str | None = None) -> ev.ApprovalGranted | ev.ApprovalDenied:
        """Refuse a waiting call; the model reads `reason` as the tool's error. Returns the verdict."""
        if not reason.strip():
            raise ControlError("a denial needs a reason: the model reads it to decide what to do instead")
        run, pending = await self._waiting_call(run_id, call_id)
        cmd = ev.Deny(run_id=run_id, call_id=pending.call_id, reason=reason, by=operator(by))
        return await self._send(run, cmd, pending.call_id)

    async def cancel(self, run_id: str, *, reason: str = "", by: str | None = None) -> ev.Event:
        """End a run: `run.cancelled` (any approval it waits for is closed, any tool it runs is stopped).
        Returns the run's ending as recorded (another ending, if the run ended first)."""
        run = await self._run(run_id)
        ending = run.ending
        if ending is not None:
            raise ControlError(f"run {run_id} already {_ended(ending)}: nothing to cancel, nothing changed")
        await publish_command(self.js, run.actor, ev.Cancel(run_id=run_id, reason=reason, by=operator(by)))
        return await self._recorded(run, lambda e: ev.kind_of(e) in ("run.completed", "run.failed",
                                                                      "run.cancelled"))

    async def _send(self, run: _Run, cmd: ev.Approve | ev.Deny,
                    call_id: str) -> ev.ApprovalGranted | ev.ApprovalDenied:
        await publish_command(self.js, run.actor, cmd)
        event = await self._recorded(run, lambda e: isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied)
                                     and e.call_id == call_id, stop_at_end=True)
        assert isinstance(event, ev.ApprovalGranted | ev.ApprovalDenied)
        return event

    async def _recorded(self, run: _Run, wanted: Any, *, stop_at_end: bool = False) -> ev.Event:
        """The first event of the run's log that `wanted` accepts, waiting for the host to write it."""
        ending: ev.Event | None = None
        # closed here, not whenever the generator is collected: by then the connection may be draining,
        # and its unsubscribe would die in a task nobody awaits ("Task exception was never retrieved")
        with anyio.move_on_after(self.record_wait):
            follow = cast(AsyncGenerator[ev.Event, None],
                          self.log.follow(run.run_id, run.actor, resolve=True))
            async with aclosing(follow) as events:
                async for event in events:
                    if wanted(event):
                        return event
                    ending = event
        if stop_at_end and ending is not None and ev.kind_of(ending) in ("run.completed", "run.failed",
                                                                          "run.cancelled"):
            raise ControlError(f"run {run.run_id} {_ended(ending)} before the decision was recorded")
        raise ControlError(f"the command for run {run.run_id} was sent, but no host recorded it within "
                           f"{self.record_wait:g} s: is a host serving agent {run.actor!r}? (`sa status`); "
                           "the command stays queued for it")


def _full_call_id(run_id: str, call_id: str) -> str:
    """A call id as given, or completed from its short form (`1.0` for `<run>/1.0`, as `sa approvals`
    prints it)."""
    return call_id if "/" in call_id else f"{run_id}/{call_id}"


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


__all__ = ["RECORD_WAIT_S", "Control", "ControlError", "Pending", "Question", "check_answer", "operator",
           "pending_in", "questions_in"]
