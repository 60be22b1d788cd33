"""ModelClient against the scripted OpenAI-compatible server, over real HTTP."""

from __future__ import annotations

import json

import pytest

from runtime.model.adapters import get_adapter
from runtime.model.client import Completion, ModelClient, ModelError
from runtime.model.constraints import DecodingConstraint, build_constraint
from runtime.model.sdk import HTTP_MODES
from runtime.testing import Reply, ScriptedModelServer
from runtime.types import Message, ToolSchema, Usage

pytestmark = pytest.mark.anyio

TOOL = ToolSchema(
    "get_weather",
    "Weather.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
USER = [{"role": "user", "content": "weather in Oslo?"}]


@pytest.fixture(autouse=True, params=HTTP_MODES)
def http_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs over each way a completion travels (`SA_MODEL_HTTP`): same behaviour, same errors."""
    monkeypatch.setenv("SA_MODEL_HTTP", request.param)
    return str(request.param)


def client_for(server: ScriptedModelServer, **options) -> ModelClient:
    return ModelClient(base_url=server.base_url, model="m", backoff_base=0.001, backoff_max=0.01, **options)


async def test_request_carries_structured_outputs_and_no_guided_keys() -> None:
    adapter = get_adapter("qwen3")
    messages = adapter.render([Message("user", "weather in Oslo?")], [TOOL])
    extras = build_constraint(adapter, [TOOL], DecodingConstraint("ebnf")).request_extras()
    reply = adapter.format_call("get_weather", {"city": "Oslo"})
    with ScriptedModelServer([reply]) as server:
        async with client_for(server) as client:
            completion = await client.complete(messages, temperature=0.0, max_tokens=64, seed=7, **extras)
        (body,) = server.requests
    # extra_body is merged into the top level of the JSON body, as vLLM expects
    assert set(body["structured_outputs"]) == {"grammar"} and "::=" in body["structured_outputs"]["grammar"]
    assert not [key for key in body if key.startswith("guided_")]
    assert "extra_body" not in body and "tools" not in body
    assert body["model"] == "m" and body["temperature"] == 0.0 and body["seed"] == 7
    # bundles say max_tokens; the wire says max_completion_tokens (max_tokens is deprecated in vLLM)
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body
    assert body["messages"][0]["role"] == "system" and "get_weather" in body["messages"][0]["content"]
    parsed = adapter.parse(completion.text, completion.tool_calls, [TOOL])
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]


async def test_guided_keys_are_refused_before_any_request() -> None:
    with ScriptedModelServer(["unused"]) as server:
        async with client_for(server) as client:
            with pytest.raises(ValueError, match="structured_outputs"):
                await client.complete(USER, extra_body={"guided_grammar": "root ::= x"})
        assert server.served == 0


async def test_retries_429_and_500_then_succeeds_and_captures_usage() -> None:
    script = [
        Reply.error(429, "slow down", retry_after=0),
        Reply.error(500),
        Reply.drop(),
        Reply(text="sunny", prompt_tokens=11, completion_tokens=2),
    ]
    with ScriptedModelServer(script) as server:
        async with client_for(server) as client:
            completion = await client.complete(USER)
        assert server.served == 4
    assert completion.text == "sunny" and completion.attempts == 4
    assert completion.usage == Usage(prompt_tokens=11, completion_tokens=2)
    assert completion.finish_reason == "stop" and completion.tool_calls is None and completion.latency_ms > 0


async def test_gives_up_after_max_retries_with_a_clear_model_error() -> None:
    with ScriptedModelServer([Reply.error(503, "overloaded")] * 3) as server:
        async with client_for(server, max_retries=2) as client:
            with pytest.raises(ModelError) as err:
                await client.complete(USER)
    assert err.value.status == 503 and err.value.attempts == 3 and err.value.retryable
    assert "HTTP 503 after 3 attempts" in str(err.value) and "overloaded" in str(err.value)


async def test_client_errors_are_not_retried() -> None:
    with ScriptedModelServer([Reply.error(400, "bad grammar"), "never"]) as server:
        async with client_for(server) as client:
            with pytest.raises(ModelError, match=r"HTTP 400 after 1 attempt: .*bad grammar") as err:
                await client.complete(USER)
        assert server.served == 1 and err.value.retryable is False


async def test_unreachable_server_is_a_model_error() -> None:
    with ScriptedModelServer() as server:
        url = server.base_url
    async with ModelClient(base_url=url, model="m", max_retries=1, backoff_base=0.001) as client:
        with pytest.raises(ModelError, match="cannot reach the model server"):
            await client.complete(USER)


async def test_timeout_is_retried_then_reported() -> None:
    with ScriptedModelServer([Reply(text="late", delay=1.0), Reply(text="late", delay=1.0)]) as server:
        async with client_for(server, timeout=0.2, max_retries=1) as client:
            with pytest.raises(ModelError, match="timed out after 2 attempts"):
                await client.complete(USER)


async def test_native_tool_calls_come_back_as_dicts() -> None:
    script = [
        Reply.tool_calls_of([("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})], text="two")
    ]
    with ScriptedModelServer(script) as server:
        async with client_for(server) as client:
            built = build_constraint(get_adapter("openai"), [TOOL], DecodingConstraint("json_schema", True))
            extras = built.request_extras()
            completion = await client.complete(USER, **extras)
        (body,) = server.requests
    assert body["tool_choice"] == "required" and body["tools"][0]["function"]["name"] == "get_weather"
    assert "structured_outputs" not in body
    assert completion.finish_reason == "tool_calls" and completion.text == "two"
    assert [json.loads(c["function"]["arguments"]) for c in completion.tool_calls] == [
        {"city": "A"},
        {"city": "B"},
    ]


async def test_streaming_reassembles_text_tool_calls_and_usage() -> None:
    long_text = "It is sunny in Oslo today, with a light breeze from the west."
    script = [
        Reply(text=long_text, completion_tokens=13),
        Reply.tool_calls_of([("get_weather", {"city": "Oslo, Norway"}), ("get_weather", {"city": "Bergen"})]),
    ]
    seen: list[str] = []

    async def on_text(fragment: str) -> None:
        seen.append(fragment)

    with ScriptedModelServer(script, chunk_size=5) as server:
        async with client_for(server) as client:
            text = await client.complete(USER, stream=True, on_text=on_text)
            calls = await client.complete(USER, stream=True)
        bodies = server.requests
    assert text.text == long_text and "".join(seen) == long_text and len(seen) == len(long_text) // 5 + 1
    assert text.usage.completion_tokens == 13 and text.finish_reason == "stop"
    assert calls.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in calls.tool_calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls.tool_calls] == [
        "Oslo, Norway",
        "Bergen",
    ]
    assert all(c["id"] for c in calls.tool_calls)
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in bodies)


async def test_streaming_failure_is_retried_like_any_other() -> None:
    with ScriptedModelServer([Reply.error(502), Reply(text="ok")]) as server:
        async with client_for(server) as client:
            completion = await client.complete(USER, stream=True)
    assert isinstance(completion, Completion) and completion.text == "ok" and completion.attempts == 2


async def test_model_name_comes_from_the_server_when_not_configured(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with ScriptedModelServer(["hi"], model="served-model") as server:
        async with ModelClient(base_url=server.base_url) as client:
            completion = await client.complete(USER)
        assert server.requests[0]["model"] == "served-model" and completion.model == "served-model"


async def test_environment_configures_the_client(monkeypatch) -> None:
    with ScriptedModelServer(["hi"]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_MODEL", "env-model")
        async with ModelClient() as client:
            await client.complete(USER)
        assert server.requests[0]["model"] == "env-model"


def test_http_modes_are_direct_and_the_sdk(monkeypatch) -> None:
    """Two ways a completion travels; the removed third (the SDK over aiohttp's pool) and a typo each get an
    error naming both that remain."""
    assert HTTP_MODES == ("direct", "httpx")
    for value, said in (("aiohttp", "'aiohttp' was removed (it was the openai SDK over aiohttp's pool)"),
                        ("direkt", "'direkt' is unknown")):
        monkeypatch.setenv("SA_MODEL_HTTP", value)
        with pytest.raises(ValueError, match="use 'direct' \\(the default\\) or 'httpx'") as refused:
            ModelClient(base_url="http://127.0.0.1:9/v1", model="m")
        assert said in str(refused.value)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_body_on_the_wire_is_what_the_sdk_create_sends(stream: bool) -> None:
    """`complete` posts the plain body itself (no SDK param transform): same keys, values and order."""
    tools = [TOOL.to_openai()]
    extra_body = {"structured_outputs": {"grammar": 'root ::= "x"'}, "top_k": 3}
    messages = [{"role": "system", "content": "é \u2028 tools"}, *USER]
    with ScriptedModelServer(["a", "b"]) as server:
        async with client_for(server) as client:
            sdk = await client._client.chat.completions.create(
                model="m", messages=messages, temperature=0.0, max_completion_tokens=5, stop=["</s>"],
                seed=1, tools=tools, tool_choice="required", extra_body=extra_body,
                **({"stream": True, "stream_options": {"include_usage": True}} if stream else {}))
            if stream:
                async for _ in sdk:
                    pass
            ours = await client.complete(messages, temperature=0.0, max_tokens=5, stop=["</s>"], seed=1,
                                         tools=tools, tool_choice="required", extra_body=extra_body,
                                         stream=stream)
        reference, sent = server.requests
    assert ours.text == "b"
    assert json.dumps(sent) == json.dumps(reference)  # key order included
    assert sent["structured_outputs"] == extra_body["structured_outputs"] and sent["top_k"] == 3
    assert ("stream" in sent) is stream and "extra_body" not in sent


async def test_every_mode_sends_the_sdks_headers_and_raises_the_sdks_errors(http_mode: str) -> None:
    """The direct path keeps what a caller of the SDK relies on: its auth and identifying headers, and the
    very exception classes the SDK raises (here read through `ModelError.__cause__`)."""
    import openai

    script = ["hi", Reply.error(404, "no such model"), Reply.error(429, "slow down", retry_after=0)]
    with ScriptedModelServer(script) as server:
        async with ModelClient(base_url=server.base_url, model="m", api_key="sk-test",
                               max_retries=0) as client:
            await client.complete(USER)
            with pytest.raises(ModelError) as missing:
                await client.complete(USER)
            with pytest.raises(ModelError) as limited:
                await client.complete(USER)
        headers = server.request_headers[0]
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["user-agent"].startswith("AsyncOpenAI/Python")
    assert headers["content-type"] == "application/json"
    assert isinstance(missing.value.__cause__, openai.NotFoundError) and missing.value.status == 404
    assert "no such model" in str(missing.value)
    assert isinstance(limited.value.__cause__, openai.RateLimitError) and limited.value.retryable



class _Sse:
    """A server that speaks SSE its own way: `trickle` sends a content chunk every 0.1 s for 3 s (each
    within any read timeout, the whole far past the client's), `garbled` an event whose data is not JSON."""

    def __init__(self, mode: str) -> None:
        import http.server
        import threading
        import time

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                server.requests += 1
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
                try:
                    if mode == "garbled":
                        self.wfile.write(b"data: {\"id\": \"c\", \"choices\": [{\n\n")
                        self.wfile.flush()
                        return
                    for _ in range(30):
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                        time.sleep(0.1)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.requests = 0
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> _Sse:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()


async def test_a_server_that_trickles_is_bounded_by_the_timeout_as_a_whole() -> None:
    """A token every 0.1 s never trips a read timeout of 0.5 s; the whole reply is bounded by it too."""
    with _Sse("trickle") as server:
        async with ModelClient(base_url=server.base_url, model="m", timeout=0.5, max_retries=1,
                               backoff_base=0.001, backoff_max=0.01) as client:
            slow = r"timed out after 2 attempts: the whole reply did not arrive within model.timeout \(0.5 s"
            with pytest.raises(ModelError, match=slow) as caught:
                await client.complete(USER, stream=True)
    assert caught.value.retryable and server.requests == 2


async def test_a_stream_that_is_not_json_is_a_model_error_naming_the_server_and_retried() -> None:
    with _Sse("garbled") as server:
        async with ModelClient(base_url=server.base_url, model="m", max_retries=1, backoff_base=0.001,
                               backoff_max=0.01) as client:
            garbled = "sent a streamed reply that cannot be read after 2 attempts: an event's data is not"
            attempts: list[int] = []
            with pytest.raises(ModelError, match=garbled) as caught:
                await client.complete(USER, stream=True, on_attempt=attempts.append)
    assert server.base_url in str(caught.value) and server.requests == 2
    assert attempts == [2]  # a viewer of the fragments hears that the reply starts again


def test_the_live_view_puts_a_retried_attempt_on_a_line_of_its_own() -> None:
    import io

    from rich.console import Console

    from runtime.client.replay import _Live
    from runtime.streaming import Delta

    out = io.StringIO()
    live = _Live(Console(file=out, width=200))
    for delta in (Delta("r", "r/1", 1, 0, text="The ans"), Delta("r", "r/1", 1, 1, attempt=2),
                  Delta("r", "r/1", 1, 2, text="The answer"), Delta("r", "r/1", 1, 3, done=True)):
        live.show(delta)
    assert out.getvalue().splitlines() == [
        "The ans", "(attempt 2: the model server is asked again)", "The answer"]
