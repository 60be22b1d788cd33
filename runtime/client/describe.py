"""One line saying what an event records: the detail column of `sa replay`, the lines of `sa send --follow`,
the inspector's event rows.

Why one function per kind of event, found through a table: every face shows an event the same way, and
a new event kind is one small function plus one line in `_DESCRIBE`, not a branch in a long match. An
event stored as a stub (its big field in the object store) is described without fetching the field: the
line says where the value is and how big it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from runtime import events as ev
from runtime.timers import iso


def short(value: Any, width: int = 90) -> str:
    """`value` on one line (JSON unless it is text), cut to `width` characters with an ellipsis."""
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _ref(ref: ev.PayloadRef) -> str:
    return f"[{ref.size:,} bytes in the object store: {ref.object_name[:19]}…]"


def _big(event: ev.Event, value: Any, width: int) -> str:
    """The event's big field, shortened; or where it is when the event (as stored) is a stub."""
    return _ref(event.ref) if event.ref is not None else short(value, width)


def _by(by: str) -> str:
    return f" by {by}" if by else ""


def _forked(event: ev.RunForked) -> str:
    edit = f", {_edit(event.edit)}" if event.edit is not None else ""
    return f"forked from {event.source_run} at seq {event.source_seq}{edit}"


def _started(event: ev.RunStarted) -> str:
    if isinstance(event, ev.RunForked):
        return _forked(event)
    deadline = f"  deadline {event.timeout_s:g}s" if event.timeout_s else ""
    parent = event.metadata.get("sa.parent_run")  # a sub-run names its parent
    child = f"  sub-run of {parent} (call {event.metadata.get('sa.parent_call')})" if parent else ""
    return (f"task {_big(event, event.input, 70)}{deadline}  bundle {event.bundle_digest or '-'}"
            f"{_thread(event)}{child}")


def _thread(event: ev.RunStarted) -> str:
    if event.thread is None:
        return ""
    where = (f" continuing {event.previous_run} to seq {event.previous_seq}" if event.previous_run
             else " (its first run)")
    summary = f", {event.summarised} earlier message(s) summarised" if event.summary is not None else ""
    return f"  thread {event.thread!r}{where}{summary}"


def _requested(event: ev.ModelRequested) -> str:
    again = f" attempt {event.attempt}" if event.attempt else ""
    added = _ref(event.ref) if event.ref is not None else f"+{len(event.messages)} message(s)"
    return f"turn {event.turn}{again}: {added}, context from {event.context_start}"


def _responded(event: ev.ModelResponded) -> str:
    usage = event.usage
    head = f"{event.latency_ms:.0f} ms, {usage.prompt_tokens}+{usage.completion_tokens} tok"
    if event.parse_error:
        return f"{head}; unparseable: {short(event.parse_error, 60)}"
    if not event.calls:
        return f"{head}; says {_big(event, event.content or event.text, 60)}"
    if event.ref is not None:
        return f"{head}; calls {', '.join(c.name for c in event.calls)} {_ref(event.ref)}"
    return f"{head}; calls " + ", ".join(f"{c.name}({short(c.arguments, 50)})" for c in event.calls)


def _called(event: ev.ToolCalled) -> str:
    call = event.call
    return f"{call.id.rsplit('/', 1)[-1]} {call.name}({_big(event, call.arguments, 60)})"


def _redelivered(event: ev.ToolRedelivered) -> str:
    why = "; ".join(event.earlier) or "earlier deliveries ended without an outcome"
    return f"{event.tool} attempt {event.attempt} on {event.worker or 'a worker'}: {why}"


def _throttled(event: ev.ModelThrottled) -> str:
    """A wait before a model call's next attempt: the server's 429/503 (and what it asked), or a budget."""
    if not event.status:
        return f"turn {event.turn}: waits {event.wait_s:.1f} s, {short(event.reason, 70)}"
    asked = f", Retry-After {event.retry_after:g} s" if event.retry_after is not None else ""
    return f"turn {event.turn}: HTTP {event.status}{asked}; retried after {event.wait_s:.2f} s"


def _approval_requested(event: ev.ApprovalRequested) -> str:
    why = f" ({event.condition})" if event.condition else ""
    role = f" by {event.role}" if event.role else ""
    until = f", {event.on_timeout} after {event.timeout_s:g}s" if event.timeout_s is not None else ""
    return f"{event.call.name}({short(event.call.arguments, 60)}) waits for approval{role}{why}{until}"


def _granted(event: ev.ApprovalGranted) -> str:
    edited = f" with arguments {short(event.arguments, 50)}" if event.arguments is not None else ""
    note = f": {short(event.note, 50)}" if event.note else ""
    return f"{event.call_id}{_by(event.by)}{edited}{note}"


def _json(value: Any, width: int = 20) -> str:
    return short(msgspec.json.encode(value).decode(), width)


def _asked(e: ev.QuestionAsked) -> str:
    """`1.0 "Ship it?" (answer: {"enum": [...]}) until 2030-...Z, then "no"`: the question, its form, its
    timeout and what the timeout gives."""
    form = f" (answer: {short(e.schema, 40)})" if e.schema else ""
    until = f" until {iso(e.due)}, then {_json(e.default) if e.has_default else 'a timeout error'}" \
        if e.due is not None else ""
    return f"{e.call_id.rsplit('/', 1)[-1]} {short(e.question, 60)!r}{form}{until}"


_DESCRIBE: dict[type, Callable[[Any], str]] = {
    ev.RunForked: _forked,
    ev.RunStarted: _started,
    ev.ModelRequested: _requested,
    ev.ModelResponded: _responded,
    ev.ModelFailed: lambda e: f"{e.error_kind}: {short(e.error, 80)}",
    ev.ModelThrottled: _throttled,
    ev.ToolCalled: _called,
    ev.ScriptStarted: lambda e: f"{e.tool} on {e.worker or 'a worker'}",
    ev.ScriptPrinted: lambda e: f"{e.tool}: {short(e.text, 70)}",
    ev.ScriptCompleted: lambda e: f"{e.tool} in {e.duration_ms:.1f} ms",
    ev.ScriptFailed: lambda e: f"{e.tool}: {e.error.kind}: {short(e.error.message, 60)}",
    ev.ToolRedelivered: _redelivered,
    ev.RunTaken: lambda e: f"driven by {e.host} from here{f' (lease revision {e.lease})' if e.lease else ''}",
    ev.ToolCompleted: lambda e: f"{e.tool} {e.duration_ms:.1f} ms -> {_big(e, e.output, 60)}",
    ev.ToolFailed: lambda e: f"{e.tool}: {e.error.kind}: {short(e.error.message, 70)}",
    ev.TurnCompleted: lambda e: f"turn {e.turn}: {e.calls_ok} ok, {e.calls_failed} failed",
    ev.RunCompleted: lambda e: f"output {_big(e, e.output, 80)}",
    ev.RunFailed: lambda e: f"{e.reason}{': ' + short(e.detail, 70) if e.detail else ''}",
    ev.RunCancelled: lambda e: f"{e.reason}{_by(e.by)}",
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalGranted: _granted,
    ev.ApprovalDenied: lambda e: f"{e.call_id}{_by(e.by)}: {short(e.reason, 60)}",
    ev.TimerStarted: lambda e: f"{e.call_id.rsplit('/', 1)[-1]} {e.tool} until {iso(e.due)}",
    ev.TimerFired: lambda e: f"{e.call_id.rsplit('/', 1)[-1]} woke{f' ({e.by})' if e.by else ''}",
    ev.QuestionAsked: _asked,
    ev.QuestionAnswered: lambda e: f"{e.call_id.rsplit('/', 1)[-1]}{_by(e.by)}: {short(e.answer, 60)}",
}


def describe(event: ev.Event) -> str:
    """One line saying what an event records ("" for a kind without one)."""
    show = _DESCRIBE.get(type(event))
    return show(event) if show is not None else ""


def _edit(edit: ev.ForkEdit) -> str:
    match edit:
        case ev.OutputEdit():
            return f"call {edit.call_id.rsplit('/', 1)[-1]} output {short(edit.output, 50)}"
        case ev.ReplyEdit():
            calls = ", ".join(f"{c.name}({short(c.arguments, 40)})" for c in edit.calls)
            return f"reply {short(edit.content, 40) if edit.content else ''}{calls}"
        case ev.BundleEdit():
            return f"bundle version {edit.digest}"
        case ev.SystemEdit():
            return f"system prompt {short(edit.system_prompt, 50)}"
    return ""


__all__ = ["describe", "short"]
