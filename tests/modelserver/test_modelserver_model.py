"""The real SmolLM2-135M behind `sa model serve`: constrained tool calls, streaming parity, the openai client.

One server process is started for the whole session (the first run also converts the GGUF into the user cache,
15–30 s). Decoding is greedy and every schema is bounded (maxLength, integer ranges), because this tiny model
runs away inside unbounded strings. The calls are validated with pydantic models that are independent of the
grammar engine that produced them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from runtime.modelserver import SERVED_MODEL_NAME, ServerProcess, start_model_server

pytestmark = pytest.mark.slow


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GetWeather(_Args):
    city: str = Field(min_length=1, max_length=40)
    unit: Literal["celsius", "fahrenheit"]


class SearchWeb(_Args):
    query: str = Field(min_length=1, max_length=60)
    max_results: int = Field(ge=1, le=10)


class ReadFile(_Args):
    path: str = Field(min_length=1, max_length=60)


class WeatherCall(_Args):
    name: Literal["get_weather"]
    arguments: GetWeather


class SearchCall(_Args):
    name: Literal["search_web"]
    arguments: SearchWeb


class ReadCall(_Args):
    name: Literal["read_file"]
    arguments: ReadFile


ToolCall = TypeAdapter(Annotated[WeatherCall | SearchCall | ReadCall, Field(discriminator="name")])
CALL_SCHEMA = ToolCall.json_schema()

SYSTEM = (
    "You are a function-calling assistant. Answer with exactly one tool call as JSON "
    '{"name": ..., "arguments": {...}}. Tools:\n'
    "- get_weather(city: string, unit: celsius|fahrenheit): current weather in a city\n"
    "- search_web(query: string, max_results: integer 1-10): search the web\n"
    "- read_file(path: string): read a local file"
)
PROMPTS = [
    "What's the weather in Paris right now?",
    "Find three web pages about the xgrammar library.",
    "Show me the contents of /etc/hosts.",
    "Is it cold in Tokyo today? Use fahrenheit.",
    "Search for news about NATS JetStream, five results.",
]

# The same three tools, hermes-style, written by hand as an EBNF grammar with bounded strings.
EBNF = r"""
root ::= "<tool_call>" call "</tool_call>"
call ::= weather | search | read
weather ::= "{\"name\": \"get_weather\", \"arguments\": {\"city\": " str40 ", \"unit\": " unit "}}"
search ::= "{\"name\": \"search_web\", \"arguments\": {\"query\": " str60 ", \"max_results\": " small "}}"
read ::= "{\"name\": \"read_file\", \"arguments\": {\"path\": " str60 "}}"
unit ::= "\"celsius\"" | "\"fahrenheit\""
small ::= [1-9] | "10"
str40 ::= "\"" [a-zA-Z0-9 ,.'/_-]{1,40} "\""
str60 ::= "\"" [a-zA-Z0-9 ,.'/_-]{1,60} "\""
"""


@pytest.fixture(scope="session")
def model_server() -> Iterator[ServerProcess]:
    server = start_model_server(port=0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def client(model_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


def _messages(prompt: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def test_openai_client_gets_schema_valid_tool_calls_with_structured_outputs_json(
    client: openai.OpenAI,
) -> None:
    assert [m.id for m in client.models.list().data] == [SERVED_MODEL_NAME]
    names = set()
    for prompt in PROMPTS:
        r = client.chat.completions.create(
            model=SERVED_MODEL_NAME,
            messages=_messages(prompt),  # type: ignore[arg-type]
            temperature=0,
            max_tokens=120,
            extra_body={"structured_outputs": {"json": CALL_SCHEMA, "disable_any_whitespace": True}},
        )
        text = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop", (prompt, text)
        assert "\n" not in text  # disable_any_whitespace reached the grammar
        call = ToolCall.validate_python(json.loads(text))
        names.add(call.name)
        assert r.usage is not None and r.usage.completion_tokens > 5
    assert names <= {"get_weather", "search_web", "read_file"}


def test_ebnf_constraint_gives_parseable_hermes_tool_calls(client: openai.OpenAI) -> None:
    for prompt in PROMPTS:
        r = client.chat.completions.create(
            model="local",
            messages=_messages(prompt),  # type: ignore[arg-type]
            temperature=0,
            max_tokens=120,
            extra_body={"structured_outputs": {"grammar": EBNF}},
        )
        text = r.choices[0].message.content or ""
        m = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.S)
        assert m, (prompt, text)
        ToolCall.validate_python(json.loads(m.group(1)))


def test_streaming_returns_the_same_text_as_non_streaming_under_greedy(client: openai.OpenAI) -> None:
    for extra in ({}, {"structured_outputs": {"json": CALL_SCHEMA}}):
        kwargs: dict[str, Any] = {
            "model": SERVED_MODEL_NAME,
            "messages": _messages("Tell me about the weather in Rome."),
            "temperature": 0,
            "max_tokens": 40,
            "extra_body": extra,
        }
        whole = client.chat.completions.create(**kwargs)
        pieces = []
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert whole.choices[0].message.content
        assert "".join(pieces) == whole.choices[0].message.content
        assert finish == whole.choices[0].finish_reason


def test_stop_strings_and_choice_on_the_real_tokenizer(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=SERVED_MODEL_NAME,
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        temperature=0,
        max_tokens=5,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert r.choices[0].message.content in ("yes", "no")
    word = {"type": "string", "pattern": "^[a-z]{1,8}$"}
    schema = {"type": "object", "properties": {"a": word, "b": word}, "required": ["a", "b"]}
    r = client.chat.completions.create(
        model=SERVED_MODEL_NAME,
        messages=[{"role": "user", "content": "Write a JSON object with keys a and b."}],
        temperature=0,
        max_tokens=40,
        stop=[","],  # the schema forces a comma after the first value: the stop string must cut there
        extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}},
    )
    text = r.choices[0].message.content or ""
    assert re.fullmatch(r'\{"a": ?"[a-z]{1,8}"', text), text
    assert r.choices[0].finish_reason == "stop"


def test_real_server_rejects_bad_requests_and_keeps_serving(model_server: ServerProcess) -> None:
    url = f"{model_server.base_url}/v1/chat/completions"
    long_prompt = {"messages": [{"role": "user", "content": "hello " * 9000}]}
    r = httpx.post(url, json=long_prompt, timeout=60)
    assert r.status_code == 400 and "context length of 8192" in r.json()["error"]["message"]
    r = httpx.post(
        url, json={**_messages_body(), "structured_outputs": {"grammar": "root ::= undefined"}}, timeout=60
    )
    assert r.status_code == 400 and "does not compile" in r.json()["error"]["message"]
    r = httpx.post(url, json={**_messages_body(), "guided_regex": "a+"}, timeout=60)
    assert r.status_code == 400 and "structured_outputs.regex" in r.json()["error"]["message"]
    r = httpx.post(url, json={**_messages_body(), "max_tokens": 3, "temperature": 0}, timeout=600)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def _messages_body() -> dict[str, Any]:
    return {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "Say hi."}]}


@pytest.mark.anyio
async def test_the_demo_bundle_runs_in_process_against_sa_model_serve(model_server: ServerProcess):
    """The three lines of the README against the real CPU model: the demo bundle's constraint and
    final-turn forcing make the 135M model compute and answer, in this process, without NATS."""
    from pathlib import Path

    from runtime import Agent
    from runtime import events as ev

    async with Agent.from_bundle(Path(__file__).parents[2] / "bundles" / "demo",
                                 model_url=model_server.base_url) as agent:
        result = await agent.run("What is 17 * 23 + 4?")
    assert result.status == "completed", result.reason
    assert any(isinstance(e, ev.ScriptCompleted) and e.tool == "calculator"
               for e in ev.expand_all(result.events))
    assert result.output == {"answer": "395"}
