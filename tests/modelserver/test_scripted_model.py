"""The scripted model server itself: routes, queue/responder order, concurrency, SSE shape."""

from __future__ import annotations

import json
import threading

import anyio
import httpx
import pytest

from runtime.model.client import ModelClient
from runtime.testing import Reply, ScriptedModelServer, last_message

pytestmark = pytest.mark.anyio


async def test_models_route_and_unknown_routes() -> None:
    with ScriptedModelServer(model="tiny") as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            models = (await http.get("/models")).json()
            missing = await http.post("/nope", json={})
            bad_json = await http.post("/chat/completions", content=b"{oops")
    assert models["data"][0]["id"] == "tiny"
    assert missing.status_code == 404 and bad_json.status_code == 400


async def test_an_exhausted_script_fails_loudly_with_501() -> None:
    with ScriptedModelServer() as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            response = await http.post("/chat/completions", json={"messages": []})
    assert response.status_code == 501 and "no scripted reply left" in response.json()["error"]["message"]


async def test_queue_first_then_responder_and_a_broken_responder_is_reported() -> None:
    def responder(body: dict) -> str:
        if last_message(body) == "boom":
            raise RuntimeError("kaput")
        return "echo: " + last_message(body, "user")

    with ScriptedModelServer(["queued"], responder=responder) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            texts = []
            for content in ["a", "b"]:
                body = {"messages": [{"role": "user", "content": content}]}
                texts.append(
                    (await http.post("/chat/completions", json=body)).json()["choices"][0]["message"][
                        "content"
                    ]
                )
            server.push(Reply(text="pushed"))
            body = {"messages": [{"role": "user", "content": "c"}]}
            texts.append(
                (await http.post("/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
            )
            broken = await http.post(
                "/chat/completions", json={"messages": [{"role": "user", "content": "boom"}]}
            )
    assert texts == ["queued", "echo: b", "pushed"]
    assert broken.status_code == 500 and "RuntimeError: kaput" in broken.text


async def test_many_concurrent_agents_get_their_own_replies() -> None:
    """A content-keyed responder makes 200 concurrent requests deterministic regardless of order."""
    threads: set[int] = set()
    lock = threading.Lock()

    def responder(body: dict) -> Reply:
        with lock:
            threads.add(threading.get_ident())
        agent = last_message(body, "user")
        return Reply.tool_call("report", {"agent": agent}, prompt_tokens=1, completion_tokens=1)

    results: dict[str, dict] = {}
    with ScriptedModelServer(responder=responder, record=False) as server:
        async with ModelClient(base_url=server.base_url, model="m", max_retries=0) as client:

            async def one(agent: str) -> None:
                completion = await client.complete([{"role": "user", "content": agent}])
                results[agent] = json.loads(completion.tool_calls[0]["function"]["arguments"])

            async with anyio.create_task_group() as group:
                for i in range(200):
                    group.start_soon(one, f"agent-{i}")
        assert server.served == 200 and server.requests == []  # record=False keeps no bodies
    assert results == {f"agent-{i}": {"agent": f"agent-{i}"} for i in range(200)}
    assert len(threads) > 1  # served concurrently, not one by one


async def test_sse_stream_has_vllm_shape() -> None:
    reply = Reply.tool_calls_of([("f", {"x": 1})], text="hi")
    with ScriptedModelServer([reply], chunk_size=4) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            body = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}
            response = await http.post("/chat/completions", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    lines = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": "hi"}
    header = deltas[2]["tool_calls"][0]
    assert header["index"] == 0 and header["id"] and header["function"] == {"name": "f", "arguments": ""}
    fragments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[3:-1])
    assert json.loads(fragments) == {"x": 1}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] >= 2


async def test_requests_are_recorded_in_order_and_can_be_cleared() -> None:
    with ScriptedModelServer(["1", "2"]) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            for n in ("first", "second"):
                await http.post(
                    "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": n}]}
                )
        assert [last_message(b) for b in server.requests] == ["first", "second"] and server.remaining == 0
        server.clear_requests()
        assert server.requests == []


def test_a_reply_must_be_text_or_reply() -> None:
    with pytest.raises(TypeError, match="Reply or a str"):
        ScriptedModelServer([42])  # type: ignore[list-item]
