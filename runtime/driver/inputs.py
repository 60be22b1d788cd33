"""Input from outside a run, checked and recorded: an answer to a question (`ask_human`,
`runtime.questions`), an approver's verdict; and what time alone settles (a question's timeout), recorded
when the run wakes. Used by the one run driver (`runtime.driver.run`) wherever it runs: on a host the input
arrives as commands (`sa answer`, `sa approve`, the client, the inspector); in one process the caller's
approver and answerer are asked and their replies arrive as the same commands (`runtime.driver.local`).

On a host, a run whose only pending work is questions (and timers) is parked like a sleeping one
(`runtime.host.sleep`): no driver, no memory, no slot. Two things fold it back (`Recovery.unpark`, through
`runtime.host.routing`): an `Answer` command, which `apply_answer` records as `question.answered` once it
fits the question's schema; or the cluster's wake-up at the question's timeout (or the task's deadline,
whichever is first), which `settle_due` turns into the kernel's verdict: the bundle's default, a `timeout`
error, or the deadline's failure. `parked_wakes` says which wake-ups a parked run needs.

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
    waiting = {c.id: q for c, q in kernel.pending_questions(state)}
    if call_id not in waiting:
        return f"no question {call_id} is waiting (answered already, timed out, or never asked)"
    schema = waiting[call_id].schema  # as `question.asked` recorded it (ask_human's, or a running call's)
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


def parked_wakes(state: kernel.State) -> tuple[tuple[str, float], ...]:
    """The wake-ups a run waiting on time or on a person needs, as (call id, instant): each pending timer's,
    each waiting question's and approval's timeout or the task's deadline, whichever is first (one waited
    for with neither needs none: only a person's answer or verdict wakes the run)."""
    return (*kernel.pending_timers(state), *((c, at) for c, at in _waiting(state) if at is not None))


def _waiting(state: kernel.State) -> list[tuple[str, float | None]]:
    """The calls that wait for a person (questions, then approvals), each with when time alone settles it."""
    asks = [(c.id, wake_at(q, state.deadline)) for c, q in kernel.pending_questions(state)]
    return asks + [(c.id, kernel.approval_wake(state, c.id)) for c in kernel.pending_approvals(state)]


async def settle_due(state: kernel.State, now: float, append: Append,
                     deadline_passed: Callable[[], Awaitable[None]], *, call_id: str | None = None) -> bool:
    """Record what time alone settles for the calls waiting for a person (all, or only `call_id`, as a
    wake-up names it): at `now`, or at the instant the wake-up was for if the host's clock is a little behind
    the cluster's (the wake-up is the cluster's clock speaking). A question's timeout gives the bundle's
    default or a `timeout` error, an approval's the rule's verdict. Past the task's deadline the run fails
    instead. True if something was recorded."""
    waiting = [(c, at) for c, at in _waiting(state) if call_id in (None, c)]
    wakes = [at for _, at in waiting if at is not None]
    if not wakes:
        return False
    at = max(now, min(wakes)) if call_id is not None else now
    if state.deadline is not None and at >= state.deadline:
        if call_id is None:  # the driver's own check: every call still out fails with the deadline
            await deadline_passed()
            return True
        await _at_deadline(state, at, append)
        return True
    ids = {c for c, _ in waiting}
    verdicts = [v for v in kernel.expire(state, at) if v.call_id in ids]
    for verdict in verdicts:  # stamped at the time the kernel judged them by, so `verify` agrees
        await append(msgspec.structs.replace(verdict, ts=at))
    return bool(verdicts)


async def _at_deadline(state: kernel.State, at: float, append: Append) -> None:
    """A parked run woken at its deadline (only people are waited for): each question fails with `timeout`
    and each approval is denied, stamped then, so the kernel ends the run `deadline`."""
    for c, _ in kernel.pending_questions(state):
        failed = ev.ToolFailed(run_id=state.run_id, call_id=c.id, tool=c.name,
                               error=ToolError("timeout", "nobody answered before the task's deadline"))
        await append(msgspec.structs.replace(failed, ts=at))
    for c in kernel.pending_approvals(state):
        denied = ev.ApprovalDenied(run_id=state.run_id, call_id=c.id, reason="the task's deadline passed",
                                   by="deadline")
        await append(msgspec.structs.replace(denied, ts=at))


__all__ = ["apply_answer", "apply_verdict", "bad_answer", "bad_edit", "parked_wakes", "settle_due"]
