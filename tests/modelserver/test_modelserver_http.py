"""The model server without the model: validation errors, constraints, SSE, queueing, cancellation.

A stub backend stands in for the engine (it "generates" a fixed text a word at a time), while the constraint
path uses the real xgrammar compiler on an empty vocabulary, so each 4xx is the one the real server gives.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import xgrammar as xgr

from runtime.modelserver import SERVED_MODEL_NAME, create_app, serve_in_thread
from runtime.modelserver.engine import Delta, SamplingParams, TextAssembler
from runtime.modelserver.grammar import Constraint, GrammarCache, constraint_for
from runtime.modelserver.protocol import RequestError, parse_chat_request

REPLY = "The quick brown fox jumps over the lazy dog"


class StubBackend:
    """Word-per-token backend; prompt length = characters of the joined message contents."""

    context_length = 200

    def __init__(self, delay: float = 0.0, words: int | None = None) -> None:
        self.grammars = GrammarCache(xgr.TokenizerInfo([]))
        self.delay = delay
        self.words = words
        self.started = threading.Event()
        self.cancelled_seen = threading.Event()
        self.produced = 0
        self.calls: list[tuple[list[int], SamplingParams, Any]] = []

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return [ord(c) for m in messages for c in str(m.get("content") or "")]

    def token_budget(self, prompt_len: int, requested: int | None) -> int:
        if prompt_len >= self.context_length:
            raise RequestError(f"the prompt is {prompt_len} tokens, over the context length of 200")
        return requested or 16

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, grammar: Any, cancelled: threading.Event
    ) -> Iterator[Delta]:
        self.calls.append((prompt_ids, params, grammar))
        self.started.set()
        words = REPLY.split(" ") * (self.words or 1)
        n = min(len(words), params.max_tokens)
        try:
            for i, w in enumerate(words[:n]):
                if cancelled.is_set():
                    return
                time.sleep(self.delay)
                self.produced += 1
                yield Delta(w if i == 0 else " " + w)
        finally:
            if cancelled.is_set():
                self.cancelled_seen.set()
        yield Delta(
            "",
            finish_reason="length" if n < len(words) else "stop",
            prompt_tokens=len(prompt_ids),
            completion_tokens=n,
        )


def body(**extra: Any) -> dict[str, Any]:
    return {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture
def stub() -> StubBackend:
    return StubBackend()


@pytest.fixture
async def client(stub: StubBackend):
    transport = httpx.ASGITransport(app=create_app(stub))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


# -- request validation (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps(body(guided_json={"type": "object"})).encode(), "`guided_json` was removed"),
        (
            json.dumps(body(guided_decoding_backend="xgrammar")).encode(),
            "`guided_decoding_backend` was removed",
        ),
        (
            json.dumps(body(structured_outputs={"regex": "a", "choice": ["a"]})).encode(),
            "found regex, choice",
        ),
        (json.dumps(body(structured_outputs={})).encode(), "found none"),
        (
            json.dumps(body(structured_outputs={"choices": ["a"]})).encode(),
            "structured_outputs.choices: unknown",
        ),
        (json.dumps(body(top_k=3)).encode(), "top_k: unknown field"),
        (json.dumps(body(n=2)).encode(), "only n=1"),
        (json.dumps(body(tool_choice="required")).encode(), "tool_choice 'required'"),
        (json.dumps({"messages": []}).encode(), "messages"),
        (
            json.dumps(
                body(structured_outputs={"regex": "a"}, response_format={"type": "json_object"})
            ).encode(),
            "not both",
        ),
    ],
)
def test_bad_requests_are_400_with_a_message(raw: bytes, message: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(raw)
    assert err.value.status == 400
    assert message in err.value.message


def test_openai_sdk_fields_are_accepted() -> None:
    req = parse_chat_request(
        json.dumps(body(user="u", parallel_tool_calls=True, stop="END", max_completion_tokens=5)).encode()
    )
    assert req.stop_strings == ["END"]
    assert req.token_limit == 5


def test_constraints_normalise_to_one_cache_key() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    as_dict = constraint_for(
        parse_chat_request(json.dumps(body(structured_outputs={"json": schema})).encode())
    )
    as_text = constraint_for(
        parse_chat_request(json.dumps(body(structured_outputs={"json": json.dumps(schema)})).encode())
    )
    as_rf = constraint_for(
        parse_chat_request(
            json.dumps(
                body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            ).encode()
        )
    )
    assert as_dict is not None and as_text is not None and as_rf is not None
    assert as_dict.key == as_text.key == as_rf.key
    lark = constraint_for(
        parse_chat_request(json.dumps(body(structured_outputs={"grammar": "start: 'a'"})).encode())
    )
    ebnf = constraint_for(
        parse_chat_request(json.dumps(body(structured_outputs={"grammar": 'root ::= "a"'})).encode())
    )
    assert (lark and lark.kind, ebnf and ebnf.kind) == ("lark", "grammar")


def _accepts(compiled: Any, text: str) -> bool:
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return m.accept_string(text) and m.is_terminated()


def test_every_constraint_kind_compiles_and_enforces() -> None:
    cache = GrammarCache(xgr.TokenizerInfo([]))
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "type": "tag",
                    "begin": "<tool_call>",
                    "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
                    "end": "</tool_call>",
                }
            ],
            "at_least_one": True,
            "stop_after_first": True,
        },
    }
    cases = [
        (
            {"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
            '{"n":3}',
            "{}",
        ),
        ({"json_object": True}, '{"x":[1]}', "[1]"),
        ({"regex": "(yes|no)"}, "yes", "maybe"),
        ({"choice": ['say "hi"', "bye"]}, 'say "hi"', "hi"),
        ({"grammar": 'root ::= "a" [0-9]+'}, "a42", "b"),
        ({"grammar": 'start: "a" NUM\nNUM: /[0-9]+/'}, "a7", "a"),
        ({"structural_tag": json.dumps(tag)}, "<tool_call>12</tool_call>", "<tool_call>x</tool_call>"),
    ]
    for so, good, bad in cases:
        c = constraint_for(parse_chat_request(json.dumps(body(structured_outputs=so)).encode()))
        assert c is not None
        compiled = cache.compile(c)
        assert _accepts(compiled, good), (so, good)
        assert not _accepts(compiled, bad), (so, bad)
    assert cache.misses == len(cases)
    cache.compile(Constraint("regex", "(yes|no)"))
    assert cache.hits == 1


def test_json_constraints_allow_no_free_whitespace_unless_the_server_says_so() -> None:
    """vLLM's rule, set server-wide: with free whitespace a small model ran away in it until max_tokens
    (`"name"\n\n:\n\n...`); without it, JSON has vLLM's separators and nothing between tokens."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["name", "n"]}
    c = constraint_for(parse_chat_request(json.dumps(body(structured_outputs={"json": schema})).encode()))
    assert c is not None
    strict = GrammarCache(xgr.TokenizerInfo([])).compile(c)
    assert _accepts(strict, '{"name":"x","n":1}')
    for loose in ('{"name"\n\n:\n\n"x","n":1}', '{ "name":"x","n":1}', '{"name":"x","n":1}\n'):
        assert not _accepts(strict, loose), loose
    free = GrammarCache(xgr.TokenizerInfo([]), any_whitespace=True)
    assert _accepts(free.compile(c), '{"name"\n\n:\n\n"x", "n": 1}')
    # a request can tighten a server that allows free whitespace, with vLLM's own option
    tight = constraint_for(parse_chat_request(json.dumps(body(structured_outputs={
        "json": schema, "disable_any_whitespace": True})).encode()))
    assert tight is not None and not _accepts(free.compile(tight), '{"name"\n:"x","n":1}')
    assert _accepts(free.compile(tight), '{"name":"x","n":1}')


def test_grammar_that_does_not_compile_is_a_400_without_cpp_noise() -> None:
    cache = GrammarCache(xgr.TokenizerInfo([]))
    with pytest.raises(RequestError) as err:
        cache.compile(Constraint("grammar", "root ::= missing_rule"))
    assert err.value.status == 400
    assert 'Rule "missing_rule" is not defined' in err.value.message
    assert ".cc:" not in err.value.message


class _CharTokenizer:
    """One character per token id: enough to exercise the assembler's stop-string hold-back."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def test_text_assembler_holds_back_partial_stop_strings() -> None:
    asm = TextAssembler(_CharTokenizer(), ["END"])
    out = [asm.add(ord(c)) for c in "abEND"]
    assert out == ["a", "b", "", "", ""]
    assert asm.stopped and asm.flush() == ""
    asm = TextAssembler(_CharTokenizer(), ["END"])
    out = [asm.add(ord(c)) for c in "xEN"]
    assert "".join(out) == "x"
    assert asm.flush() == "EN"  # not a stop after all: released at the end


# -- HTTP surface with the stub backend ------------------------------------------------------------------


@pytest.mark.anyio
async def test_health_and_models_list_the_served_name(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json()["status"] == "ok"
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [SERVED_MODEL_NAME]
    assert models["data"][0]["aliases"] == ["local"]


@pytest.mark.anyio
async def test_errors_are_4xx_and_the_server_keeps_serving(client: httpx.AsyncClient) -> None:
    bad = [
        (await client.post("/v1/chat/completions", content=b"{oops"), 400, "not valid JSON"),
        (await client.post("/v1/chat/completions", json=body(model="gpt-4")), 404, "`gpt-4` does not exist"),
        (
            await client.post(
                "/v1/chat/completions", json=body(structured_outputs={"grammar": "root ::= nope"})
            ),
            400,
            "does not compile",
        ),
        (
            await client.post("/v1/chat/completions", json=body(structured_outputs={"json": "{not json"})),
            400,
            "structured_outputs.json is not valid JSON",
        ),
        (
            await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 300}]}
            ),
            400,
            "over the context length",
        ),
    ]
    for response, status, message in bad:
        assert response.status_code == status
        assert message in response.json()["error"]["message"]
    ok = await client.post("/v1/chat/completions", json=body(model="local", max_tokens=4))
    assert ok.status_code == 200
    data = ok.json()
    assert data["choices"][0]["message"]["content"] == "The quick brown fox"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert data["model"] == "local"


@pytest.mark.anyio
async def test_request_parameters_reach_the_backend(client: httpx.AsyncClient, stub: StubBackend) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json=body(
            temperature=0, top_p=0.5, seed=7, stop=["fox"], max_tokens=9, structured_outputs={"regex": "a+"}
        ),
    )
    assert r.status_code == 200
    _, params, grammar = stub.calls[-1]
    assert (params.temperature, params.top_p, params.seed, params.stop, params.max_tokens) == (
        0,
        0.5,
        7,
        ["fox"],
        9,
    )
    assert _accepts(grammar, "aaa") and not _accepts(grammar, "b")


@pytest.mark.anyio
async def test_streaming_is_openai_sse_and_matches_the_full_text(client: httpx.AsyncClient) -> None:
    full = (await client.post("/v1/chat/completions", json=body())).json()["choices"][0]["message"]["content"]
    events = []
    async with client.stream(
        "POST", "/v1/chat/completions", json=body(stream=True, stream_options={"include_usage": True})
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full == REPLY
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9


def test_a_client_disconnect_cancels_its_generation() -> None:
    stub = StubBackend(delay=0.05, words=50)  # 450 words: about 20 s if nobody cancels
    handle = serve_in_thread(engine=stub)
    try:
        with httpx.Client(base_url=handle.base_url, timeout=10) as c:
            with c.stream("POST", "/v1/chat/completions", json=body(stream=True, max_tokens=400)) as r:
                lines = r.iter_lines()
                while "quick" not in next(lines):
                    pass
            assert stub.cancelled_seen.wait(10), "the generation was not cancelled"
            assert stub.produced < 400
            # the worker is free again: a new request completes
            after = c.post("/v1/chat/completions", json=body(max_tokens=2)).json()
            assert after["choices"][0]["message"]["content"] == "The quick"
    finally:
        handle.stop()


def test_requests_queue_and_never_interleave() -> None:
    stub = StubBackend(delay=0.01)
    handle = serve_in_thread(engine=stub)
    results: list[str] = []
    try:

        def one(i: int) -> None:
            with httpx.Client(base_url=handle.base_url, timeout=30) as c:
                r = c.post(
                    "/v1/chat/completions", json=body(messages=[{"role": "user", "content": "x" * (i + 1)}])
                )
                results.append(r.json()["choices"][0]["message"]["content"])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        handle.stop()
    assert results == [REPLY] * 4
    assert sorted(len(p) for p, _, _ in stub.calls) == [1, 2, 3, 4]


def test_cli_registers_sa_model_serve() -> None:
    from typer.testing import CliRunner

    from runtime.cli import app

    result = CliRunner().invoke(app, ["model", "serve", "--help"])
    assert result.exit_code == 0
    assert "--port" in result.output and "--model" in result.output


def test_a_non_streaming_client_that_gives_up_cancels_its_generation() -> None:
    stub = StubBackend(delay=0.05, words=50)
    handle = serve_in_thread(engine=stub)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{handle.base_url}/v1/chat/completions",
                json=body(max_tokens=400),
                timeout=httpx.Timeout(10, read=0.5),
            )
        assert stub.cancelled_seen.wait(10), "the generation was not cancelled"
        assert stub.produced < 400
    finally:
        handle.stop()


def test_messages_are_normalised_for_a_chatml_template_without_tool_support() -> None:
    from runtime.modelserver.engine import _normalise_messages

    template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    msgs = _normalise_messages(
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": "42"},
        ],
        template,
    )
    assert msgs[0]["content"] == "ab"
    assert msgs[1]["content"] == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert msgs[2]["content"] == "42"


def test_json_schema_property_order_is_kept() -> None:
    """xgrammar emits properties in schema order; reordering keys would change what the model must write."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "integer"}}}
    c = constraint_for(parse_chat_request(json.dumps(body(structured_outputs={"json": schema})).encode()))
    assert c is not None
    compiled = GrammarCache(xgr.TokenizerInfo([])).compile(c)
    assert _accepts(compiled, '{"name":"x","arguments":1}')
    assert not _accepts(compiled, '{"arguments":1,"name":"x"}')
