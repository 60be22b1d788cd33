"""What a person sends a run, checked and recorded: an answer to a question (`ask_human`,
`runtime.questions`), an approver's verdict; and a question's timeout, recorded when the run wakes.

A run whose only pending work is questions (and timers) is parked like a sleeping one (`runtime.host.sleep`):
no driver, no memory, no slot. Two things fold it back (`Recovery.unpark`, through `runtime.host.routing`):
an `Answer` command (`sa answer`, the client, the inspector), which `apply_answer` records as
`question.answered` once it fits the question's schema; or the cluster's wake-up at the question's timeout
(or the task's deadline, whichever is first), which `settle_due` turns into the kernel's verdict: the
bundle's default, a `timeout` error, or the deadline's failure.

The answer is checked here as well as by the client (which refuses a bad answer before publishing, saying
what is wrong): a command from any other publisher that does not fit is logged and dropped, so the log only
holds answers that fit. A second answer to the same call changes nothing (the first one is final).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from runtime import events as ev
from runtime import kernel
from runtime.questions import wake_at
from runtime.types import ToolError
from runtime.validate import validate

log = logging.getLogger("runtime.host")

Append = Callable[[ev.Event], Awaitable[Any]]


async def apply_verdict(state: kernel.State, item: ev.Approve | ev.Deny, append: Append) -> None:
    """Record an approver's verdict on a call waiting for approval, or log why it changes nothing (no such
    call waits, or edited arguments that fail the tool's schema)."""
    turn = state.turn
    if state.done or turn is None or item.call_id not in turn.approvals_requested or \
            item.call_id in turn.approvals:
        log.info("run %s: %s for %s changes nothing", state.run_id, type(item).__name__, item.call_id)
        return
    if isinstance(item, ev.Deny):
        await append(ev.ApprovalDenied(run_id=state.run_id, call_id=item.call_id, reason=item.reason,
                                       by=item.by))
        return
    problem = bad_edit(state, item.call_id, item.arguments) if item.arguments is not None else None
    if problem is not None:
        log.warning("run %s: approval of %s refused: %s", state.run_id, item.call_id, problem)
        return
    await append(ev.ApprovalGranted(run_id=state.run_id, call_id=item.call_id, by=item.by,
                                    arguments=item.arguments, note=item.note))


def bad_edit(state: kernel.State, call_id: str, arguments: Any) -> str | None:
    """Why an approver's edited arguments cannot replace the model's in call `call_id` (they fail the
    tool's schema), or None. `sa approve` checks the same before it publishes; this guards any other
    publisher. Here beside the answers because both are a person's input the host checks again."""
    turn = state.turn
    call = turn.call(call_id) if turn is not None else None
    schema = next((t.parameters for t in state.config.tools if call and t.name == call.name), None)
    if schema is None:
        return None
    errors = validate(arguments, schema)
    return "; ".join(errors) if errors else None


def bad_answer(state: kernel.State, call_id: str, answer: Any) -> str | None:
    """Why `answer` cannot answer the question of `call_id` (the question is not waiting, or the answer
    fails its schema), or None."""
    waiting = {c.id: c for c, _ in kernel.pending_questions(state)}
    if call_id not in waiting:
        return f"no question {call_id} is waiting (answered already, timed out, or never asked)"
    schema = waiting[call_id].arguments.get("answer_schema")
    errors = validate(answer, schema) if isinstance(schema, dict) else []
    return "the answer does not fit the question's schema: " + "; ".join(errors) if errors else None


async def apply_answer(state: kernel.State, item: ev.Answer, append: Append) -> None:
    """Record an operator's answer as `question.answered`, or log why it changes nothing."""
    problem = bad_answer(state, item.call_id, item.answer)
    if state.done or problem is not None:
        log.info("run %s: answer to %s changes nothing: %s", state.run_id, item.call_id,
                 "the run is over" if state.done else problem)
        return
    await append(ev.QuestionAnswered(run_id=state.run_id, call_id=item.call_id, answer=item.answer,
                                     by=item.by))


async def settle_due(state: kernel.State, now: float, append: Append,
                     deadline_passed: Callable[[], Awaitable[None]], *, call_id: str | None = None) -> bool:
    """Record what time alone settles for the waiting questions (all, or only `call_id`'s, as a wake-up
    names it): at `now`, or at the instant the wake-up was for if the host's clock is a little behind the
    cluster's (the wake-up is the cluster's clock speaking). Past the task's deadline the run fails instead.
    True if something was recorded."""
    asks = [(c, q) for c, q in kernel.pending_questions(state) if call_id in (None, c.id)]
    wakes = [at for _, q in asks if (at := wake_at(q, state.deadline)) is not None]
    if not wakes:
        return False
    at = max(now, min(wakes)) if call_id is not None else now
    if state.deadline is not None and at >= state.deadline:
        if call_id is None:  # the driver's own check: every call still out fails with the deadline
            await deadline_passed()
            return True
        for c, _ in kernel.pending_questions(state):  # a parked run woken at its deadline: only questions
            failed = ev.ToolFailed(run_id=state.run_id, call_id=c.id, tool=c.name,  # wait (stamped then,
                                   error=ToolError("timeout", "nobody answered before the task's deadline"))
            await append(msgspec.structs.replace(failed, ts=at))  # so the kernel ends the run `deadline`)
        return True
    asked = {c.id for c, _ in asks}
    verdicts = [v for v in kernel.expire(state, at)
                if isinstance(v, ev.QuestionAnswered | ev.ToolFailed) and v.call_id in asked]
    for verdict in verdicts:  # stamped at the time the kernel judged them by, so `verify` agrees
        await append(msgspec.structs.replace(verdict, ts=at))
    return bool(verdicts)


__all__ = ["apply_answer", "apply_verdict", "bad_answer", "bad_edit", "settle_due"]
