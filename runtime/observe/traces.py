"""A run's trace, derived from its log alone: pure over events, never from code run a second time.

    builder = TraceBuilder()
    for event in history:                   # in seq order, from `run.started`
        for span in builder.add(event):     # the spans this event ends (a span is done when its end is)
            ...
    spans = trace_of(history)               # the same, all at once

The picture: a run is a trace; its root span is the run (`run.started` -> the terminal event). Below it a
span per turn (its first `model.requested` -> `turn.completed`), and in each turn a span per model call
(`model.requested` -> `model.responded`/`model.failed`) and per tool call (`tool.called` ->
`tool.completed`/`tool.failed`), and below a tool call the script run in the sandbox (`script.started` ->
`script.completed`/`script.failed`: entries of their own in older logs, carried by the call's outcome in
newer ones and read through `events.expand`, so both give the same span). Start and end times are the
events' own `ts`, so a span says when the thing really happened, whoever derives it and whenever.

Why ids are derived, not drawn: an exporter may see an event twice (redelivery after a crash) and several
exporters may share the work, so the same span must get the same id every time it is derived. The trace id
is a hash of the run id; a span's id is a hash of the run id and the seq of the event that starts it (seqs
are unique within a run and never change; a turn and its first model call start at the same event, so the
turn's hash also names its role; a script run carried by its call's outcome starts at that outcome's seq,
and its hash names the role "script"). A collector de-duplicating by id then holds each span once.

Joining a caller's trace: when the task carried a W3C `traceparent` (in its metadata, or as a NATS header
the host copies into `run.started.metadata`), the run's trace id is the caller's and the run span's parent
is the caller's span: the run shows up inside the trace of whatever published the task.

Attributes follow OpenTelemetry's GenAI semantic conventions where one exists (`gen_ai.operation.name`,
`gen_ai.agent.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens`, `gen_ai.tool.name`,
`gen_ai.tool.call.id`, `error.type`, ...); the rest are `sa.*`. A run that ends while spans are still open
(a deadline, a cancel, a crash recorded as `run.failed`) ends them at its terminal event, as errors, so no
span is ever left without an end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanContext, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime import events as ev
from runtime.nats.subjects import TRACEPARENT, TRACESTATE

AttrValue = str | bool | int | float | list[str]

# a request's sampling parameters as GenAI request attributes
_SAMPLING_ATTRS = {"temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p",
                   "top_k": "gen_ai.request.top_k", "max_tokens": "gen_ai.request.max_tokens",
                   "max_completion_tokens": "gen_ai.request.max_tokens", "seed": "gen_ai.request.seed",
                   "frequency_penalty": "gen_ai.request.frequency_penalty",
                   "presence_penalty": "gen_ai.request.presence_penalty"}

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class SpanEvent:
    """Something that happened inside a span (a redelivery of a tool job), at `ts`."""

    name: str
    ts: float
    attributes: dict[str, AttrValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """One finished span. Ids are ints as OpenTelemetry holds them; times are float seconds (event `ts`).
    `start_seq`/`end_seq` are the events that opened and closed it; `parent_id` None is a root (or, with
    `remote_parent`, a child of the caller's span in another process)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start: float
    end: float
    start_seq: int
    end_seq: int
    kind: str = "internal"  # or "client" (a model call leaves the process)
    error: str | None = None  # the status description when the span failed
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    remote_parent: bool = False
    trace_state: str = ""


def trace_id_for(run_id: str) -> int:
    """The trace id of a run that joined no caller's trace: 128 bits of a hash of the run id."""
    return _nonzero(hashlib.blake2b(run_id.encode(), digest_size=16, person=b"sa-trace").digest())


def span_id_for(run_id: str, seq: int, role: str = "") -> int:
    """The id of the span a run's event `seq` starts: 64 bits of a hash of the run id and the seq. The
    one event that starts two spans (a turn's first `model.requested` starts the turn and its first model
    call) names the outer one's `role` ("turn") to keep the two apart."""
    key = f"{run_id}/{seq}/{role}" if role else f"{run_id}/{seq}"
    return _nonzero(hashlib.blake2b(key.encode(), digest_size=8, person=b"sa-span").digest())


def _nonzero(digest: bytes) -> int:
    return int.from_bytes(digest, "big") or 1  # zero means "invalid" in OpenTelemetry


def parent_context(metadata: dict[str, Any]) -> SpanContext | None:
    """The caller's span context from a W3C `traceparent` (and `tracestate`) in a task's metadata, or
    None when there is none or it is malformed (a bad header must not cost the run its trace)."""
    carrier = {k: metadata[k] for k in (TRACEPARENT, TRACESTATE) if isinstance(metadata.get(k), str)}
    if TRACEPARENT not in carrier:
        return None
    ctx = get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return ctx if ctx.is_valid else None


@dataclass
class _Open:
    """A span that has started and not ended yet."""

    name: str
    span_id: int
    parent_id: int | None
    start: float
    start_seq: int
    kind: str = "internal"
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)


class TraceBuilder:
    """Folds one run's events, in seq order, into spans; `add` returns the spans each event ends.

    Pure: no clock, no I/O. Feeding the same events always yields the same spans with the same ids."""

    def __init__(self) -> None:
        self.run_id = ""
        self.trace_id = 0
        self.agent = ""
        self.thread = ""  # `gen_ai.conversation.id`: the actor's thread, when the run is in one
        self.run: _Open | None = None
        self._parent: SpanContext | None = None
        self.turns: dict[int, _Open] = {}
        self.models: dict[str, _Open] = {}  # request id -> open model call
        self.tools: dict[str, _Open] = {}  # call id -> open tool call
        self.scripts: dict[str, _Open] = {}  # call id -> open script run
        self._turn_of_call: dict[str, int] = {}
        self.tokens = [0, 0]
        self.done = False
        self._copied = 0  # a fork: its events below this seq are its source's, exported with the source

    def add(self, event: ev.Event) -> list[Span]:
        """Fold `event`; the spans it ends (often none). A fork's copied events are folded (a span they
        open may end in the fork) but end no span: the work they record was done, and exported, once."""
        parts = ev.expand(event)  # an outcome carrying its script run: the script.* events first
        spans = [span for part in parts for span in self._add(part, virtual=part is not parts[-1])]
        return spans if event.seq >= self._copied else []

    def _add(self, event: ev.Event, *, virtual: bool = False) -> list[Span]:
        if self.done:
            return []
        match event:
            case ev.RunStarted():
                self._started(event)
            case ev.ModelRequested():
                self._model_requested(event)
            case ev.ModelResponded() | ev.ModelFailed():
                return self._model_ended(event)
            case ev.ToolCalled():
                self.tools[event.call.id] = self._open(
                    f"execute_tool {event.call.name}", event, self._turn_id(event.call.id),
                    _tool_attrs(event.call.name, event.call.id))
            case ev.ScriptStarted():
                self._script_started(event, role="script" if virtual else "")
            case ev.ScriptCompleted() | ev.ScriptFailed():
                return self._script_ended(event)
            case ev.ToolRedelivered():
                self._redelivered(event)
            case ev.ToolCompleted() | ev.ToolFailed():
                return self._tool_ended(event)
            case ev.TurnCompleted():
                return self._turn_ended(event)
            case ev.RunCompleted() | ev.RunFailed() | ev.RunCancelled():
                return self._ended(event)
        return []  # nothing ended (approvals and printed lines neither start nor end a span)

    def _model_requested(self, event: ev.ModelRequested) -> None:
        turn = self.turns.get(event.turn)
        if turn is None:
            turn = self.turns[event.turn] = self._open(
                f"turn {event.turn}", event, self._root_id(), {"sa.turn": event.turn}, role="turn")
        attrs: dict[str, AttrValue] = {"gen_ai.operation.name": "chat", "sa.turn": event.turn,
                                       "sa.attempt": event.attempt, "sa.request_id": event.request_id,
                                       "gen_ai.provider.name": event.provider or "openai"}
        if self.thread:
            attrs["gen_ai.conversation.id"] = self.thread
        if event.dialect:  # the request dialect spoken (`runtime.model.dialects`); unconstrained when said
            attrs["sa.dialect"] = event.dialect
        if event.unconstrained:
            attrs["sa.unconstrained"] = True
        host, _, port = event.server.rpartition(":")
        if host and port.isdigit():
            attrs["server.address"], attrs["server.port"] = host, int(port)
        for key, attribute in _SAMPLING_ATTRS.items():
            value = event.sampling.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attrs[attribute] = value
        model = self.models[event.request_id] = self._open("chat", event, turn.span_id, attrs, kind="client")
        if event.sampling.get("model"):
            model.attributes["gen_ai.request.model"] = str(event.sampling["model"])

    def _script_started(self, event: ev.ScriptStarted, role: str) -> None:
        """A script run opens: `role` "script" when it is a virtual event (`events.expand`), whose seq is
        its outcome's, so the span's id stays apart from anything else that seq could start."""
        tool = self.tools.get(event.call_id)
        parent = tool.span_id if tool else self._turn_id(event.call_id)
        self.scripts[event.call_id] = self._open(f"script {event.tool}", event, parent, {
            "gen_ai.tool.name": event.tool, "sa.worker": event.worker}, role=role)

    def _script_ended(self, event: ev.ScriptCompleted | ev.ScriptFailed) -> list[Span]:
        script = self.scripts.pop(event.call_id, None)
        if script is None:
            return []
        script.attributes["sa.sandbox_ms"] = event.duration_ms
        if event.duration_ms > 0:  # the worker's own clock: the run began duration_ms before it ended
            script.start = min(script.start, event.ts - event.duration_ms / 1000.0)
        error = _error(script, event.error) if isinstance(event, ev.ScriptFailed) else None
        return [self._close(script, event, error)]

    def _redelivered(self, event: ev.ToolRedelivered) -> None:
        tool = self.tools.get(event.call_id)
        if tool is not None:
            tool.events.append(SpanEvent("tool.redelivered", event.ts, {
                "sa.attempt": event.attempt, "sa.worker": event.worker, "sa.earlier": list(event.earlier)}))

    def _turn_ended(self, event: ev.TurnCompleted) -> list[Span]:
        turn = self.turns.pop(event.turn, None)
        if turn is None:
            return []
        turn.attributes.update({"sa.calls_ok": event.calls_ok, "sa.calls_failed": event.calls_failed})
        return [self._close(turn, event, None)]

    # -- spans ------------------------------------------------------------------------------------------

    def _started(self, event: ev.RunStarted) -> None:
        self.run_id, self.agent = event.run_id, event.actor.partition(":")[0]
        forked = isinstance(event, ev.RunForked)
        # a fork is its own trace (an operator's "what if", not the publisher's request), and so is a
        # regression run (its task's metadata is its source's, traceparent and all: never the caller's trace)
        self._parent = None if forked or event.regression else parent_context(event.metadata)
        self.trace_id = self._parent.trace_id if self._parent else trace_id_for(event.run_id)
        attrs: dict[str, AttrValue] = {"gen_ai.operation.name": "invoke_agent",
                                       "gen_ai.agent.name": self.agent, "sa.run_id": event.run_id,
                                       "sa.actor": event.actor}
        if event.task_id:
            attrs["sa.task_id"] = event.task_id
        if event.thread:
            self.thread = attrs["gen_ai.conversation.id"] = f"{event.actor}/{event.thread}"
        if event.bundle_digest:
            attrs["sa.bundle_digest"] = event.bundle_digest
        if isinstance(event, ev.RunForked):
            attrs["sa.forked_from"], attrs["sa.forked_at"] = event.source_run, event.source_seq
            self._copied = event.source_seq
        if event.regression is not None:
            attrs["sa.regression_of"] = event.regression.source_run
            attrs["sa.regression_set"] = event.regression.set
        parent = self._parent.span_id if self._parent else None
        self.run = _Open(f"invoke_agent {self.agent}", span_id_for(event.run_id, event.seq), parent, event.ts,
                         event.seq, attributes=attrs)

    def _open(self, name: str, event: ev.Event, parent: int | None, attrs: dict[str, AttrValue], *,
              kind: str = "internal", role: str = "") -> _Open:
        return _Open(name, span_id_for(event.run_id, event.seq, role), parent, event.ts, event.seq, kind,
                     attributes=attrs)

    def _close(self, span: _Open, event: ev.Event, error: str | None) -> Span:
        root = span is self.run
        return Span(name=span.name, trace_id=self.trace_id, span_id=span.span_id, parent_id=span.parent_id,
                    start=span.start, end=max(event.ts, span.start), start_seq=span.start_seq,
                    end_seq=event.seq, kind=span.kind, error=error, attributes=span.attributes,
                    events=tuple(span.events), remote_parent=root and self._parent is not None,
                    trace_state=self._parent.trace_state.to_header() if root and self._parent else "")

    def _root_id(self) -> int | None:
        return self.run.span_id if self.run else None

    def _turn_id(self, call_id: str) -> int | None:
        number = self._turn_of_call.get(call_id)
        turn = self.turns.get(number) if number is not None else None
        if turn is None and self.turns:
            turn = self.turns[max(self.turns)]
        return turn.span_id if turn else self._root_id()

    def _model_ended(self, event: ev.ModelResponded | ev.ModelFailed) -> list[Span]:
        model = self.models.pop(event.request_id, None)
        if model is None:
            return []
        if isinstance(event, ev.ModelFailed):
            model.attributes["error.type"] = event.error_kind
            return [self._close(model, event, event.error)]
        for call in event.calls:
            self._turn_of_call[call.id] = event.turn
        if event.response_id:
            model.attributes["gen_ai.response.id"] = event.response_id
        if event.model:
            model.name = f"chat {event.model}"
            model.attributes["gen_ai.response.model"] = event.model
            model.attributes.setdefault("gen_ai.request.model", event.model)
        usage = event.usage
        self.tokens[0] += usage.prompt_tokens
        self.tokens[1] += usage.completion_tokens
        model.attributes.update({"gen_ai.usage.input_tokens": usage.prompt_tokens,
                                 "gen_ai.usage.output_tokens": usage.completion_tokens,
                                 "sa.latency_ms": event.latency_ms, "sa.tool_calls": len(event.calls)})
        if event.finish_reason:
            model.attributes["gen_ai.response.finish_reasons"] = [event.finish_reason]
        if event.parse_error is not None:
            model.attributes["sa.parse_error"] = event.parse_error
        return [self._close(model, event, None)]

    def _tool_ended(self, event: ev.ToolCompleted | ev.ToolFailed) -> list[Span]:
        tool = self.tools.pop(event.call_id, None)
        if tool is None:  # refused before it ran (a policy, a denial, an unknown tool): an instant span
            tool = self._open(f"execute_tool {event.tool}", event, self._turn_id(event.call_id),
                              _tool_attrs(event.tool, event.call_id))
        tool.attributes["sa.duration_ms"] = event.duration_ms
        error = _error(tool, event.error) if isinstance(event, ev.ToolFailed) else None
        return [self._close(tool, event, error)]

    def _ended(self, event: ev.RunCompleted | ev.RunFailed | ev.RunCancelled) -> list[Span]:
        """The run's end: every span still open ends here (as an error: it was cut short), then the run."""
        self.done = True
        kind = ev.kind_of(event)
        out = [self._close(s, event, f"the run ended ({kind}) before this did")
               for group in (self.scripts, self.tools, self.models, self.turns) for s in group.values()]
        if self.run is None:
            return out
        attrs = self.run.attributes
        attrs["sa.status"] = kind.removeprefix("run.")
        attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"] = self.tokens
        error: str | None = None
        if isinstance(event, ev.RunFailed):
            attrs["error.type"] = event.reason
            error = f"{event.reason}: {event.detail}" if event.detail else event.reason
        elif isinstance(event, ev.RunCancelled):
            attrs["error.type"] = "cancelled"
            error = f"cancelled{' by ' + event.by if event.by else ''}: {event.reason}"
        return [*out, self._close(self.run, event, error)]


def _tool_attrs(tool: str, call_id: str) -> dict[str, AttrValue]:
    return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id}


def _error(span: _Open, error: Any) -> str:
    span.attributes["error.type"] = error.kind
    return str(error.message or error.kind)


def trace_of(events: list[ev.Event]) -> list[Span]:
    """Every finished span of a run's events (in seq order), in the order they end."""
    builder = TraceBuilder()
    return [span for event in events for span in builder.add(event)]


def render_tree(spans: list[Span]) -> str:
    """The spans as an indented tree with offsets and durations in ms, children in start order: how
    the README shows a trace, and a readable diff when a test's expected tree differs."""
    children: dict[int | None, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    t0 = min((s.start for s in spans), default=0.0)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: (s.start, s.start_seq)):
            if s.span_id == parent:
                continue
            mark = f"  ERROR {s.attributes.get('error.type', '')}".rstrip() if s.error else ""
            lines.append(f"{'  ' * depth}{s.name}  +{(s.start - t0) * 1000:.1f}ms "
                         f"{(s.end - s.start) * 1000:.1f}ms{mark}")
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


__all__ = ["Span", "SpanEvent", "TraceBuilder", "parent_context", "render_tree",
           "span_id_for", "trace_id_for", "trace_of"]
