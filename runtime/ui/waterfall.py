"""A run's time, as the waterfall page draws it: the spans its traces export, on one time axis.

    view = waterfall(events, now=time.time())   # {"spans": [...], "breakdown": {...}, "t0": ...}

The spans are `runtime.observe.traces.trace_of`'s, the very ones `sa` exports over OTLP (the run, a span per
turn, per model call, per tool call and per sandbox run, with their parents), so the page and a tracing
backend cannot disagree about where a run's time went. Two things are added, both from the same fold:

* spans still open (a running run, a call in flight) are drawn up to `now`, marked `open`: the trace
  builder holds them, it only never exports an unfinished span;
* a wait for a person (`approval.requested` -> its verdict) is a bar of its own under its turn: time that
  belongs to no model and no tool, which a trace shows only as a gap.

`breakdown` answers "where did the time go" without double counting: each kind's bars are merged into
the union of their intervals (parallel tool calls count once), and `other` is wall time covered by no
model call, tool call or approval wait (the host deciding, queues, a worker picking the job up).

Pure: events in, dicts out; no clock but the `now` it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import events as ev
from runtime.observe.traces import AttrValue, Span, TraceBuilder

# the bars' kinds, from a span's `gen_ai.operation.name` and name
KINDS = ("run", "turn", "model", "tool", "script", "approval")
# the attributes a bar's tooltip shows (the rest stay in the trace export)
SHOWN = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
         "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons", "gen_ai.tool.name",
         "gen_ai.tool.call.id", "sa.attempt", "sa.worker", "sa.sandbox_ms", "sa.duration_ms", "sa.latency_ms",
         "sa.tool_calls", "sa.calls_ok", "sa.calls_failed", "sa.status", "error.type", "sa.parse_error")


@dataclass
class Bar:
    """One bar of the waterfall: a span (finished or still open) or an approval wait."""

    id: str
    parent: str | None
    name: str
    kind: str
    start: float
    end: float
    start_seq: int
    end_seq: int | None
    error: str | None = None
    open: bool = False
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)  # things that happened inside (a redelivery)


def kind_of(name: str, attributes: dict[str, AttrValue]) -> str:
    op = attributes.get("gen_ai.operation.name")
    if op == "invoke_agent":
        return "run"
    if op == "chat":
        return "model"
    if op == "execute_tool":
        return "tool"
    if name.startswith("script "):
        return "script"
    return "turn"


def _bar(span: Span) -> Bar:
    return Bar(id=f"{span.span_id:016x}", parent=f"{span.parent_id:016x}" if span.parent_id else None,
               name=span.name, kind=kind_of(span.name, span.attributes), start=span.start, end=span.end,
               start_seq=span.start_seq, end_seq=span.end_seq, error=span.error,
               attributes={k: span.attributes[k] for k in SHOWN if k in span.attributes},
               marks=[{"name": e.name, "ts": e.ts, "attributes": dict(e.attributes)} for e in span.events])


def _open_bars(builder: TraceBuilder, until: float) -> list[Bar]:
    """The spans the builder still holds open (none once the run ended), drawn up to `until`."""
    if builder.done:
        return []
    held = [*([builder.run] if builder.run else []), *builder.turns.values(), *builder.models.values(),
            *builder.tools.values(), *builder.scripts.values()]
    return [Bar(id=f"{o.span_id:016x}", parent=f"{o.parent_id:016x}" if o.parent_id else None, name=o.name,
                kind=kind_of(o.name, o.attributes), start=o.start, end=max(until, o.start),
                start_seq=o.start_seq, end_seq=None, open=True,
                attributes={k: o.attributes[k] for k in SHOWN if k in o.attributes},
                marks=[{"name": e.name, "ts": e.ts, "attributes": dict(e.attributes)} for e in o.events])
            for o in held]


def _approval_bars(events: Sequence[ev.Event], bars: list[Bar], until: float) -> list[Bar]:
    """A bar per approval wait, under the turn span open when it was asked for."""
    turns = sorted((b for b in bars if b.kind == "turn"), key=lambda b: b.start)
    asked: dict[str, ev.ApprovalRequested] = {}
    out: list[Bar] = []
    for e in events:
        if isinstance(e, ev.ApprovalRequested):
            asked[e.call.id] = e
        elif isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied) and e.call_id in asked:
            out.append(_approval_bar(asked.pop(e.call_id), e, turns, e.ts))
    out += [_approval_bar(a, None, turns, until) for a in asked.values()]
    return out


def _approval_bar(asked: ev.ApprovalRequested, verdict: ev.Event | None, turns: list[Bar], end: float) -> Bar:
    parent = next((t.id for t in reversed(turns) if t.start <= asked.ts), None)
    how = "" if verdict is None else "granted" if isinstance(verdict, ev.ApprovalGranted) else "denied"
    attrs: dict[str, AttrValue] = {"gen_ai.tool.name": asked.call.name, "gen_ai.tool.call.id": asked.call.id}
    if asked.role:
        attrs["sa.role"] = asked.role
    if how:
        attrs["sa.verdict"] = how
    return Bar(id=f"approval-{asked.seq}", parent=parent, name=f"approval {asked.call.name}", kind="approval",
               start=asked.ts, end=max(end, asked.ts), start_seq=asked.seq,
               end_seq=verdict.seq if verdict is not None else None, open=verdict is None,
               error="denied" if how == "denied" else None, attributes=attrs)


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """The time covered by `intervals` (seconds), counted once where they overlap, in ms."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return round(total * 1000, 1)


def breakdown(bars: Sequence[Bar]) -> dict[str, float]:
    """Where the run's wall time went, in ms (see the module docstring)."""
    run = next((b for b in bars if b.kind == "run"), None)
    starts = [b.start for b in bars]
    wall = (run.end - run.start) if run else (max(b.end for b in bars) - min(starts)) if bars else 0.0
    kinds = ("model", "tool", "script", "approval")
    spans = {k: [(b.start, b.end) for b in bars if b.kind == k] for k in kinds}
    busy = union_ms([iv for k in ("model", "tool", "approval") for iv in spans[k]])
    out = {"wall_ms": round(wall * 1000, 1), **{f"{k}_ms": union_ms(v) for k, v in spans.items()}}
    out["other_ms"] = round(max(0.0, out["wall_ms"] - busy), 1)
    return out


def _ordered(bars: list[Bar]) -> list[tuple[Bar, int]]:
    """The bars in tree order (a parent before its children, siblings by start), each with its depth."""
    ids = {b.id for b in bars}
    children: dict[str | None, list[Bar]] = {}
    for b in bars:
        children.setdefault(b.parent if b.parent in ids else None, []).append(b)
    out: list[tuple[Bar, int]] = []

    def walk(parent: str | None, depth: int) -> None:
        for b in sorted(children.get(parent, []), key=lambda b: (b.start, b.start_seq, KINDS.index(b.kind))):
            out.append((b, depth))
            if depth < 20:
                walk(b.id, depth + 1)

    walk(None, 0)
    return out


def _tokens(b: Bar) -> dict[str, int] | None:
    given = b.attributes.get("gen_ai.usage.input_tokens")
    taken = b.attributes.get("gen_ai.usage.output_tokens")
    return {"input": given, "output": taken} if isinstance(given, int) and isinstance(taken, int) else None


def waterfall(events: Sequence[ev.Event], *, now: float | None = None) -> dict[str, Any]:
    """The waterfall of a run's events (as stored: spans need no payload); see the module docstring."""
    builder = TraceBuilder()
    finished = [_bar(s) for e in events for s in builder.add(e)]
    last = max((e.ts for e in events), default=0.0)
    until = max(last, now) if now is not None and not builder.done else last
    bars = finished + _open_bars(builder, until)
    bars += _approval_bars(events, bars, until)
    t0 = min((b.start for b in bars), default=min((e.ts for e in events), default=0.0))
    first = events[0] if events else None
    copied = first.source_seq if isinstance(first, ev.RunForked) else 0
    return {
        "t0": t0, "end_ms": round((max((b.end for b in bars), default=t0) - t0) * 1000, 1),
        "ended": builder.done, "forked_at": copied or None,
        "breakdown": breakdown(bars),
        "spans": [{"id": b.id, "parent": b.parent, "name": b.name, "kind": b.kind, "depth": depth,
                   "start_ms": round((b.start - t0) * 1000, 1), "end_ms": round((b.end - t0) * 1000, 1),
                   "duration_ms": round((b.end - b.start) * 1000, 1), "start_seq": b.start_seq,
                   "end_seq": b.end_seq, "error": b.error, "open": b.open, "tokens": _tokens(b),
                   "attributes": b.attributes,
                   "marks": [{**m, "at_ms": round((m["ts"] - t0) * 1000, 1)} for m in b.marks]}
                  for b, depth in _ordered(bars)],
    }


__all__ = ["KINDS", "Bar", "breakdown", "kind_of", "union_ms", "waterfall"]
