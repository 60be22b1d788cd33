"""`sa otel`: every run's trace, exported over OTLP as its spans end, off the hosts' path.

    exporter = TraceExporter(js, OTLPSpanExporter(endpoint=url))
    await exporter.run(stop)

What it reads: the EVENTS stream through its own durable consumer (`RunLog.tail`), so the hosts do nothing
for it (they never know it exists), it resumes after a crash from the first event it had not acked, and
several exporters sharing the durable split the events between them for availability.

When a span is sent: when the event that ends it arrives (`traces.TraceBuilder`: `model.responded` ends a
model call, `run.completed` the run ...). The spans of a batch of events are exported together and the
events acked only after the receiver accepted them, so a crash between the two sends those spans again on
redelivery, with the same ids (`traces.span_id_for`): a collector de-duplicating by id holds each span
once, and none is missing.

Seeing a run's events out of order (a redelivery after a crash, or another exporter having taken the
run's earlier events) is normal: an exporter folds each run's events it has seen in seq order, and when
an event comes after a gap it reads the run's log up to there (`RunLog.read`) and folds that instead. So
every end event yields exactly the spans the whole log says it ends, whoever handles it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import anyio
from nats.js import JetStreamContext
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as OtelEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from runtime import events as ev
from runtime.log import TERMINAL_KINDS, RunLog, Tail, Tailed
from runtime.observe.traces import Span, TraceBuilder

log = logging.getLogger("runtime.observe")

DEFAULT_DURABLE = "sa-otel"
RETRY_S = 2.0  # a batch the receiver refused comes back this late
SERVICE = "structured-agents"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for `endpoint`: a collector's base URL gets `/v1/traces` (as
    OTEL_EXPORTER_OTLP_ENDPOINT does), a URL already ending in it is kept. ValueError says what is wrong."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--endpoint {endpoint!r} is not an http(s) URL; pass the collector's OTLP/HTTP "
                         f"address, e.g. http://otel-collector:4318")
    return endpoint if parts.path.endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"


def readable(span: Span, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """`span` as the OpenTelemetry SDK's finished span, for any `SpanExporter` (times in ns)."""
    state = TraceState.from_header([span.trace_state]) if span.trace_state else None
    context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=_SAMPLED,
                          trace_state=state)
    parent = (SpanContext(span.trace_id, span.parent_id, is_remote=span.remote_parent, trace_flags=_SAMPLED,
                          trace_state=state)
              if span.parent_id is not None else None)
    return ReadableSpan(
        span.name, context=context, parent=parent, resource=resource, attributes=span.attributes,
        events=[OtelEvent(e.name, e.attributes, timestamp=_ns(e.ts)) for e in span.events],
        kind=SpanKind.CLIENT if span.kind == "client" else SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, span.error) if span.error is not None else Status(StatusCode.UNSET),
        start_time=_ns(span.start), end_time=_ns(span.end), instrumentation_scope=scope)


def _ns(ts: float) -> int:
    return round(ts * 1e9)


@dataclass
class _RunTrace:
    """One run as this exporter has folded it: the spans each seq ended, for seqs 0..len-1."""

    builder: TraceBuilder = field(default_factory=TraceBuilder)
    ended: list[list[Span]] = field(default_factory=list)

    def feed(self, event: ev.Event) -> None:
        self.ended.append(self.builder.add(event))


@dataclass
class ExporterStats:
    events: int = 0
    spans: int = 0
    batches: int = 0
    refused: int = 0  # batches the receiver refused (sent again later)
    log_reads: int = 0  # runs read from the log after a gap
    bad: int = 0  # undecodable events (terminated)


class TraceExporter:
    """Follows EVENTS through the durable `durable` and exports every span as its end event arrives."""

    def __init__(self, js: JetStreamContext, exporter: SpanExporter, *, durable: str = DEFAULT_DURABLE,
                 batch: int = 256, ack_wait: float = 30.0, max_runs: int = 10_000) -> None:
        self.js, self.exporter, self.durable = js, exporter, durable
        self.batch, self.ack_wait, self.max_runs = batch, ack_wait, max_runs
        self.log = RunLog(js)
        self.stats = ExporterStats()
        self.runs: OrderedDict[str, _RunTrace] = OrderedDict()  # least recently seen first
        from runtime import __version__

        self.resource = Resource.create({"service.name": SERVICE, "service.version": __version__})
        self.scope = InstrumentationScope("runtime.observe", __version__)
        self.ready = anyio.Event()

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Export until `stop` is set; the batch in hand is finished (exported and acked) first."""
        stop = stop or anyio.Event()
        tail = await self.log.tail(self.durable, ack_wait=self.ack_wait,
                                   max_pending=max(1024, 4 * self.batch))
        self.ready.set()
        try:
            while not stop.is_set():
                await self.step(tail)
        finally:
            with anyio.CancelScope(shield=True):
                await tail.close()

    async def step(self, tail: Tail, timeout: float = 1.0) -> int:
        """Fetch, fold, export and ack one batch; how many events it held."""
        items = await tail.fetch(self.batch, timeout)
        if not items:
            return 0
        spans: list[Span] = []
        handled: list[Tailed] = []
        for item in items:
            if item.event is None:
                self.stats.bad += 1
                log.error("an event on EVENTS cannot be decoded, skipped: %s", item.error)
                await item.term()
                continue
            spans += await self.ended_by(item.event)
            handled.append(item)
        if spans:
            batch = [readable(s, self.resource, self.scope) for s in spans]
            result = await anyio.to_thread.run_sync(self.exporter.export, batch)
            if result is not SpanExportResult.SUCCESS:
                self.stats.refused += 1
                log.warning("the OTLP receiver refused %d span(s); their %d event(s) come back in %.0f s",
                            len(spans), len(handled), RETRY_S)
                for item in handled:
                    await item.nak(delay=RETRY_S)
                return len(items)
        for item in handled:
            await item.ack()
        self.stats.events += len(handled)
        self.stats.spans += len(spans)
        self.stats.batches += 1
        return len(items)

    async def ended_by(self, event: ev.Event) -> list[Span]:
        """The spans `event` ends, as the run's whole log up to it says (see the module docstring)."""
        run = self.runs.get(event.run_id)
        if run is None:
            run = self.runs[event.run_id] = _RunTrace()
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(event.run_id)
        if event.seq == len(run.ended):
            run.feed(event)
        elif event.seq > len(run.ended):  # a gap: what came before is in the log
            self.stats.log_reads += 1
            history = await self.log.read(event.run_id, event.actor or None, resolve=False)
            for earlier in history.events[len(run.ended):]:
                run.feed(earlier)
            if event.seq == len(run.ended):  # not in the snapshot (purged meanwhile): this event only
                run.feed(event)
        spans = run.ended[event.seq] if event.seq < len(run.ended) else []
        if ev.kind_of(event) in TERMINAL_KINDS and event.seq == len(run.ended) - 1:
            del self.runs[event.run_id]  # a late redelivery of this run reads the log again
        return spans

    def shutdown(self) -> None:
        self.exporter.shutdown()


def otlp_exporter(endpoint: str, *, timeout: float = 10.0) -> SpanExporter:
    """The OTLP/HTTP (protobuf) span exporter for a collector at `endpoint` (see `traces_url`)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=timeout)


__all__ = ["DEFAULT_DURABLE", "ExporterStats", "TraceExporter", "otlp_exporter", "readable", "traces_url"]
