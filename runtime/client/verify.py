"""Verification by the kernel: re-fold a run's recorded events and check `decide` predicted every one
the runner wrote on its own initiative.

    report = verify(bundle.kernel_config(), history.events)     # `sa replay RUN --verify`
    report.ok, report.checked, report.inputs, report.problems

`verify` is the executable form of the kernel's purity: folding the recorded events and asking `decide`
at every point must predict every event the runner wrote on its own initiative. What the kernel settles
by itself (a denial, an approval request, a turn's end, the run's ending) it returns as an event, and the
log must hold the same fact (`events.same_fact`); for the two effects it returns (call the model, run
tools) the log must hold the request the kernel asked for (`model.requested` with the same id and new
messages, `tool.called` for a call it dispatched). Events that came from the outside world (model
replies, tool results, script notes, approvals, cancels) are inputs, not predictions: they must only
fold without error. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime import events as ev
from runtime import kernel
from runtime.questions import TIMEOUT_BY


@dataclass
class Verification:
    """What `verify` found: every predicted event checked against `decide`, and any mismatch."""

    checked: int = 0
    inputs: int = 0
    problems: list[str] = field(default_factory=list)
    final: kernel.State | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


# Endings a host records on its own authority, not the kernel's: inputs to the fold, not predictions.
_HOST_VERDICTS = frozenset({"unknown_agent", "bad_task", "log_rejected", "bundle_changed", "double_texting"})


def _predicted(state: kernel.State, e: ev.Event) -> bool:
    """True if the runner wrote `e` because `decide` asked for it (rather than the world sending it)."""
    if isinstance(e, ev.QuestionAsked):  # ask_human's is decided; a running call's came from its worker
        return e.resume is None
    if isinstance(e, ev.ModelRequested | ev.ToolCalled | ev.ApprovalRequested | ev.TurnCompleted
                  | ev.RunCompleted):
        return True
    if isinstance(e, ev.RunFailed):
        return e.reason not in _HOST_VERDICTS
    if isinstance(e, ev.ToolFailed):  # a denial, unless the call was dispatched (its own failure/timeout)
        if state.turn is not None and e.call_id in state.turn.questions:  # a question's timeout, unless
            return e.error.kind == "timeout" and (state.deadline is None or e.ts < state.deadline)  # the
        # deadline failed it (the runner's own), or an in-process answerer gave none or a bad one
        return state.turn is None or e.call_id not in state.turn.called
    if isinstance(e, ev.QuestionAnswered):  # a person's answer is an input; the default at the timeout not
        return e.by == TIMEOUT_BY
    if isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied):  # a person's verdict is an input
        return e.by == "timeout"
    return False


def _expected(state: kernel.State, e: ev.Event) -> str | None:
    """None if `decide(state)` asked for event `e`, else why not."""
    decisions = kernel.decide(state)
    match e:
        case ev.ModelRequested():
            for d in decisions:
                if isinstance(d, kernel.CallModel) and d.id == e.request_id:
                    if tuple(d.new_messages) != tuple(e.messages) or d.context_start != e.context_start:
                        return f"model request {e.request_id}: the recorded prompt differs from the kernel's"
                    return None
        case ev.ToolCalled():
            if any(isinstance(d, kernel.CallTools) and e.call in d.calls for d in decisions):
                return None
        case ev.ApprovalGranted() | ev.ApprovalDenied() | ev.QuestionAnswered():  # a timeout's verdict:
            if any(ev.same_fact(d, e) for d in kernel.expire(state, e.ts)):     # due at the time it carries
                return None
        case ev.ToolFailed() if any(ev.same_fact(d, e) for d in kernel.expire(state, e.ts)):
            return None  # a question's timeout without a default, recorded when the runner woke
        case ev.ApprovalRequested() if _before_rules(e):  # written before requests recorded their rule
            if any(isinstance(d, ev.ApprovalRequested) and d.call == e.call for d in decisions):
                return None
        case _:
            if any(isinstance(d, kernel.DECIDED_TYPES) and ev.same_fact(d, e) for d in decisions):
                return None
    wanted = ", ".join(_name(d) for d in decisions) or "nothing"
    return f"seq {e.seq} {ev.kind_of(e)}: the kernel asked for {wanted}"


def _before_rules(e: ev.ApprovalRequested) -> bool:
    """True for an approval request as logs recorded it before approval rules: the call alone."""
    return not e.condition and not e.parameters and not e.role and e.timeout_s is None


def _name(decision: kernel.Decision) -> str:
    if isinstance(decision, kernel.CallModel | kernel.CallTools):
        return f"{type(decision).__name__}({decision.id})"
    return ev.kind_of(decision)


def _copied_under_other_config(events: Sequence[ev.Event]) -> int:
    """For a fork that goes on with another bundle version or system prompt, the seq its own events start
    at: the events before it were decided by the source's configuration, so they are folded as inputs
    (they were checked as the source's). 0 for any other run: every event is checked."""
    first = events[0] if events else None
    if isinstance(first, ev.RunForked) and (first.system_prompt is not None
                                             or isinstance(first.edit, ev.BundleEdit)):
        return first.source_seq
    return 0


def verify(config: kernel.KernelConfig, events: Sequence[ev.Event],
           conversation: kernel.Conversation | None = None) -> Verification:
    """Re-fold `events` with the kernel; check `decide` predicted every event the runner chose to write.
    A run that continues a conversation (a thread's) needs it: `runtime.log.threads.conversation_for`."""
    out = Verification()
    state = kernel.initial(config, conversation)
    copied = _copied_under_other_config(events)
    for e in events:
        if e.seq >= copied and _predicted(state, e):
            problem = _expected(state, e)
            out.checked += 1
            if problem:
                out.problems.append(problem)
        elif not isinstance(e, ev.RunStarted):
            out.inputs += 1
        try:
            state = kernel.evolve(state, e)
        except kernel.EvolveError as exc:
            out.problems.append(f"seq {e.seq} {ev.kind_of(e)}: {exc}")
            break
    out.final = state
    return out


__all__ = ["Verification", "verify"]
