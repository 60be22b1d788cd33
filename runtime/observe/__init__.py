"""What is derived from the log and the processes' counters, never added to a turn's path.

- `traces`   — a run's OpenTelemetry trace, pure over its events: span tree, real times, derived ids
- `exporter` — `sa otel`: follows EVENTS with a durable consumer and exports spans over OTLP/HTTP
- `metrics`  — Prometheus metrics of hosts (from their events) and workers (from their counters)
- `logs`     — `--log-format json`: one JSON object per line, with run id, agent, seq, call id as fields
               (set by the host and the worker with `runtime.logfields.log_context`)

Only `traces` and `logs` are imported here: the exporter and the metrics pull in the OpenTelemetry SDK and
prometheus-client, which a process that does not use them need not load.
"""

from runtime.observe.logs import LogFormat, setup_json_logging
from runtime.observe.traces import Span, TraceBuilder, parent_context, render_tree, trace_of

__all__ = ["LogFormat", "Span", "TraceBuilder", "parent_context", "render_tree",
           "setup_json_logging", "trace_of"]
