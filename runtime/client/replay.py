"""Seeing a run: the rendered timeline and the live view (`sa replay`, `sa send --follow`).

    history = await client.get(run_id).history()    # the events (runtime.client)
    console.print(timeline(history.events))          # model requests, tool calls, scripts, durations, tokens
    await watch(client.get(run_id), console)         # the run live, until it ends

Each event's one-line detail is `runtime.client.describe`'s; checking a run against the kernel is
`runtime.client.verify`'s. Both views show a call's script run as its `script.*` events (`events.expand`),
whether the log holds them as entries (older logs) or inside the call's outcome; such a virtual event shows
the seq of the entry that holds it, and the totals count log entries only. The live view also shows a tool
job still running before its outcome is in the log, from the worker's notice (`runtime.streaming`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import aclosing, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from runtime import events as ev
from runtime.client.describe import describe
from runtime.client.terminal import printable, shown
from runtime.streaming import Delta, ScriptRunning

if TYPE_CHECKING:
    from runtime.client.handle import RunHandle

# ---------------------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------------------


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
    """When a run's clock starts: its first event; for a fork, when the fork was made (its `run.forked`),
    so its wall time is its own, as the runs index counts it, and the events it kept from its source show
    as before that (negative offsets), not as a delay of the fork."""
    if not events:
        return 0.0
    first = next((e for e in events if e.seq == 0), events[0])
    return first.ts if isinstance(first, ev.RunForked) else min(e.ts for e in events)


_STYLE = {"run": "bold", "model": "cyan", "tool": "yellow", "script": "magenta", "turn": "blue",
          "approval": "green", "timer": "blue"}
_ENDINGS = ("run.completed", "run.failed", "run.cancelled")
_FAILED = ("run.failed", "model.failed", "tool.failed", "script.failed")


def _style(kind: str) -> str:
    return "red" if kind in _FAILED else _STYLE.get(kind.split(".")[0], "")


def timeline(events: Sequence[ev.Event], *, title: str = "") -> Any:
    """A rich Table: one row per event (seq, time since start, kind, what happened) + a totals caption
    (counting log entries: a script run carried by its call's outcome is its rows, under the outcome's seq).
    Every cell is `shown`: what a run recorded (a task, a reply holding `[/INST]` or an escape sequence)
    is shown as written, never read as rich markup nor obeyed by the terminal."""
    from rich.table import Table
    from rich.text import Text

    t0 = _t0(events)
    s = summarize(events)
    table = Table(title=shown(title) if title else None, show_lines=False, header_style="bold", expand=False,
                  caption=Text(f"{s.status} · {s.events} events · {s.turns} turn(s) · "
                               f"{s.model_calls} model call(s) "
                               f"{s.model_ms:.0f} ms · {s.tool_calls} tool call(s) {s.tool_ms:.0f} ms · "
                               f"tokens {s.prompt_tokens}+{s.completion_tokens} · {s.wall_s:.2f} s"))
    table.add_column("seq", justify="right")
    table.add_column("+ms", justify="right")
    table.add_column("event")
    table.add_column("detail", overflow="fold")
    ended = False
    for e in ev.expand_all(events):
        kind = ev.kind_of(e)
        detail = shown(describe(e))
        if ended:  # a stopped job's own account, appended after the run ended: it explains, changes nothing
            detail.append("  (reported after the run ended)", style="dim")
        table.add_row(str(e.seq), f"{(e.ts - t0) * 1000:.0f}", Text(kind, style=_style(kind)), detail)
        ended = ended or kind in _ENDINGS
    return table


def event_line(event: ev.Event) -> Any:
    """One event as `sa send --follow` prints it: seq, kind, what happened (`shown`: data is neither markup
    nor terminal commands)."""
    from rich.text import Text

    kind = ev.kind_of(event)
    line = Text.assemble((f"{event.seq:>3}", "dim"), " ", (f"{kind:<17}", _style(kind)), " ")
    line.append(printable(describe(event)))
    return line


class _Live:
    """The model's output as `watch` prints it: fragments on one line, a streamed tool call shown as
    `name(arguments)` and closed when its arguments end (another call or text starts, the request is
    done, or an event is printed)."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.line_open = False  # output printed on the current line, not ended yet
        self.call: tuple[str, int] | None = None  # the (request, index) of the call whose `(` is open

    def _out(self, text: str) -> None:
        self.console.out(printable(text), end="", highlight=False)
        self.line_open = True

    def close_call(self) -> None:
        if self.call is not None:
            self._out(")")
            self.call = None

    def end_line(self) -> None:
        self.close_call()
        if self.line_open:
            self.console.out("")
            self.line_open = False

    def show(self, delta: Delta) -> None:
        if delta.done:
            self.end_line()
            return
        if delta.attempt:  # a retried attempt writes the reply again: on a line of its own
            self.end_line()
            self.console.out(f"(attempt {delta.attempt}: the model server is asked again)", highlight=False)
            return
        if delta.tool_call is not None:
            call = (delta.request_id, delta.tool_call.index)
            if self.call != call:
                self.close_call()
                if self.line_open:
                    self._out(" ")
                self._out(f"{delta.tool_call.name}(")
                self.call = call
            self._out(delta.tool_call.arguments)
        if delta.text:
            self.close_call()
            self._out(delta.text)


def notice_line(notice: ScriptRunning, now: float | None = None) -> Any:
    """A job still running (`runtime.streaming`) as `sa send --follow` prints it, among the events: no seq
    (it is not in the log; the call's outcome will carry the script run)."""
    from rich.text import Text

    running = max(0.0, (time.time() if now is None else now) - notice.started)
    again = f", delivery {notice.attempt}" if notice.attempt > 1 else ""
    line = Text.assemble(("  ·", "dim"), " ", (f"{'script.started':<17}", _style("script.started")), " ")
    line.append(f"{notice.tool} on {notice.worker}{again} (running {running:.0f} s…)")
    return line


class _Progress:
    """The progress line of `watch`: what the run waits for, turn, tool calls, tokens, elapsed, and each
    tool job still running with its worker and time so far (until its outcome is read)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.status = "waiting for a host"
        self.turns = self.tools = self.tokens = 0
        self.running: dict[str, ScriptRunning] = {}  # call -> the notice of its job

    def saw(self, event: ev.Event) -> None:
        if isinstance(event, ev.TurnCompleted):
            self.turns += 1
        elif isinstance(event, ev.ToolCalled):
            self.tools += 1
        elif isinstance(event, ev.ModelResponded):
            self.tokens += event.usage.prompt_tokens + event.usage.completion_tokens
        elif isinstance(event, ev.ToolCompleted | ev.ToolFailed):
            self.running.pop(event.call_id, None)
        self.status = {"model.requested": "waiting for the model", "tool.called": "waiting for tools",
                       "turn.completed": "next turn"}.get(ev.kind_of(event), self.status)

    def text(self) -> str:
        now = time.time()
        jobs = "".join(f" · {n.tool} running on {n.worker} for {now - n.started:.0f} s"
                       for n in self.running.values())
        return (f"{self.status}{jobs} · turn {self.turns + 1} · {self.tools} tool call(s) · {self.tokens} "
                f"tokens · {time.monotonic() - self.started:.1f} s")


async def watch(handle: RunHandle, console: Any, *, as_json: bool = False,
                tokens: bool = False) -> ev.Event | None:
    """Follow a run live on `console`: one line per event and a progress line (what it waits for, turn,
    tool calls, tokens, elapsed) until it ends; returns the terminal event. With `as_json`, JSON lines.

    A tool job still running a moment after it began is a line of its own, ``script.started <tool> on
    <worker> (running N s…)``, and in the progress line with its time so far until its outcome (as JSON:
    ``{"script": {...}}``; `runtime.streaming`: the log holds the script run only in the outcome).
    With `tokens`, the model's output is shown as it is generated, among the events in the order
    `RunHandle.live` gives (a request's fragments after its `model.requested`, before its reply); as
    JSON, each fragment is a line ``{"delta": {...}}``."""
    last: ev.Event | None = None
    live = _Live(console)
    state = _Progress()
    quiet = tokens and not as_json  # a spinner and tokens printed on one line do not mix
    with (nullcontext(_NoStatus()) if quiet else console.status(state.status)) as progress:
        async with anyio.create_task_group() as tg:
            async def tick() -> None:  # the times of jobs still running go on between events
                while True:
                    await anyio.sleep(1.0)
                    progress.update(state.text())

            tg.start_soon(tick)
            async with aclosing(handle.live(tokens=tokens)) as items:
                async for item in items:
                    if isinstance(item, Delta):
                        if as_json and (item.text or item.tool_call):
                            print(msgspec.json.encode({"delta": item}).decode(), flush=True)
                        elif not as_json:
                            live.show(item)
                        continue
                    if isinstance(item, ScriptRunning):
                        state.running[item.call_id] = item
                        if as_json:
                            print(msgspec.json.encode({"script": item}).decode(), flush=True)
                        else:
                            live.end_line()
                            console.print(notice_line(item), highlight=False)
                        progress.update(state.text())
                        continue
                    event = last = item
                    live.end_line()
                    if as_json:  # the log as stored
                        print(ev.to_json(event), flush=True)
                    else:
                        for part in ev.expand(event):
                            console.print(event_line(part), highlight=False)
                    state.saw(event)
                    progress.update(state.text())
            tg.cancel_scope.cancel()
    live.end_line()
    if not as_json and last is not None:
        from rich.text import Text

        ok = isinstance(last, ev.RunCompleted)
        verdict = Text("completed", "green") if ok else Text(ev.kind_of(last).split(".")[1], "red")
        took = time.monotonic() - state.started
        console.print(verdict + Text(f" in {took:.1f} s · {state.turns} turn(s) · {state.tools} tool "
                                     f"call(s) · {state.tokens} tokens   (sa replay {handle.run_id})"),
                      highlight=False)
    return last


class _NoStatus:
    """Stands in for a console status when none is shown."""

    def update(self, _text: str) -> None:
        pass


__all__ = ["Summary", "describe", "event_line", "notice_line", "summarize", "timeline", "watch"]
