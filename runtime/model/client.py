"""The model client: one chat completion against any OpenAI-compatible server (vLLM in production).

    client = ModelClient(base_url="http://gpu:8000/v1", model="Qwen/Qwen3-Coder-30B-A3B-Instruct")
    extras = build_constraint(adapter, tools, constraint).request_extras()
    completion = await client.complete(messages, **extras)

Why a wrapper over `openai.AsyncOpenAI` rather than the bare client: the runtime needs one result
type (`Completion`, the same for streaming and not), one failure type (`ModelError`, which the loop
records as a `model.failed` event instead of crashing), retries it controls (backoff on 429, 5xx,
connection errors and streams cut short, honouring `Retry-After`; never on 4xx request errors, which would
fail the same way again), and a guard against vLLM's removed `guided_*` fields, which vLLM ignores silently.
What counts as a whole streamed reply is `runtime.model.reply`'s to say, when to retry `retries`'.

A server that is full says so with 429 or 503 and usually a `Retry-After`: the client waits that long
(bounded, plus jitter) and tries again, telling `on_throttle` each time (the host records
`model.throttled`). With a `limiter` (`runtime.model.limits.Gate`: the endpoint's fleet-wide share),
every HTTP attempt first takes a permit, in the order of the gate's fair queue, and gives it back as soon
as the answer is read: a throttled call waits outside the endpoint, holding no permit.

Configuration comes from arguments or the environment: `OPENAI_BASE_URL`, `OPENAI_API_KEY` (vLLM
needs none; a placeholder is sent), `OPENAI_MODEL`. Without a model name the first model the server
lists at `/v1/models` is used (a vLLM server serves exactly one).

How a completion travels (`SA_MODEL_HTTP`): `direct` (the default) posts it over aiohttp with the SDK's
headers and raises the SDK's errors, without the SDK's per-request machinery (`runtime.model.wire` says
why); `httpx` sends it through the plain openai SDK with its own httpx transport, the fallback should a
server or proxy need something only the SDK does. The body on the wire is the same bytes in both. Listing
models (`resolve_model`) always goes through the SDK.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import httpx2
import msgspec
import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from runtime.model.limits import RETRY_AFTER_MAX_S, OnThrottle, Throttle, Ticket, notify
from runtime.model.reply import (
    StreamCut,
    StreamEnd,
    TooSlow,
)
from runtime.model.retries import RETRY_STATUS, THROTTLE_STATUS, RetryPolicy, describe
from runtime.model.sdk import RawChunks, http_client, http_mode
from runtime.model.wire import ChatReply, ChatWire
from runtime.types import Usage

if TYPE_CHECKING:
    from runtime.model.limits import Gate


# `complete(**extras)` keys that are request options of the SDK, not fields of the JSON body
_REQUEST_OPTIONS = {"extra_headers": "headers", "extra_query": "params", "timeout": "timeout"}
# the order in which `chat.completions.create` lays out its body (openai 3.x); `_post` keeps it so the
# bytes on the wire are the same as the SDK's (tests/model/test_model_client.py compares them)
_BODY_ORDER = (
    "model", "stream", "service_tier", "messages", "audio", "frequency_penalty", "function_call",
    "functions", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
    "moderation", "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning_effort", "response_format",
    "safety_identifier", "seed", "stop", "store", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
)


class Completion(msgspec.Struct, frozen=True):
    """One model reply: raw text, native tool calls (if the server returned any), usage and timing.

    `latency_ms` is the wall time of the whole `complete` call, retries and backoff included;
    `attempts` says how many requests it took; `queued_ms` how much of it was spent waiting for the
    limiter's permits.
    """

    text: str
    tool_calls: list[dict[str, Any]] | None
    usage: Usage
    finish_reason: str
    latency_ms: float
    model: str = ""
    attempts: int = 1
    id: str = ""  # the server's id for the completion (`gen_ai.response.id`)
    queued_ms: float = 0.0


class _Reply(NamedTuple):
    """One attempt's reply, as either path reads it (before the client adds timing and attempts)."""

    text: str
    calls: list[dict[str, Any]] | None
    usage: Usage
    finish: str
    model: str
    id: str


class ModelError(Exception):
    """The model could not be reached or refused the request, after any retries."""

    def __init__(
        self, message: str, *, status: int | None = None, attempts: int = 0, retryable: bool = False
    ):
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.retryable = retryable


# well-known `gen_ai.provider.name` values by the host of the API (OpenTelemetry's GenAI conventions)
_PROVIDERS = (("api.openai.com", "openai"), (".openai.azure.com", "azure.ai.openai"),
              ("api.mistral.ai", "mistral_ai"), ("api.groq.com", "groq"), ("api.deepseek.com", "deepseek"),
              ("generativelanguage.googleapis.com", "gcp.gemini"), ("api.x.ai", "x_ai"))


def provider_of(base_url: str) -> str:
    """The `gen_ai.provider.name` of a server, from its address: a well-known API by its host name, else
    `vllm`, the OpenAI-compatible server this runtime is built for (a bundle's `model.provider` or
    `ModelClient(provider=...)` names another)."""
    host = httpx2.URL(base_url).host
    return next((name for suffix, name in _PROVIDERS if host == suffix or host.endswith(suffix)), "vllm")


TextCallback = Callable[[str], Awaitable[None] | None]
# a fragment of a streamed tool call: (index, id, name, arguments fragment); id and name come once
ToolCallCallback = Callable[[int, str, str, str], Awaitable[None] | None]


class ModelClient:
    """Chat completions with timeouts, retries with backoff, and usage capture."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        max_connections: int = 1000,
        provider: str | None = None,
        retry_after_max: float = RETRY_AFTER_MAX_S,
        throttle_retries: int | None = None,
    ) -> None:
        self.timeout = timeout  # one attempt, whole: a read timeout alone lets a trickling server go on
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "http://127.0.0.1:8000/v1"
        self.model = model or os.environ.get("OPENAI_MODEL") or None
        self.provider = provider or provider_of(self.base_url)
        url = httpx2.URL(self.base_url)
        self.server = (url.host, url.port or (443 if url.scheme == "https" else 80))
        self.retry = RetryPolicy(max(0, max_retries), backoff_base, backoff_max, retry_after_max,
                                 throttle_retries)
        self.limiter: Gate | None = None  # the endpoint's share (set by the host, or `Agent`)
        mode = http_mode()
        # retries are ours (we count and log them); the openai client must not retry underneath
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout,
            max_retries=0,
            http_client=http_client(timeout, max_connections),
        )
        self._wire = (ChatWire(self._client, timeout=timeout, max_connections=max_connections)
                      if mode == "direct" else None)

    async def aclose(self) -> None:
        await self._client.close()
        if self._wire is not None:
            await self._wire.aclose()

    async def __aenter__(self) -> ModelClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def resolve_model(self) -> str:
        """The configured model, or the first one the server lists."""
        if self.model:
            return self.model
        try:
            page = await self._client.models.list()
        except openai.OpenAIError as exc:
            raise ModelError(
                f"no model configured and listing models at {self.base_url} failed: {exc}"
            ) from exc
        if not page.data:
            raise ModelError(f"no model configured and {self.base_url}/models lists none")
        self.model = page.data[0].id
        return self.model

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: list[str] | str | None = None,
        seed: int | None = None,
        stream: bool = False,
        on_text: TextCallback | None = None,
        on_tool_call: ToolCallCallback | None = None,
        ticket: Ticket | None = None,
        on_throttle: OnThrottle | None = None,
        on_attempt: Callable[[int], Awaitable[None] | None] | None = None,
        **extras: Any,
    ) -> Completion:
        """One completion. `extras` are passed through (`extra_body`, `tools`, `tool_choice`, ...).

        `max_tokens` (the name bundles use) is sent as `max_completion_tokens`: vLLM's request model
        marks `max_tokens` deprecated in its favour, and so does OpenAI's API.

        With `stream=True` the reply arrives as SSE and `on_text` (sync or async) sees each content
        fragment as it comes; the returned `Completion` is the same as without streaming. If a
        streamed attempt fails and is retried, `on_text` sees the new attempt's fragments from the start.
        `on_tool_call` sees each fragment of a native tool call the same way. A stream cut short (it ends
        with neither a `finish_reason` nor `data: [DONE]`, or its connection drops mid-body) is a failed
        attempt, retried like a connection error; a server that answers with one JSON completion instead of
        a stream is read as that whole reply (`runtime.model.reply`).

        `ticket` is the call's place in the limiter's queue (its flow and priority); `on_throttle` hears of
        every wait after a 429/503 (see the module docstring); `on_attempt` (sync or async) hears the number
        of each attempt after the first as it starts, so a viewer of streamed fragments knows they restart.
        """
        _refuse_guided(extras)
        started = time.monotonic()
        name = model or await self.resolve_model()
        params: dict[str, Any] = {"model": name, "messages": messages, **extras}
        for key, value in (
            ("temperature", temperature),
            ("max_completion_tokens", max_tokens),
            ("stop", stop),
            ("seed", seed),
        ):
            if value is not None:
                params[key] = value
        attempt = throttled = 0
        queued = 0.0
        while True:
            attempt += 1
            if attempt > 1 and on_attempt is not None:
                started_again = on_attempt(attempt)
                if started_again is not None:
                    await started_again
            try:
                if self.limiter is None:
                    reply = await self._attempt(params, stream, on_text, on_tool_call)
                else:
                    asked = time.monotonic()
                    async with self.limiter.slot(ticket):
                        queued += time.monotonic() - asked
                        reply = await self._attempt(params, stream, on_text, on_tool_call)
                    self.limiter.spent(reply.usage)
            except (openai.APIStatusError, openai.APIConnectionError, StreamCut, TooSlow) as exc:
                status = getattr(exc, "status_code", None)
                throttled += status in THROTTLE_STATUS
                if self.retry.gives_up(status, attempt, throttled):
                    raise ModelError(
                        describe(exc, self.base_url, attempt),
                        status=status,
                        attempts=attempt,
                        retryable=status is None or status in RETRY_STATUS,
                    ) from exc
                if status in THROTTLE_STATUS:
                    wait, asked_for = self.retry.throttle_wait(exc, throttled)
                    await notify(on_throttle, Throttle(wait_s=wait, status=status, retry_after=asked_for,
                                                       attempt=attempt))
                else:
                    wait = self.retry.backoff(attempt, exc)
                await anyio.sleep(wait)
                continue
            except openai.OpenAIError as exc:
                raise ModelError(describe(exc, self.base_url, attempt), attempts=attempt) from exc
            return Completion(
                text=reply.text,
                tool_calls=reply.calls,
                usage=reply.usage,
                finish_reason=reply.finish,
                latency_ms=(time.monotonic() - started) * 1000.0,
                model=reply.model or name,
                attempts=attempt,
                id=reply.id,
                queued_ms=queued * 1000.0,
            )

    async def _attempt(self, params: dict[str, Any], stream: bool, on_text: TextCallback | None,
                       on_tool_call: ToolCallCallback | None) -> _Reply:
        """One request, bounded as a whole by `timeout` (`TooSlow`, retried like a cut stream)."""
        with anyio.move_on_after(self.timeout):
            if stream:
                return await self._stream(params, on_text, on_tool_call)
            return await self._once(params)
        raise TooSlow(self.timeout)

    def _request(self, params: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The body `chat.completions.create` would send for `params`, and the request options kept out
        of it: `extra_body` merged into the top level (it wins), `extra_headers` / `extra_query` /
        `timeout` as options, keys in the SDK's order. msgspec writes the same compact UTF-8 JSON as the
        SDK's json.dumps(ensure_ascii=False, separators=(",", ":")), several times faster, and without
        `create`'s recursive TypedDict transform of the params (~8 ms of CPU per request here: it walks
        every message) for a body that is already plain JSON. `tests/model/test_model_client.py` compares the
        bytes."""
        rest = dict(params)
        options: dict[str, Any] = {}
        for key, option in _REQUEST_OPTIONS.items():
            value = rest.pop(key, None)
            if value is not None:
                options[option] = value
        extra = rest.pop("extra_body", None) or {}
        body = {key: rest.pop(key) for key in _BODY_ORDER if key in rest}
        body.update(rest)
        body.update(extra)
        return msgspec.json.encode(body), options

    async def _post(self, params: dict[str, Any], *, stream: bool, raw_chunks: bool = False) -> Any:
        """POST /chat/completions through the SDK (`SA_MODEL_HTTP=httpx`): its transport, auth,
        timeouts, errors and SSE, with the body of `_request` sent as it is. With `raw_chunks` a stream
        yields each SSE chunk as the decoded JSON dict, not a `ChatCompletionChunk` model (building the
        models cost ~250 us of CPU per chunk here, more than everything else a streamed token costs)."""
        body, options = self._request(params)
        options["security"] = {"bearer_auth": True}
        # `options` is built key by key, so it is a dict and not openai's `RequestOptions` TypedDict
        return await self._client.post(
            "/chat/completions", content=body, cast_to=ChatCompletion,
            options=options,  # type: ignore[call-overload]
            stream=stream, stream_cls=RawChunks if raw_chunks else AsyncStream[ChatCompletionChunk],
        )

    async def _once(self, params: dict[str, Any]) -> _Reply:
        if self._wire is not None:
            body, options = self._request(params)
            reply = await self._wire.complete(body, **options)
            return _from_wire(reply)
        response = await self._post(params, stream=False)
        if not response.choices:
            raise ModelError("the server returned no choices", attempts=1)
        choice = response.choices[0]
        message = choice.message
        calls = [c.model_dump(exclude_none=True) for c in message.tool_calls] if message.tool_calls else None
        usage = _usage(response.usage)
        finish = choice.finish_reason or "stop"
        return _Reply(message.content or "", calls, usage, finish, response.model or "", response.id or "")

    async def _stream(
        self, params: dict[str, Any], on_text: TextCallback | None,
        on_tool_call: ToolCallCallback | None = None,
    ) -> _Reply:
        params = {**params, "stream": True, "stream_options": {"include_usage": True}}
        end = StreamEnd()
        if self._wire is not None:
            body, options = self._request(params)
            stream: Any = aclosing(self._wire.stream(body, end, **options))  # released on any exit
        else:
            stream = await self._post(params, stream=True, raw_chunks=True)
            end = stream.end
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage, finish, served, reply_id, count = Usage(), "", "", "", 0
        try:
            async with stream as chunks:
                async for chunk in chunks:  # plain dicts in the OpenAI chunk shape (see `_post`)
                    count += 1
                    served = chunk.get("model") or served
                    reply_id = chunk.get("id") or reply_id
                    if chunk.get("usage"):
                        usage = _usage_of(chunk["usage"])
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        content = delta.get("content")
                        if content:
                            parts.append(content)
                            if on_text is not None:
                                result = on_text(content)
                                if result is not None:
                                    await result
                        for tc in delta.get("tool_calls") or ():
                            index = tc.get("index", 0)
                            slot = calls.setdefault(index, {
                                "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                            fn = tc.get("function") or {}
                            name, arguments = fn.get("name") or "", fn.get("arguments") or ""
                            if tc.get("id"):
                                slot["id"] = tc["id"]
                            slot["function"]["name"] += name
                            slot["function"]["arguments"] += arguments
                            if on_tool_call is not None:
                                result = on_tool_call(index, tc.get("id") or "", name, arguments)
                                if result is not None:
                                    await result
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
        except openai.APIConnectionError as exc:
            if isinstance(exc, openai.APITimeoutError) or end.content_type is None:
                raise  # a silent server, or one never reached: said as such
            raise StreamCut(f"the connection dropped after {count} chunk{'s' if count != 1 else ''}: "
                            f"{exc.__cause__ or exc}") from exc
        finish = end.finish(finish, count)  # StreamCut if the body ended before the reply did
        ordered = [calls[i] for i in sorted(calls)] or None
        return _Reply("".join(parts), ordered, usage, finish, served, reply_id)


def _from_wire(reply: ChatReply) -> _Reply:
    """`_once`'s fields from a reply decoded by `runtime.model.wire` (what the SDK path reads from its
    models: tool calls as dicts without their null fields)."""
    if not reply.choices:
        raise ModelError("the server returned no choices", attempts=1)
    choice = reply.choices[0]
    message = choice.message
    calls = [_without_nulls(c) for c in message.tool_calls] if message.tool_calls else None
    usage = _usage(reply.usage)
    return _Reply(message.content or "", calls, usage, choice.finish_reason or "stop", reply.model or "",
                  reply.id or "")


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _usage(usage: Any) -> Usage:
    """Token counts from a reply's usage object (the SDK's model or `runtime.model.wire`'s), if any."""
    if usage is None:
        return Usage()
    return Usage(prompt_tokens=usage.prompt_tokens or 0, completion_tokens=usage.completion_tokens or 0)


def _usage_of(usage: dict[str, Any]) -> Usage:
    return Usage(prompt_tokens=usage.get("prompt_tokens") or 0,
                 completion_tokens=usage.get("completion_tokens") or 0)


def _refuse_guided(extras: dict[str, Any]) -> None:
    """vLLM >= 0.12 ignores `guided_*` fields and decodes unconstrained with HTTP 200: refuse them here."""
    body = extras.get("extra_body") or {}
    stale = sorted(k for k in [*extras, *body] if k.startswith("guided_"))
    if stale:
        raise ValueError(
            f"removed vLLM fields {stale}: vLLM ignores them and decodes unconstrained; "
            'use extra_body={"structured_outputs": {...}} (see runtime.model.constraints)'
        )
