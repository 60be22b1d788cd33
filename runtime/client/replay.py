"""Seeing a run: the rendered timeline, the live view, and verification by the kernel (`sa replay`).

    history = await RunLog(js).read(run_id)          # the events (runtime.log)
    console.print(timeline(history.events))          # model requests, tool calls, scripts, durations, tokens
    report = verify(config, history.events)          # re-fold with the kernel: decide reproduces the log?

`verify` is the executable form of the kernel's purity: folding the recorded events and asking `decide`
at every point must predict every event the runner wrote on its own initiative. What the kernel settles
by itself (a denial, an approval request, a turn's end, the run's ending) it returns as an event, and the
log must hold the same fact (`events.same_fact`); for the two effects it returns (call the model, run
tools) the log must hold the request the kernel asked for (`model.requested` with the same id and new
messages, `tool.called` for a call it dispatched). Events that came from the outside world (model
replies, tool results, script notes, approvals, cancels) are inputs, not predictions: they must only
fold without error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.log import RunLog
from runtime.streaming import Delta, subscribe

# ---------------------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------------------


def _short(value: Any, width: int = 90) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _ref(ref: ev.PayloadRef) -> str:
    return f"[{ref.size:,} bytes in the object store: {ref.object_name[:19]}…]"


def _big(event: ev.Event, value: Any, width: int) -> str:
    """The event's big field, shortened; or where it is when the event (as stored) is a stub."""
    return _ref(event.ref) if event.ref is not None else _short(value, width)


def describe(event: ev.Event) -> str:
    """One line saying what an event records (the timeline's detail column, `sa send --follow`)."""
    match event:
        case ev.RunForked():
            edit = f", {_edit(event.edit)}" if event.edit is not None else ""
            return f"forked from {event.source_run} at seq {event.source_seq}{edit}"
        case ev.RunStarted():
            deadline = f"  deadline {event.timeout_s:g}s" if event.timeout_s else ""
            parent = event.metadata.get("sa.parent_run")  # a sub-run names its parent
            child = f"  sub-run of {parent} (call {event.metadata.get('sa.parent_call')})" if parent else ""
            thread = ""
            if event.thread is not None:
                thread = f"  thread {event.thread!r}" + (
                    f" continuing {event.previous_run} to seq {event.previous_seq}" if event.previous_run
                    else " (its first run)")
                if event.summary is not None:
                    thread += f", {event.summarised} earlier message(s) summarised"
            return (f"task {_big(event, event.input, 70)}{deadline}  bundle {event.bundle_digest or '-'}"
                    f"{thread}{child}")
        case ev.ModelRequested():
            again = f" attempt {event.attempt}" if event.attempt else ""
            added = _ref(event.ref) if event.ref is not None else f"+{len(event.messages)} message(s)"
            return (f"turn {event.turn}{again}: {added}, "
                    f"context from {event.context_start}")
        case ev.ModelResponded():
            usage = event.usage
            head = f"{event.latency_ms:.0f} ms, {usage.prompt_tokens}+{usage.completion_tokens} tok"
            if event.parse_error:
                return f"{head}; unparseable: {_short(event.parse_error, 60)}"
            if event.calls:
                if event.ref is not None:
                    return f"{head}; calls {', '.join(c.name for c in event.calls)} {_ref(event.ref)}"
                calls = ", ".join(f"{c.name}({_short(c.arguments, 50)})" for c in event.calls)
                return f"{head}; calls {calls}"
            return f"{head}; says {_big(event, event.content or event.text, 60)}"
        case ev.ModelFailed():
            return f"{event.error_kind}: {_short(event.error, 80)}"
        case ev.ToolCalled():
            call = event.call
            return f"{call.id.rsplit('/', 1)[-1]} {call.name}({_big(event, call.arguments, 60)})"
        case ev.ScriptStarted():
            return f"{event.tool} on {event.worker or 'a worker'}"
        case ev.ScriptPrinted():
            return f"{event.tool}: {_short(event.text, 70)}"
        case ev.ScriptCompleted():
            return f"{event.tool} in {event.duration_ms:.1f} ms"
        case ev.ScriptFailed():
            return f"{event.tool}: {event.error.kind}: {_short(event.error.message, 60)}"
        case ev.ToolRedelivered():
            why = "; ".join(event.earlier) or "earlier deliveries ended without an outcome"
            return f"{event.tool} attempt {event.attempt} on {event.worker or 'a worker'}: {why}"
        case ev.ToolCompleted():
            return f"{event.tool} {event.duration_ms:.1f} ms -> {_big(event, event.output, 60)}"
        case ev.ToolFailed():
            return f"{event.tool}: {event.error.kind}: {_short(event.error.message, 70)}"
        case ev.TurnCompleted():
            return f"turn {event.turn}: {event.calls_ok} ok, {event.calls_failed} failed"
        case ev.RunCompleted():
            return f"output {_big(event, event.output, 80)}"
        case ev.RunFailed():
            return f"{event.reason}{': ' + _short(event.detail, 70) if event.detail else ''}"
        case ev.RunCancelled():
            return f"{event.reason}{' by ' + event.by if event.by else ''}"
        case ev.ApprovalRequested():
            why = f" ({event.condition})" if event.condition else ""
            role = f" by {event.role}" if event.role else ""
            until = f", {event.on_timeout} after {event.timeout_s:g}s" if event.timeout_s is not None else ""
            asked = f"{event.call.name}({_short(event.call.arguments, 60)})"
            return f"{asked} waits for approval{role}{why}{until}"
        case ev.ApprovalGranted():
            edited = f" with arguments {_short(event.arguments, 50)}" if event.arguments is not None else ""
            note = f": {_short(event.note, 50)}" if event.note else ""
            return f"{event.call_id}{' by ' + event.by if event.by else ''}{edited}{note}"
        case ev.ApprovalDenied():
            return f"{event.call_id}{' by ' + event.by if event.by else ''}: {_short(event.reason, 60)}"
    return _timer(event)


def _timer(event: ev.Event) -> str:
    """A timer's line: `1.0 sleep until 2030-01-01T08:00:00Z`, `1.0 woke (schedule)`."""
    from runtime.timers import iso

    if isinstance(event, ev.TimerStarted):
        return f"{event.call_id.rsplit('/', 1)[-1]} {event.tool} until {iso(event.due)}"
    if isinstance(event, ev.TimerFired):
        return f"{event.call_id.rsplit('/', 1)[-1]} woke{f' ({event.by})' if event.by else ''}"
    return ""


def _edit(edit: ev.ForkEdit) -> str:
    match edit:
        case ev.OutputEdit():
            return f"call {edit.call_id.rsplit('/', 1)[-1]} output {_short(edit.output, 50)}"
        case ev.ReplyEdit():
            calls = ", ".join(f"{c.name}({_short(c.arguments, 40)})" for c in edit.calls)
            return f"reply {_short(edit.content, 40) if edit.content else ''}{calls}"
        case ev.BundleEdit():
            return f"bundle version {edit.digest}"
        case ev.SystemEdit():
            return f"system prompt {_short(edit.system_prompt, 50)}"


@dataclass(frozen=True)
class Summary:
    status: str
    events: int
    turns: int
    model_calls: int
    tool_calls: int
    prompt_tokens: int
    completion_tokens: int
    model_ms: float
    tool_ms: float
    wall_s: float


def summarize(events: Sequence[ev.Event]) -> Summary:
    """Totals of a run's log: what the timeline footer and `--json` report."""
    status = "running"
    for e in events:
        if isinstance(e, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
            status = ev.kind_of(e).split(".", 1)[1]
    responded = [e for e in events if isinstance(e, ev.ModelResponded)]
    tools = [e for e in events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)]
    return Summary(
        status=status, events=len(events), turns=sum(isinstance(e, ev.TurnCompleted) for e in events),
        model_calls=len(responded) + sum(isinstance(e, ev.ModelFailed) for e in events),
        tool_calls=sum(isinstance(e, ev.ToolCalled) for e in events),
        prompt_tokens=sum(e.usage.prompt_tokens for e in responded),
        completion_tokens=sum(e.usage.completion_tokens for e in responded),
        model_ms=sum(e.latency_ms for e in responded), tool_ms=sum(e.duration_ms for e in tools),
        wall_s=(max(e.ts for e in events) - _t0(events)) if events else 0.0)


def _t0(events: Sequence[ev.Event]) -> float:
    """When a run began: its first event, or for a fork the earliest event it kept from its source."""
    return min(e.ts for e in events) if events else 0.0


_STYLE = {"run": "bold", "model": "cyan", "tool": "yellow", "script": "magenta", "turn": "blue",
          "approval": "green", "timer": "blue"}


def timeline(events: Sequence[ev.Event], *, title: str = "") -> Any:
    """A rich Table: one row per event (seq, time since start, kind, what happened) + a totals caption."""
    from rich.table import Table

    t0 = _t0(events)
    s = summarize(events)
    table = Table(title=title or None, show_lines=False, header_style="bold", expand=False,
                  caption=(f"{s.status} · {s.events} events · {s.turns} turn(s) · "
                           f"{s.model_calls} model call(s) "
                           f"{s.model_ms:.0f} ms · {s.tool_calls} tool call(s) {s.tool_ms:.0f} ms · "
                           f"tokens {s.prompt_tokens}+{s.completion_tokens} · {s.wall_s:.2f} s"))
    table.add_column("seq", justify="right")
    table.add_column("+ms", justify="right")
    table.add_column("event")
    table.add_column("detail", overflow="fold")
    for e in events:
        kind = ev.kind_of(e)
        style = "red" if kind in ("run.failed", "model.failed", "tool.failed", "script.failed") else \
            _STYLE.get(kind.split(".")[0], "")
        table.add_row(str(e.seq), f"{(e.ts - t0) * 1000:.0f}", f"[{style}]{kind}[/]" if style else kind,
                      describe(e))
    return table


async def watch(js: JetStreamContext, run_id: str, console: Any, *, as_json: bool = False,
                tokens: bool = False) -> ev.Event | None:
    """Follow a run live on `console`: one line per event and a progress line (what it waits for, turn,
    tool calls, tokens, elapsed) until it ends; returns the terminal event. With `as_json`, JSON lines.

    With `tokens`, the model's output is shown as it is generated, from the run's stream
    (`runtime.streaming`): the stream is subscribed to first and the log read after, so a follower that
    joins late sees what is recorded, then the rest live. Fragments of a request the log already answered
    are dropped (the recorded reply was shown); as JSON, each fragment is a line ``{"delta": {...}}``."""
    started = time.monotonic()
    status = "waiting for a host"
    last: ev.Event | None = None
    turns = tools = tokens_used = 0
    answered: set[str] = set()  # model requests whose reply is in the log
    open_line = False  # model output printed on the current line, not ended yet
    # events and fragments in arrival order; None once the log's terminal event was passed on
    send, receive = anyio.create_memory_object_stream[ev.Event | Delta | None](max_buffer_size=100_000)
    sub = None
    if tokens:
        sub, deltas = await subscribe(js._nc, run_id)

        async def pump() -> None:
            async with deltas:
                async for delta in deltas:
                    await send.send(delta)
    quiet = tokens and not as_json  # a spinner and tokens printed on one line do not mix
    with (nullcontext(_NoStatus()) if quiet else console.status(status)) as progress:
        async with anyio.create_task_group() as tg:
            if sub is not None:
                tg.start_soon(pump)

            async def events() -> None:
                async for event in RunLog(js).follow(run_id):
                    await send.send(event)
                await send.send(None)

            tg.start_soon(events)
            async with receive:
                async for item in receive:
                    if item is None:
                        break
                    if isinstance(item, Delta):
                        if item.request_id in answered or not (item.text or item.tool_call):
                            continue
                        if as_json:
                            print(msgspec.json.encode({"delta": item}).decode(), flush=True)
                        else:
                            fragment = item.text or (
                                f"{item.tool_call.name}(" if item.tool_call and item.tool_call.name else "")
                            fragment += item.tool_call.arguments if item.tool_call else ""
                            console.out(fragment, end="", highlight=False)
                            open_line = True
                        continue
                    event = item
                    last = event
                    kind = ev.kind_of(event)
                    if isinstance(event, ev.ModelResponded | ev.ModelFailed):
                        answered.add(event.request_id)
                    if open_line:
                        console.out("")
                        open_line = False
                    if as_json:
                        print(ev.to_json(event), flush=True)
                    else:
                        console.print(f"[dim]{event.seq:>3}[/] {kind:<17} {describe(event)}", highlight=False)
                    if isinstance(event, ev.TurnCompleted):
                        turns += 1
                    elif isinstance(event, ev.ToolCalled):
                        tools += 1
                    elif isinstance(event, ev.ModelResponded):
                        tokens_used += event.usage.prompt_tokens + event.usage.completion_tokens
                    status = {"model.requested": "waiting for the model", "tool.called": "waiting for tools",
                              "turn.completed": "next turn"}.get(kind, status)
                    progress.update(f"{status} · turn {turns + 1} · {tools} tool call(s) · {tokens_used} "
                                    f"tokens · {time.monotonic() - started:.1f} s")
            tg.cancel_scope.cancel()
    if sub is not None:
        await sub.unsubscribe()
    if not as_json and last is not None:
        ok = isinstance(last, ev.RunCompleted)
        verdict = "[green]completed[/]" if ok else f"[red]{ev.kind_of(last).split('.')[1]}[/]"
        console.print(f"{verdict} in {time.monotonic() - started:.1f} s · {turns} turn(s) · {tools} tool "
                      f"call(s) · {tokens_used} tokens   (sa replay {run_id})")
    return last


class _NoStatus:
    """Stands in for a console status when none is shown."""

    def update(self, _text: str) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------
# verifying
# ---------------------------------------------------------------------------------------------------------

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
_HOST_VERDICTS = frozenset({"unknown_agent", "log_rejected", "bundle_changed", "double_texting"})


def _predicted(state: kernel.State, e: ev.Event) -> bool:
    """True if the runner wrote `e` because `decide` asked for it (rather than the world sending it)."""
    if isinstance(e, ev.ModelRequested | ev.ToolCalled | ev.ApprovalRequested | ev.TurnCompleted
                  | ev.RunCompleted):
        return True
    if isinstance(e, ev.RunFailed):
        return e.reason not in _HOST_VERDICTS
    if isinstance(e, ev.ToolFailed):  # a denial, unless the call was dispatched (its own failure/timeout)
        return state.turn is None or e.call_id not in state.turn.called
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
        case ev.ApprovalGranted() | ev.ApprovalDenied():  # a timeout verdict: due at the time it carries
            if any(ev.same_fact(d, e) for d in kernel.expire(state, e.ts)):
                return None
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


__all__ = ["Summary", "Verification", "describe", "summarize", "timeline", "verify", "watch"]
