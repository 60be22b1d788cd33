"""A real OTLP/HTTP trace receiver for tests: an HTTP server on a free port that decodes each
`POST /v1/traces` body with the `opentelemetry-proto` package and keeps every span it was sent.

`hold_after=N` answers the first N requests and then holds every later one open (never answering) until
`release()`: a test can kill an exporter while its export is in flight (`held` is set when one arrives),
which is how a crash between "exported" and "acked" is produced without guessing at timing. A held
request's spans are recorded on arrival: the receiver got them, even if the exporter never learns it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    kind: int
    status_code: int
    status_message: str
    attributes: dict[str, Any] = field(default_factory=dict)
    service: str = ""


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class Receiver:
    def __init__(self, hold_after: int | None = None) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.hold_after = hold_after
        self.held = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.requests += 1
                    number = receiver.requests
                    receiver.spans += receiver._decode(request)
                if receiver.hold_after is not None and number > receiver.hold_after:
                    receiver.held.set()
                    receiver._release.wait(60)
                    return  # the connection just closes: the exporter never hears back
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def _decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
        out = []
        for rs in request.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(ReceivedSpan(
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                        name=s.name, start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                        kind=s.kind,
                        status_code=s.status.code, status_message=s.status.message,
                        attributes={a.key: _value(a.value) for a in s.attributes}, service=service))
        return out

    def unique(self) -> dict[str, ReceivedSpan]:
        """The spans de-duplicated by span id (what a collector keeps)."""
        with self._lock:
            return {s.span_id: s for s in self.spans}

    def release(self) -> None:
        self.hold_after = None
        self._release.set()

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
