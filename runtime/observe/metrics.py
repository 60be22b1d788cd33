"""Prometheus metrics of hosts, workers and the scheduled audit: `sa host --metrics-port N`, `sa worker
--metrics-port N`, `sa audit --every 1h --metrics-port N` (`AuditMetrics`).

    metrics = HostMetrics()
    host = Host(nc, agents, on_event=metrics.observe)   # counters from the events the host appends
    metrics.watch_host(host)                             # gauges read when Prometheus scrapes
    serve_metrics(9464, metrics.registry)                # GET /metrics, from a thread of its own

What a host counts comes from the events it appends anyway (the `on_event` hook), so a turn pays a few
dict lookups and counter increments, never a round trip; the gauges (partitions owned, runs in flight,
tasks waiting) are read from the host's own structures at scrape time, in the scrape thread. A worker's
come from its counters (`WorkerStats`, read at scrape time) and one call per finished job
(`Worker.on_outcome`). Queue depths and dead letters are the TASKS, TOOLS and DLQ message counts, read
from NATS by a poll every `QUEUE_POLL_S` beside the process's work (`poll_queues`), never inline.

The names are the contract with the dashboard (`deploy/grafana/structured-agents.json`, checked against
`metric_names()` by the tests). Labels stay bounded: `agent` is the bundle (never `bundle:instance`), and
once the host is watched only a bundle it serves: a task for an agent no bundle defines still makes a run
(`run.started`, `run.failed` unknown_agent), and counting it under its own name would let any publisher add
a series per made-up name; it counts under `UNKNOWN_AGENT`. `tool` is a tool name, `error_kind` one of the
kinds of rule 7, `reason` how a run failed. The only per-run state, a turn's start time, is dropped when the
turn or the run ends, and bounded for runs this host stopped driving mid-turn (handed over, superseded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Any

import anyio
from nats.js import JetStreamContext
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime import events as ev
from runtime.jobs import ToolOutcome
from runtime.nats.subjects import DLQ, TASKS, TOOLS

log = logging.getLogger("runtime.observe")

QUEUE_POLL_S = 10.0
# seconds: a zero-latency model call is ~1 ms, a real one seconds, a long turn minutes
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


UNKNOWN_AGENT = "<unknown>"  # the `agent` of a bundle the host does not serve (no bundle name holds a '>')
MAX_OPEN_TURNS = 65_536  # turns timed at once; a host drives `max_runs` (256 by default) runs at a time


class QueueMetrics:
    """Queue depths and dead letters, as last polled from NATS (`poll_queues`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge("sa_queue_depth", "Messages waiting in a work queue stream (tasks: not yet "
                           "started; tools: jobs not yet finished)", ["queue"], registry=registry)
        self.dead_letters = Gauge("sa_dead_letters", "Messages in the DLQ stream", registry=registry)

    async def poll_once(self, js: JetStreamContext) -> None:
        """Read the TASKS, TOOLS and DLQ message counts (three stream info requests)."""
        for stream, queue in ((TASKS, "tasks"), (TOOLS, "tools")):
            self.depth.labels(queue).set((await js.stream_info(stream)).state.messages)
        self.dead_letters.set((await js.stream_info(DLQ)).state.messages)

    async def poll(self, js: JetStreamContext, stop: anyio.Event, every: float = QUEUE_POLL_S) -> None:
        """`poll_once` every `every` seconds until `stop` (NATS trouble keeps the last values)."""
        while not stop.is_set():
            try:
                await self.poll_once(js)
            except Exception as e:
                log.debug("polling queue depths: %s", e)
            with anyio.move_on_after(every):
                await stop.wait()


class HostMetrics:
    """A host's metrics: counters and histograms from its events (`observe`), gauges from the host."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or _process_registry()
        self.runs_started = Counter("sa_runs_started", "Runs started", ["agent"], registry=r)
        self.runs_completed = Counter("sa_runs_completed", "Runs that completed", ["agent"], registry=r)
        self.runs_failed = Counter("sa_runs_failed", "Runs that failed, by reason", ["agent", "reason"],
                                   registry=r)
        self.runs_cancelled = Counter("sa_runs_cancelled", "Runs cancelled", ["agent"], registry=r)
        self.turn_seconds = Histogram("sa_turn_duration_seconds", "A turn, from its first model request "
                                      "to turn.completed", ["agent"], buckets=LATENCY_BUCKETS, registry=r)
        self.model_seconds = Histogram("sa_model_call_duration_seconds", "A model call as the client timed "
                                       "it (retries included)", ["agent"], buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.model_failed = Counter("sa_model_calls_failed", "Model calls that produced no reply",
                                    ["agent", "error_kind"], registry=r)
        self.tokens = Counter("sa_model_tokens", "Tokens the model server reported", ["agent", "type"],
                              registry=r)
        self.tool_seconds = Histogram("sa_tool_call_duration_seconds", "A tool call's duration as recorded "
                                      "in its outcome", ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.tool_failed = Counter("sa_tool_calls_failed", "Tool calls that ended in an error value",
                                   ["tool", "error_kind"], registry=r)
        self.sandbox_seconds = Histogram("sa_sandbox_duration_seconds", "A script's time in the Monty "
                                         "sandbox", ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.queues = QueueMetrics(r)
        self._turns: dict[str, tuple[int, float]] = {}  # run id -> (open turn, when it started); oldest first
        self._served: Container[str] | None = None  # the host's bundles, once `watch_host` is called

    def _agent(self, actor: str) -> str:
        """The `agent` label of `actor`: its bundle, or `UNKNOWN_AGENT` for one the watched host does not
        serve (see the module docstring)."""
        bundle = actor.partition(":")[0]
        if self._served is not None and bundle not in self._served:
            return UNKNOWN_AGENT
        return bundle

    def observe(self, event: ev.Event) -> None:
        """Count one appended event (the host's `on_event` hook): a few dict lookups, no I/O."""
        match event:
            case ev.ModelRequested():
                self._turn_opened(event)
            case ev.ModelResponded():
                self._responded(event)
            case ev.ModelFailed():
                self.model_failed.labels(self._agent(event.actor), event.error_kind).inc()
            case ev.ToolCompleted() | ev.ToolFailed():
                self._tool_ended(event)
            case ev.ScriptCompleted() | ev.ScriptFailed():  # a log from before the outcome carried its script
                self.sandbox_seconds.labels(event.tool).observe(event.duration_ms / 1000.0)
            case ev.TurnCompleted():
                turn = self._turns.pop(event.run_id, None)
                if turn is not None and turn[0] == event.turn:
                    self.turn_seconds.labels(self._agent(event.actor)).observe(max(0.0, event.ts - turn[1]))
            case ev.RunStarted():
                self.runs_started.labels(self._agent(event.actor)).inc()
            case ev.RunCompleted() | ev.RunFailed() | ev.RunCancelled():
                self._ended(event)

    def _tool_ended(self, event: ev.ToolCompleted | ev.ToolFailed) -> None:
        """A call's duration and failure, and the sandbox time of the script run its outcome carries (read
        from the field, not `events.expand`: this runs on the host's hot path)."""
        self.tool_seconds.labels(event.tool).observe(event.duration_ms / 1000.0)
        if isinstance(event, ev.ToolFailed):
            self.tool_failed.labels(event.tool, event.error.kind).inc()
        if event.script is not None and event.script.ended is not None:
            self.sandbox_seconds.labels(event.tool).observe(event.script.duration_ms / 1000.0)

    def _turn_opened(self, event: ev.ModelRequested) -> None:
        if self._turns.get(event.run_id, (0, 0.0))[0] != event.turn:
            self._turns.pop(event.run_id, None)  # re-inserted last: the oldest go first
            self._turns[event.run_id] = (event.turn, event.ts)
            if len(self._turns) > MAX_OPEN_TURNS:  # runs this host let go of mid-turn
                del self._turns[next(iter(self._turns))]

    def _responded(self, event: ev.ModelResponded) -> None:
        agent = self._agent(event.actor)
        self.model_seconds.labels(agent).observe(event.latency_ms / 1000.0)
        if event.usage.prompt_tokens:
            self.tokens.labels(agent, "input").inc(event.usage.prompt_tokens)
        if event.usage.completion_tokens:
            self.tokens.labels(agent, "output").inc(event.usage.completion_tokens)

    def _ended(self, event: ev.RunCompleted | ev.RunFailed | ev.RunCancelled) -> None:
        self._turns.pop(event.run_id, None)
        agent = self._agent(event.actor)
        if isinstance(event, ev.RunCompleted):
            self.runs_completed.labels(agent).inc()
        elif isinstance(event, ev.RunFailed):
            self.runs_failed.labels(agent, event.reason).inc()
        else:
            self.runs_cancelled.labels(agent).inc()

    def watch_host(self, host: Any) -> None:
        """Gauges read from `host` (a `runtime.host.Host`) when scraped; from now on `agent` labels only
        the bundles it serves."""
        self._served = host.agents
        r = self.registry
        Gauge("sa_host_partitions_owned", "Task partitions this host serves", registry=r).set_function(
            _safe_len(lambda: host.partitions))
        Gauge("sa_host_runs_in_flight", "Runs this host drives now", registry=r).set_function(
            _safe_len(lambda: host.drivers))
        Gauge("sa_host_tasks_waiting", "Tasks waiting in this host's actor mailboxes",
              registry=r).set_function(_safe_len(lambda: host.waiting))
        Gauge("sa_host_runs_adopted", "Runs this host found unfinished in its partitions with nothing "
              "driving them, outside a takeover, and drove (each one a run a takeover missed: alert if it "
              "grows)",
              registry=r).set_function(lambda: float(host.stats.runs_adopted))


def _safe_len(get: Callable[[], Any]) -> Callable[[], float]:
    """len() of a structure the event loop changes while the scrape thread reads it (a changing dict can
    raise mid-copy: the scrape then reports -1 rather than failing)."""
    def value() -> float:
        try:
            return float(len(get()))
        except RuntimeError:
            return -1.0
    return value


class _WorkerStatsCollector(Collector):
    """A worker's `WorkerStats` counters and held jobs, read at scrape time (the worker keeps counting
    plain ints; nothing is added to its job path)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Any:
        w, s = self.worker, self.worker.stats
        yield GaugeMetricFamily("sa_worker_jobs_in_flight", "Jobs this worker holds (running or buffered)",
                                value=len(w.held))
        yield GaugeMetricFamily("sa_worker_concurrency", "Jobs this worker runs at once",
                                value=w.concurrency)
        for name, doc, value in (
            ("sa_worker_outcomes", "Outcomes published (ok or failed)", s.completed),
            ("sa_worker_dead_lettered", "Jobs moved to the DLQ by this worker", s.dead_lettered),
            ("sa_worker_replayed", "Redelivered jobs answered from their recorded output", s.replayed),
            ("sa_worker_nacked", "Jobs given back after NATS trouble", s.nacked),
        ):
            yield CounterMetricFamily(name, doc, value=value)


class WorkerMetrics:
    """A worker's metrics: its counters (scraped) and, per finished job (`on_outcome`), the tool's
    sandbox time and failures by tool and error kind."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or _process_registry()
        self.jobs = Counter("sa_worker_jobs", "Jobs finished by tool and outcome (ok, failed)",
                            ["tool", "outcome"], registry=r)
        self.failures = Counter("sa_worker_tool_failures", "Jobs whose tool failed, by error kind",
                                ["tool", "error_kind"], registry=r)
        self.sandbox_seconds = Histogram("sa_worker_sandbox_duration_seconds", "A job's script run (the "
                                         "tool's duration)", ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.queues = QueueMetrics(r)

    def on_outcome(self, outcome: ToolOutcome) -> None:
        error = outcome.result.error
        self.jobs.labels(outcome.tool, "ok" if error is None else "failed").inc()
        if error is not None:
            self.failures.labels(outcome.tool, error.kind).inc()
        self.sandbox_seconds.labels(outcome.tool).observe(outcome.result.duration_ms / 1000.0)

    def watch_worker(self, worker: Any) -> None:
        self.registry.register(_WorkerStatsCollector(worker))


class AuditMetrics:
    """A scheduled audit's metrics (`sa audit --every 1h --metrics-port N`), set after each pass
    (`runtime.client.audit.audit_every`): what the last finished pass found, when it finished, and how many
    passes could not finish. Gauges, not counters, for the findings: a log that lost an event stays broken
    until it is restored, so the alert holds as long as the damage does and clears when a pass finds the
    log whole again (`deploy/prometheus/alerts.yaml`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from runtime.client.audit import FAULTS

        r = self.registry = registry or _process_registry()
        self.findings = Gauge("sa_audit_findings", "Findings of the last finished audit pass, by fault (gap, "
                              "fork, decode, first, fold, outcome, no_log)", ["fault"], registry=r)
        self._faults = FAULTS
        for fault in FAULTS:  # every series present from the start: an alert on it never sees "no data"
            self.findings.labels(fault).set(0)
        self.runs_checked = Gauge("sa_audit_runs_checked", "Runs the last finished pass covered (read again, "
                                  "or ended, proved whole and unchanged since)", registry=r)
        self.runs_broken = Gauge("sa_audit_runs_broken", "Runs with a finding in the last finished pass",
                                 registry=r)
        self.last_run = Gauge("sa_audit_last_run_timestamp_seconds", "When the last audit pass finished "
                              "(Unix time; 0 before the first)", registry=r)
        self.duration = Gauge("sa_audit_duration_seconds", "How long the last finished pass took",
                              registry=r)
        self.errors = Counter("sa_audit_errors", "Audit passes that could not finish (NATS unreachable, a "
                              "permission refused)", registry=r)

    def record(self, report: Any, seconds: float, now: float) -> None:
        """Set the gauges from a finished pass (`runtime.client.audit.Audit`) that took `seconds`."""
        counts = dict.fromkeys(self._faults, 0)
        for _run, finding in report.findings:
            counts[finding.fault] = counts.get(finding.fault, 0) + 1
        for fault, n in counts.items():
            self.findings.labels(fault).set(n)
        self.runs_checked.set(len(report.runs) + report.unchanged)
        self.runs_broken.set(sum(not r.whole for r in report.runs))
        self.duration.set(seconds)
        self.last_run.set(now)


def _process_registry() -> CollectorRegistry:
    """A registry with the process metrics a Prometheus user expects of any process (resident memory,
    CPU seconds, open and maximum file descriptors, start time: `process_*`) and the Python runtime's
    (`python_info`, `python_gc_*`)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


LOOPBACK = "127.0.0.1"


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = LOOPBACK) -> Any:
    """`GET /metrics` on `addr`:`port` from a daemon thread (prometheus-client's own server); returns it,
    with `.server_port` the port bound (0 asks for a free one). Loopback by default: metrics name the
    agents and tools a fleet runs, so reaching them from other machines is a choice (`0.0.0.0` in a
    container whose port the scraper reaches, as the deploy manifests do)."""
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server


def metric_names() -> set[str]:
    """Every `sa_*` metric family a host, a worker or a scheduled audit exposes (the dashboard's
    vocabulary), without suffixes; the standard `process_*` / `python_*` families come on top."""
    host, worker = HostMetrics(), WorkerMetrics()

    class _Stub:  # just enough of a host and a worker for the gauges to register
        agents: dict[str, Any] = {}  # noqa: RUF012
        partitions: list[int] = []  # noqa: RUF012
        drivers: dict[str, Any] = {}  # noqa: RUF012
        waiting: dict[str, Any] = {}  # noqa: RUF012
        held: list[Any] = []  # noqa: RUF012
        concurrency = 1
        stats = type("S", (), {"completed": 0, "dead_lettered": 0, "replayed": 0, "nacked": 0,
                               "runs_adopted": 0})()

    host.watch_host(_Stub())
    worker.watch_worker(_Stub())
    registries = (host.registry, worker.registry, AuditMetrics().registry)
    return {m.name for r in registries for m in r.collect() if m.name.startswith("sa_")}


__all__ = ["LOOPBACK", "MAX_OPEN_TURNS", "UNKNOWN_AGENT", "AuditMetrics", "HostMetrics", "QueueMetrics",
           "WorkerMetrics", "metric_names", "serve_metrics"]
