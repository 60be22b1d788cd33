"""Streamed replies from servers that do not keep to vLLM's shape, over real HTTP on loopback: a server that
ignores `"stream": true` and answers one JSON completion, and a stream cut short (it ends with neither a
`finish_reason` nor `data: [DONE]`, or its connection drops mid-body). The first is read as the whole
reply it is; the second is a failed, retried model call, never a "complete" reply (`runtime.model.reply`).

The misbehaving server here writes scripted raw HTTP responses byte for byte (what it sends is the point of
each test), one per connection; the well-behaved replies come from the scripted model server as usual.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import kinds, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.model.adapters import get_adapter
from runtime.model.client import ModelClient, ModelError
from runtime.model.sdk import HTTP_MODES
from runtime.nats.topology import ensure_topology
from runtime.testing import hermes_call
from runtime.types import ToolSchema

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "what is 2 + 3?"}]
ADD = ToolSchema("add", "Add two numbers.", {"type": "object", "properties": {
    "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]})


@pytest.fixture(autouse=True, params=HTTP_MODES)
def http_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs over each way a completion travels (`SA_MODEL_HTTP`): same reading of every body."""
    monkeypatch.setenv("SA_MODEL_HTTP", request.param)
    return str(request.param)


# -- what the misbehaving server sends -------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One chunk of a chat completion stream, in vLLM's shape."""
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def completion(message: dict[str, Any], finish: str | None, **fields: Any) -> dict[str, Any]:
    """One whole (non-streamed) chat completion."""
    return {"id": "chatcmpl-7", "object": "chat.completion", "created": 0, "model": "served-model",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            **fields}


def events(*chunks: dict[str, Any], done: bool) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def sse(*chunks: dict[str, Any], done: bool = True, dropped: bool = False) -> bytes:
    """An SSE response over chunked encoding, as uvicorn sends it. Its HTTP body always ends cleanly (the
    terminating zero-length chunk) unless `dropped`: then the connection closes in the middle of it."""
    data = events(*chunks, done=done)
    body = b"%x\r\n%s\r\n" % (len(data), data) + (b"" if dropped else b"0\r\n\r\n")
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n" + body)


def sse_until_close(*chunks: dict[str, Any], done: bool = True) -> bytes:
    """An SSE response whose body is delimited by the server closing the connection (no length, no
    chunking: HTTP/1.0 style, as some proxies send it), so a cut here is a clean end of the body."""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            + events(*chunks, done=done))


def json_body(payload: Any, *, content_type: str = "application/json") -> bytes:
    data = json.dumps(payload).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (content_type.encode(), len(data), data))


NOTHING_LEFT = json_body({"error": {"message": "no scripted response left"}}).replace(
    b"200 OK", b"501 Not Implemented")


def text_stream(text: str, size: int = 4) -> list[dict[str, Any]]:
    """The content chunks of `text` (after the role chunk), with no finish chunk."""
    return [chunk({"role": "assistant", "content": ""}),
            *(chunk({"content": text[i:i + size]}) for i in range(0, len(text), size))]


class RawModelServer:
    """Answers each POST on 127.0.0.1 with the next scripted raw HTTP response, byte for byte, then closes
    the connection; records each request's JSON body. With the script used up it answers HTTP 501, which
    the client does not retry, so a test that under-scripts fails at once."""

    def __init__(self, responses: Iterable[bytes]) -> None:
        self._responses = deque(responses)
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, name="raw-model", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    @property
    def served(self) -> int:
        with self._lock:
            return len(self.requests)

    def __enter__(self) -> RawModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, which then ends
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head, body = self._read(conn)
            if head is None:
                return
            with self._lock:
                self.requests.append(json.loads(body or b"{}"))
                raw = self._responses.popleft() if self._responses else NOTHING_LEFT
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _read(conn: socket.socket) -> tuple[bytes | None, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                return None, b""
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        return head, body


def client_for(server: RawModelServer, **options: Any) -> ModelClient:
    return ModelClient(base_url=server.base_url, model="m", backoff_base=0.001, backoff_max=0.01, **options)


# -- a JSON completion for a streamed request ------------------------------------------------------------


async def test_a_json_completion_for_a_streamed_request_is_read_as_the_whole_reply() -> None:
    """The server ignored `"stream": true`: its one JSON body holds the reply, native tool calls, usage and
    finish_reason included, and a streaming consumer sees the reply too (as one fragment)."""
    native = completion({"content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_10", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},
    ]}, "tool_calls", usage={"prompt_tokens": 17, "completion_tokens": 9, "total_tokens": 26})
    qwen = get_adapter("qwen3")
    in_text = completion({"content": qwen.format_call("add", {"a": 2, "b": 3})}, "stop")
    seen: list[tuple[int, str, str, str]] = []
    texts: list[str] = []
    script = [json_body(native), json_body(in_text, content_type="application/json; charset=utf-8")]
    with RawModelServer(script) as server:
        async with client_for(server) as client:
            calls = await client.complete(USER, stream=True, on_tool_call=lambda *f: seen.append(f))
            text = await client.complete(USER, stream=True, on_text=texts.append)
        assert all(body["stream"] is True for body in server.requests)
    assert calls.finish_reason == "tool_calls" and calls.model == "served-model" and calls.text == ""
    assert calls.usage.prompt_tokens == 17 and calls.usage.completion_tokens == 9
    assert calls.tool_calls == [
        {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_10", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},
    ]
    assert seen == [(0, "call_9", "add", '{"a": 2, "b": 3}'), (1, "call_10", "add", '{"a": 1, "b": 1}')]
    # a call written in the text is there for the adapter to parse, as from any reply
    assert texts == [text.text] and text.finish_reason == "stop" and text.tool_calls is None
    parsed = qwen.parse(text.text, text.tool_calls, [ADD])
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 2, "b": 3})]


@pytest.mark.parametrize("body, says", [
    ({"error": {"message": "upstream overloaded", "type": "server_error"}}, "upstream overloaded"),
    ({"object": "chat.completion", "choices": []}, "without choices"),
    ({"choices": [{"index": 0, "message": {"content": 7}}]}, "Expected `str | null`, got `int`"),
])
async def test_a_json_body_that_is_not_a_completion_fails_the_call_saying_what_was_sent(
        body: dict[str, Any], says: str) -> None:
    with RawModelServer([json_body(body)]) as server:
        async with client_for(server) as client:
            with pytest.raises(ModelError) as err:
                await client.complete(USER, stream=True)
        assert server.served == 1  # not retried: the same server would answer the same way
    assert "not a chat completion" in str(err.value) or "without choices" in str(err.value)
    assert says in str(err.value) and not err.value.retryable


# -- a stream cut short ----------------------------------------------------------------------------------


CUT_CALL = [chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "add", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 2, '}}]})]


@pytest.mark.parametrize("cut", [
    pytest.param(sse(*text_stream("sum="), done=False), id="body-ends-cleanly"),
    pytest.param(sse_until_close(*text_stream("sum="), done=False), id="connection-close-ends-body"),
    pytest.param(sse(*text_stream("sum="), done=False, dropped=True), id="connection-drops-mid-body"),
    pytest.param(sse(*CUT_CALL, done=False), id="half-a-tool-call"),
])
async def test_a_stream_cut_short_is_a_failed_call_retried_like_a_connection_error(cut: bytes) -> None:
    with RawModelServer([cut, cut, cut]) as server:
        async with client_for(server, max_retries=2) as client:
            with pytest.raises(ModelError) as err:
                await client.complete(USER, stream=True)
        assert server.served == 3
    assert err.value.retryable and err.value.attempts == 3 and err.value.status is None
    assert "cut its streamed reply short after 3 attempts" in str(err.value)


async def test_a_body_that_is_no_stream_at_all_reads_as_cut_and_names_what_was_sent() -> None:
    """A proxy's HTML page with status 200: no event in it, so no end; the error says what came instead."""
    page = json_body("<html>gateway</html>", content_type="text/html")
    with RawModelServer([page, page]) as server:
        async with client_for(server, max_retries=1) as client:
            with pytest.raises(ModelError) as err:
                await client.complete(USER, stream=True)
    assert err.value.retryable and "after 0 chunks" in str(err.value) and "'text/html'" in str(err.value)


async def test_a_cut_stream_is_retried_and_only_the_whole_attempt_is_kept() -> None:
    whole = [*text_stream("sum=5"), chunk({}, "stop")]
    fragments: list[str] = []
    with RawModelServer([sse(*text_stream("sum="), done=False), sse(*whole)]) as server:
        async with client_for(server) as client:
            reply = await client.complete(USER, stream=True, on_text=fragments.append)
    assert reply.text == "sum=5" and reply.finish_reason == "stop" and reply.attempts == 2
    assert "".join(fragments) == "sum=" + "sum=5"  # a consumer sees both attempts, as documented


@pytest.mark.parametrize("response, finish", [
    pytest.param(sse(*text_stream("sum=5"), chunk({}, "stop")), "stop", id="finish-and-done"),
    pytest.param(sse(*text_stream("sum=5"), chunk({}, "length"), done=False), "length", id="finish-no-done"),
    pytest.param(sse_until_close(*text_stream("sum=5"), chunk({}, "stop"), done=False), "stop",
                 id="finish-then-close"),
    pytest.param(sse(*text_stream("sum=5"), done=True), "stop", id="done-no-finish"),
])
async def test_a_finish_reason_or_done_ends_a_stream_whole(response: bytes, finish: str) -> None:
    """vLLM sends a finish chunk, a usage chunk and `[DONE]`; some servers omit `[DONE]`, others the
    finish_reason: either one says the reply is whole."""
    with RawModelServer([response]) as server:
        async with client_for(server, max_retries=0) as client:
            reply = await client.complete(USER, stream=True)
        assert server.served == 1
    assert reply.text == "sum=5" and reply.finish_reason == finish and reply.attempts == 1


# -- end to end: a host streams every model call ---------------------------------------------------------


@pytest.fixture
async def topo(js: Any) -> Any:
    await ensure_topology(js, partitions=2, tool_ack_wait=5.0)
    return js


async def run_on_host(nats_url: str, js: Any, root: Path, server: RawModelServer, task: str
                      ) -> list[ev.Event]:
    """One task through an in-process host (streaming its model calls, the default) and a tool worker."""
    bundle = write_bundle(root)
    async with running_host(nats_url, [bundle], server), running_worker(nats_url, [bundle]):
        run_id = await publish_task(js, "calc", task)
        with anyio.fail_after(60):
            return [e async for e in RunLog(js).follow(run_id)]


async def test_a_host_runs_the_tool_call_of_a_json_reply_to_its_streamed_request(nats_server, topo, tmp_path):
    calculate = completion({"content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"expression": "2 + 3"})}}]}, "tool_calls")
    submit = completion({"content": hermes_call("submit", {"answer": "5"})}, "stop")
    with RawModelServer([json_body(calculate), json_body(submit)]) as server:
        log = await run_on_host(nats_server.url, topo, tmp_path, server, "compute: 2 + 3")
        assert [body["stream"] for body in server.requests] == [True, True]
    assert kinds(log)[-1] == "run.completed" and log[-1].output == {"answer": "5"}
    (done,) = [e for e in log if isinstance(e, ev.ToolCompleted) and e.call_id.endswith("/1.0")]
    assert done.output["value"] == 5
    assert not [e for e in log if isinstance(e, ev.ModelFailed)]


async def test_a_host_fails_a_cut_stream_and_keeps_only_the_whole_retry(nats_server, topo, tmp_path):
    cut = [chunk({"role": "assistant", "content": ""}), chunk({"content": '<tool_call>\n{"name": "calcu'})]
    whole = [*text_stream(hermes_call("submit", {"answer": "whole"}), size=16), chunk({}, "stop")]
    with RawModelServer([sse(*cut, done=False), sse(*whole)]) as server:
        log = await run_on_host(nats_server.url, topo, tmp_path, server, "compute: 2 + 3")
    assert kinds(log)[-1] == "run.completed" and log[-1].output == {"answer": "whole"}
    (failed,) = [e for e in log if isinstance(e, ev.ModelFailed)]
    assert "cut its streamed reply short" in failed.error and "neither a finish_reason" in failed.error
    responded = [e.text for e in log if isinstance(e, ev.ModelResponded)]
    assert responded == [hermes_call("submit", {"answer": "whole"})]  # the cut attempt left no reply
    assert not [e for e in log if isinstance(e, ev.ToolCalled) and e.call.name == "calculator"]
