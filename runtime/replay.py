"""Reading, rendering, verifying and forking a run's event stream (`sa replay`, host recovery).

    log = await read_run(js, run_id)                 # every event of the run, in order, + stream seqs
    print_timeline(log.events)                       # model requests, tool calls, scripts, durations, tokens
    report = verify(config, log.events)              # re-fold with the kernel: decide reproduces the log?
    forked = fork(log.events, at_seq=5, new_run="rX") # a new run from a past point, no model re-call

Reading uses an ordered push consumer in callback mode on `events.<agent>.<run>.>` (research/nats.md
§3: ~50k events/s, 2.5x faster than fetch), bounded by the run's last stream sequence taken first with a
direct get, so a read is a consistent snapshot even while the run is being appended to. A run id is
found without knowing its agent: `events.*.<run>.>`.

`verify` is the executable form of DESIGN rule 2: the kernel is pure, so folding the recorded events and
asking `decide` at every point must predict every event the runner wrote on its own initiative (model
requests, dispatched calls, denials, turn ends, the run's ending). Events that came from the outside
world (model replies, tool results, script notes, approvals, cancels) are inputs, not predictions: they
must only fold without error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from runtime import events as ev
from runtime import kernel
from runtime.nats.subjects import EVENTS, check_token, run_events_filter

# ---------------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunLog:
    """A run's events in order, the stream sequence of each, and where its subjects live."""

    run_id: str
    agent: str = ""
    events: list[ev.Event] = field(default_factory=list)
    stream_seqs: list[int] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The stream sequence of the run's last event (0: empty) — the OCC expectation of the next append."""
        return self.stream_seqs[-1] if self.stream_seqs else 0


def run_filter(run_id: str, agent: str | None = None) -> str:
    if agent:
        return run_events_filter(agent, run_id)
    return f"events.*.{check_token(run_id, 'run id')}.>"


async def read_run(js: JetStreamContext, run_id: str, agent: str | None = None, *,
                   timeout: float = 30.0, resolve: bool = True) -> RunLog:
    """Every event of `run_id` (empty `RunLog` if there is none). Raises EventDecodeError on a bad event.

    With `resolve` (the default: folding, replay and verify need the real values) an event whose big field
    is in the object store comes back with it (`Payloads.resolve_event`, digest-checked); without it,
    events are as stored, refs included.
    """
    flt = run_filter(run_id, agent)
    try:
        last = await js.get_last_msg(EVENTS, flt, direct=True)
    except NotFoundError:
        return RunLog(run_id, agent or "")
    end = last.seq
    out = RunLog(run_id, agent or (last.subject or "").split(".")[1])
    done = asyncio.get_running_loop().create_future()
    events, seqs = out.events, out.stream_seqs
    failed: list[Exception] = []

    async def on_msg(msg: Any) -> None:  # per message: the least work possible (research/nats.md §3)
        seq = _stream_seq(msg)
        if seq <= end:
            try:
                events.append(ev.decode(msg.data))
                seqs.append(seq)
            except Exception as e:  # raised to the caller below, not into nats-py's callback loop
                failed.append(e)
                seq = end
        if seq >= end and not done.done():
            done.set_result(None)

    sub = await js.subscribe(flt, stream=EVENTS, ordered_consumer=True, cb=on_msg,
                             deliver_policy=DeliverPolicy.ALL)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    if failed:
        raise failed[0]
    if resolve and any(getattr(e, "ref", None) is not None for e in out.events):
        from runtime.payloads import Payloads

        out.events = await Payloads(js).resolve_events(out.events)
    return out


def _stream_seq(msg: Any) -> int:
    """The stream sequence of a JetStream message from its reply subject (`$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>...`, or the longer form with domain and account): `msg.metadata` builds a
    whole metadata object with a timestamp, a quarter of the reader's time per event."""
    tokens = msg.reply.split(".")
    try:
        return int(tokens[5] if len(tokens) == 9 else tokens[Msg.Ack.StreamSeq])
    except (IndexError, ValueError):
        return int(msg.metadata.sequence.stream)


TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled"})


async def follow(js: JetStreamContext, run_id: str, agent: str | None = None) -> AsyncIterator[ev.Event]:
    """Every event of the run from the first, live, ending after its terminal event (`sa send --follow`).

    Works before the run exists: an ordered consumer on the run's subjects waits for its first event.
    """
    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=100_000)

    async def on_msg(msg: Any) -> None:
        send.send_nowait(msg.data)

    sub = await js.subscribe(run_filter(run_id, agent), stream=EVENTS, ordered_consumer=True, cb=on_msg,
                             deliver_policy=DeliverPolicy.ALL)
    try:
        async with receive:
            async for data in receive:
                event = ev.decode(data)
                yield event
                if ev.kind_of(event) in TERMINAL_KINDS:
                    return
    finally:
        await sub.unsubscribe()
        send.close()


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
    """The event's big field, shortened; or where it is when the event (as stored) carries a ref."""
    ref = getattr(event, "ref", None)
    return _ref(ref) if ref is not None else _short(value, width)


def describe(event: ev.Event) -> str:
    """One line saying what an event records (the timeline's detail column, `sa send --follow`)."""
    match event:
        case ev.RunStarted():
            deadline = f"  deadline {event.timeout_s:g}s" if event.timeout_s else ""
            return f"task {_big(event, event.input, 70)}{deadline}  bundle {event.bundle_digest or '-'}"
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
                calls = ", ".join(f"{c.name}({_short(c.arguments, 50)})" for c in event.calls)
                return f"{head}; calls {calls}"
            return f"{head}; says {_big(event, event.content or event.text, 60)}"
        case ev.ModelFailed():
            return f"{event.error_kind}: {_short(event.error, 80)}"
        case ev.ToolCalled():
            return f"{event.call.id.rsplit('/', 1)[-1]} {event.call.name}({_short(event.call.arguments, 60)})"
        case ev.ScriptStarted():
            return f"{event.tool} on {event.worker or 'a worker'}"
        case ev.ScriptPrinted():
            return f"{event.tool}: {_short(event.text, 70)}"
        case ev.ScriptCompleted():
            return f"{event.tool} in {event.duration_ms:.1f} ms"
        case ev.ScriptFailed():
            return f"{event.tool}: {event.error.kind}: {_short(event.error.message, 60)}"
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
            return f"{event.call.name}({_short(event.call.arguments, 60)}) waits for approval"
        case ev.ApprovalGranted() | ev.ApprovalDenied():
            return f"{event.call_id}{' by ' + event.by if event.by else ''}"
    return ""


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
        wall_s=(events[-1].ts - events[0].ts) if events else 0.0)


_STYLE = {"run": "bold", "model": "cyan", "tool": "yellow", "script": "magenta", "turn": "blue",
          "approval": "green"}


def timeline(events: Sequence[ev.Event], *, title: str = "") -> Any:
    """A rich Table: one row per event (seq, time since start, kind, what happened) + a totals caption."""
    from rich.table import Table

    t0 = events[0].ts if events else 0.0
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


async def watch(js: JetStreamContext, run_id: str, console: Any, *, as_json: bool = False) -> ev.Event | None:
    """Follow a run live on `console`: one line per event and a progress line (what it waits for, turn,
    tool calls, tokens, elapsed) until it ends; returns the terminal event. With `as_json`, JSON lines."""
    import time

    started = time.monotonic()
    status = "waiting for a host"
    last: ev.Event | None = None
    turns = tools = tokens = 0
    with console.status(status) as progress:
        async for event in follow(js, run_id):
            last = event
            kind = ev.kind_of(event)
            if as_json:
                print(ev.to_json(event), flush=True)
            else:
                console.print(f"[dim]{event.seq:>3}[/] {kind:<17} {describe(event)}", highlight=False)
            if isinstance(event, ev.TurnCompleted):
                turns += 1
            elif isinstance(event, ev.ToolCalled):
                tools += 1
            elif isinstance(event, ev.ModelResponded):
                tokens += event.usage.prompt_tokens + event.usage.completion_tokens
            status = {"model.requested": "waiting for the model", "tool.called": "waiting for tools",
                      "turn.completed": "next turn"}.get(kind, status)
            progress.update(f"{status} · turn {turns + 1} · {tools} tool call(s) · {tokens} tokens · "
                            f"{time.monotonic() - started:.1f} s")
    if not as_json and last is not None:
        ok = isinstance(last, ev.RunCompleted)
        verdict = "[green]completed[/]" if ok else f"[red]{ev.kind_of(last).split('.')[1]}[/]"
        console.print(f"{verdict} in {time.monotonic() - started:.1f} s · {turns} turn(s) · {tools} tool "
                      f"call(s) · {tokens} tokens   (sa replay {run_id})")
    return last


# ---------------------------------------------------------------------------------------------------------
# verifying
# ---------------------------------------------------------------------------------------------------------

# Events the runner writes on its own initiative, so `decide` must have asked for them.
_PREDICTED = ("model.requested", "tool.called", "approval.requested", "turn.completed", "run.completed",
              "run.failed")


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


def _expected(state: kernel.State, e: ev.Event) -> str | None:
    """None if `decide(state)` asked for event `e`, else why not."""
    effects = kernel.decide(state)
    match e:
        case ev.ModelRequested():
            for f in effects:
                if isinstance(f, kernel.CallModel) and f.id == e.request_id:
                    if tuple(f.new_messages) != tuple(e.messages) or f.context_start != e.context_start:
                        return f"model request {e.request_id}: the recorded prompt differs from the kernel's"
                    return None
        case ev.ToolCalled():
            if any(isinstance(f, kernel.CallTools) and any(c.id == e.call.id for c in f.calls)
                   for f in effects):
                return None
        case ev.ToolFailed():
            if any(isinstance(f, kernel.DenyCall) and f.call.id == e.call_id and f.error == e.error
                   for f in effects):
                return None
        case ev.ApprovalRequested():
            if any(isinstance(f, kernel.RequestApproval) and f.call.id == e.call.id for f in effects):
                return None
        case ev.TurnCompleted():
            if any(isinstance(f, kernel.EndTurn) and f.turn == e.turn and f.calls_ok == e.calls_ok
                   for f in effects):
                return None
        case ev.RunCompleted():
            if any(isinstance(f, kernel.Complete) and f.output == e.output for f in effects):
                return None
        case ev.RunFailed():
            if any(isinstance(f, kernel.Fail) and f.reason == e.reason for f in effects):
                return None
    wanted = ", ".join(type(f).__name__ + f"({getattr(f, 'id', '')})" for f in effects) or "nothing"
    return f"seq {e.seq} {ev.kind_of(e)}: the kernel asked for {wanted}"


def verify(config: kernel.KernelConfig, events: Sequence[ev.Event]) -> Verification:
    """Re-fold `events` with the kernel; check `decide` predicted every event the runner chose to write."""
    out = Verification()
    state = kernel.initial(config)
    for e in events:
        kind = ev.kind_of(e)
        is_outcome = isinstance(e, ev.ToolFailed) and state.turn is not None and (
            e.call_id in state.turn.called)  # a tool's own failure (or a timeout), not a denial
        if kind in _PREDICTED or (isinstance(e, ev.ToolFailed) and not is_outcome):
            if isinstance(e, ev.RunFailed) and e.reason == "unknown_agent":
                out.inputs += 1  # the host's verdict on the task, not the kernel's
            else:
                problem = _expected(state, e)
                out.checked += 1
                if problem:
                    out.problems.append(problem)
        elif kind != "run.started":
            out.inputs += 1
        try:
            state = kernel.evolve(state, e)
        except kernel.EvolveError as exc:
            out.problems.append(f"seq {e.seq} {kind}: {exc}")
            break
    out.final = state
    return out


# ---------------------------------------------------------------------------------------------------------
# forking
# ---------------------------------------------------------------------------------------------------------


def fork(events: Sequence[ev.Event], at_seq: int, new_run: str) -> list[ev.Event]:
    """The first `at_seq` events re-addressed to `new_run`: appended as a new run's log and resumed by a
    host, they continue from that point without calling the model again for the recorded steps."""
    check_token(new_run, "run id")
    return [msgspec.structs.replace(e, run_id=new_run) for e in events[:at_seq]]


__all__ = ["RunLog", "Summary", "Verification", "describe", "follow", "fork", "read_run", "run_filter",
           "summarize", "timeline", "verify", "watch"]
