"""A scripted OpenAI-compatible model server over real HTTP, for tests and benchmarks.

The model server is the one thing the test suite stands in for. Everything on our side (the openai
client, retries, request shape, streaming re-assembly) runs for real against this server, so a test
can assert the exact JSON body the runtime sent, e.g. that `structured_outputs` is present and no
removed `guided_*` key is.

    from runtime.testing import Reply, ScriptedModelServer

    with ScriptedModelServer([Reply.error(429), Reply.tool_call("add", {"a": 1}), "done"]) as server:
        client = ModelClient(base_url=server.base_url, model="m")
        ...
        assert "structured_outputs" in server.requests[-1]

What it speaks (the subset of vLLM's OpenAI API the runtime uses):

- `GET /v1/models`, `POST /v1/chat/completions`, non-streaming and SSE streaming in vLLM's shape
  (role delta, content deltas, per tool call a header delta with id and name followed by argument
  fragments, a final chunk with `finish_reason`, a usage chunk when `stream_options.include_usage`,
  then `data: [DONE]`); `routes=` answers more GETs with fixed JSON (servers' tells: `runtime.model.detect`).

Where replies come from, for each request in arrival order:

1. the queue (`replies=` at construction, `push()` later), first in first out;
2. otherwise the `responder`, a callable `body -> Reply | str` called on the server's request
   thread. Responders make many concurrent agents deterministic: key the reply on the request's
   content (`last_message(body)`), never on arrival order. A responder may be called from several
   threads at once, so it must be thread-safe (pure functions of the body are);
3. otherwise HTTP 501 "no scripted reply left" (not retried by the client), so a test that
   under-scripts fails loudly and at once.

A reply is text, tool calls, an HTTP error status (optionally with `Retry-After`), or a dropped
connection; any reply may carry a `delay` (seconds, slept on the request thread: use it to test
timeouts). The server adds no latency of its own, and `record=False` turns off request recording so
long benchmarks do not grow memory.

Concurrency: a `ThreadingHTTPServer` (one thread per connection, HTTP/1.1 keep-alive, a deep
listen backlog), so hundreds of concurrent clients are fine. Start/stop is a context manager, or
`start()`/`close()`. A full server (`capacity=Capacity(32)`: 429 beyond 32 requests in flight) is
`runtime.testing.capacity`'s.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.testing.capacity import Capacity

__all__ = ["Reply", "Responder", "ScriptedModelServer", "hermes_call", "last_message"]


@dataclass(frozen=True)
class Reply:
    """One scripted response. Build with the class methods; a plain `str` also means `Reply.text`."""

    text: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments as JSON text)
    status: int = 200
    error_message: str = ""
    retry_after: float | None = None
    finish_reason: str | None = None  # default: "tool_calls" when there are calls, else "stop"
    prompt_tokens: int | None = None  # default: a deterministic estimate from the request
    completion_tokens: int | None = None
    delay: float = 0.0
    disconnect: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_text(cls, text: str, **options: Any) -> Reply:
        """An assistant message with this content (what a text-family model's raw output looks like)."""
        return cls(text=text, **options)

    @classmethod
    def tool_call(
        cls, name: str, arguments: dict[str, Any] | str, *, text: str = "", **options: Any
    ) -> Reply:
        """One native `tool_calls` entry (arguments as a dict, or raw text to script malformed JSON)."""
        return cls.tool_calls_of([(name, arguments)], text=text, **options)

    @classmethod
    def tool_calls_of(
        cls, calls: Iterable[tuple[str, dict[str, Any] | str]], *, text: str = "", **options: Any
    ) -> Reply:
        """Several native `tool_calls` in one reply (parallel calls)."""
        encoded = tuple((n, a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)) for n, a in calls)
        return cls(text=text, tool_calls=encoded, **options)

    @classmethod
    def error(
        cls, status: int, message: str = "", *, retry_after: float | None = None, **options: Any
    ) -> Reply:
        """An HTTP error response in OpenAI's error shape."""
        return cls(
            status=status,
            error_message=message or f"scripted error {status}",
            retry_after=retry_after,
            **options,
        )

    @classmethod
    def drop(cls, **options: Any) -> Reply:
        """Close the connection without answering (the client sees a connection error)."""
        return cls(disconnect=True, **options)


Responder = Callable[[dict[str, Any]], "Reply | str"]


def last_message(body: dict[str, Any], role: str | None = None) -> str:
    """The content of the last message in a request (optionally the last with `role`): a responder key."""
    for message in reversed(body.get("messages") or []):
        if role is None or message.get("role") == role:
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call written as a text-family model writes it, the way the `hermes` adapter parses it: the text
    of a reply (`Reply.of_text(hermes_call(...))`, or a plain `str`) for bundles whose model speaks hermes."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    owner: ScriptedModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that goes away mid-request (a killed host, a timed-out call, a dropped keep-alive
        connection) is what the tests do on purpose, not a server error: say nothing. Anything else is
        printed as before."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes: without TCP_NODELAY the second waits for the client's
    # delayed ACK (~40 ms on Linux), which would make a "zero-latency" model take 40+ ms per request
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence per-request logging
        pass

    # ---- plumbing ----

    _done: Callable[[], None] | None = None  # counts the request out of the server's capacity, once

    def _answered(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._answered()  # before the answer: a client that read it may already send its next request
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        kind = (
            "rate_limit_error"
            if status == 429
            else "invalid_request_error"
            if status < 500
            else "server_error"
        )
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

    # ---- routes ----

    def do_GET(self) -> None:
        owner = self.server.owner
        route = owner.routes.get(self.path.rstrip("/"))
        if route is not None:
            self._send_json(200, route)
        elif self.path.rstrip("/") == "/v1/models":
            self._send_json(
                200,
                {"object": "list", "data": [{"id": owner.model, "object": "model", "owned_by": "scripted"}]},
            )
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            self._error(400, f"request body is not JSON: {exc}")
            return
        owner._record(body, dict(self.headers.items()))
        capacity, refused = owner.capacity, None
        if capacity is not None:
            refused, self._done = capacity.enter()
        try:
            if refused is not None and capacity is not None:
                self._error(429, refused, {"Retry-After": f"{capacity.retry_after:g}"})
            else:
                self._complete(owner, body)
        finally:
            self._answered()

    def _complete(self, owner: ScriptedModelServer, body: dict[str, Any]) -> None:
        try:
            reply = owner._next_reply(body)
        except Exception as exc:  # a broken responder is a test bug: say so in the response
            self._error(500, f"scripted responder raised {type(exc).__name__}: {exc}")
            return
        if reply is None:
            self._error(501, "no scripted reply left (queue empty and no responder)")
            return
        if reply.delay:
            time.sleep(reply.delay)
        if reply.disconnect:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if reply.status != 200:
            headers = dict(reply.headers)
            if reply.retry_after is not None:
                headers["Retry-After"] = f"{reply.retry_after:g}"
            self._error(reply.status, reply.error_message, headers)
            return
        if body.get("stream"):
            self._stream(owner, body, reply)
        else:
            self._send_json(200, owner._completion(body, reply), reply.headers)

    def _stream(self, owner: ScriptedModelServer, body: dict[str, Any], reply: Reply) -> None:
        """SSE over chunked transfer encoding on a kept-alive connection, as vLLM (uvicorn) sends it."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()

        def send(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            for chunk in owner._chunks(body, reply):
                send(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self._answered()
            send(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped reading (a cancelled call)


class ScriptedModelServer:
    """An OpenAI-compatible server on 127.0.0.1 that replays scripted replies (see module docstring)."""

    def __init__(
        self,
        replies: Iterable[Reply | str] = (),
        *,
        responder: Responder | None = None,
        model: str = "scripted-model",
        record: bool = True,
        chunk_size: int = 8,
        host: str = "127.0.0.1",
        port: int = 0,
        capacity: Capacity | None = None,
        routes: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.routes = dict(routes or {})  # more GET routes: path -> the JSON answered
        self.capacity = capacity  # None: every request is admitted
        self.responder = responder
        self.record = record
        self.chunk_size = max(1, chunk_size)
        self._queue: deque[Reply] = deque(_as_reply(r) for r in replies)
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []  # each recorded request's headers, names lower-cased
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._served = 0
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> ScriptedModelServer:
        """Bind (port 0 picks a free port) and serve on a daemon thread."""
        if self._server is not None:
            return self
        server = _Server(self._address, _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-model", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port (in-flight keep-alive threads are daemons)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what tests use ----

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI `base_url` (ends in /v1), on the address it was bound to (loopback for a wildcard)."""
        host = self._address[0] if self._address[0] not in ("", "0.0.0.0") else "127.0.0.1"
        return f"http://{host}:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every chat-completions request body received so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers of each recorded request, names lower-cased, in the order of `requests` (a copy)."""
        with self._lock:
            return list(self._headers)

    @property
    def served(self) -> int:
        """How many chat-completions requests arrived (counted even when `record=False`)."""
        with self._lock:
            return self._served

    @property
    def remaining(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._queue)

    def push(self, *replies: Reply | str) -> None:
        """Append replies to the queue (thread-safe; usable while the server runs)."""
        with self._lock:
            self._queue.extend(_as_reply(r) for r in replies)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---- internals (called on request threads) ----

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self._served += 1
            if self.record:
                self._requests.append(body)
                self._headers.append({k.lower(): v for k, v in headers.items()})

    def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            return _as_reply(self.responder(body))
        return None

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        prompt_text = "".join(str(m.get("content") or "") for m in body.get("messages") or [])
        completion_text = reply.text + "".join(n + a for n, a in reply.tool_calls)
        prompt = reply.prompt_tokens if reply.prompt_tokens is not None else _estimate_tokens(prompt_text)
        completion = (
            reply.completion_tokens
            if reply.completion_tokens is not None
            else _estimate_tokens(completion_text)
        )
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _finish(self, reply: Reply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    def _call_ids(self, reply: Reply) -> list[str]:
        return [f"call_{next(self._ids)}" for _ in reply.tool_calls]

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text if reply.text or not reply.tool_calls else None,
        }
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, (name, args) in zip(self._call_ids(reply), reply.tool_calls, strict=True)
            ]
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model") or self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self._finish(reply), "logprobs": None}
            ],
            "usage": self._usage(body, reply),
        }

    def _chunks(self, body: dict[str, Any], reply: Reply) -> Iterable[dict[str, Any]]:
        ident, model, size = f"chatcmpl-{next(self._ids)}", body.get("model") or self.model, self.chunk_size

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }

        yield chunk({"role": "assistant", "content": ""})
        for start in range(0, len(reply.text), size):
            yield chunk({"content": reply.text[start : start + size]})
        for index, (cid, (name, args)) in enumerate(
            zip(self._call_ids(reply), reply.tool_calls, strict=True)
        ):
            header = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            yield chunk({"tool_calls": [header]})
            for start in range(0, len(args), size):
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": args[start : start + size]}}]}
                )
        yield chunk({}, self._finish(reply))
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": self._usage(body, reply),
            }


def _as_reply(value: Reply | str) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(text=value)
    raise TypeError(f"a scripted reply must be a Reply or a str, got {type(value).__name__}")
