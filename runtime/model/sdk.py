"""The openai SDK as the model client's fallback transport (`SA_MODEL_HTTP=httpx`), and its HTTP client.

Why apart from `runtime.model.client`: the default path posts completions over aiohttp
(`runtime.model.wire`); the SDK's own httpx transport stays as a documented fallback for a server or proxy
that needs something only the SDK does, and it needs a few adaptations of the SDK's internals (its stream of
raw chunks, which must say how a body ended). Those live here, beside the choice of transport.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
from openai import AsyncStream
from openai._streaming import ServerSentEvent

from runtime.model.reply import BrokenStream, NotACompletion, StreamEnd, completion_chunk, is_json

HTTP_MODES = ("direct", "httpx")


class RawChunks(AsyncStream[object]):
    """The SDK's stream of raw chunks (`ModelClient._post`), which also records how the body ended (`end`), as
    `ChatWire.stream` does on the direct path: `data: [DONE]` seen, or a JSON body read whole. The SDK's SSE
    decoder finds no event in a JSON body (a server that ignored `"stream": true`) and would yield nothing:
    such a body is read here as the one chunk that carries the whole completion.

    The SDK stops at `[DONE]` without saying so, and a body that just ends looks the same to its caller;
    `_iter_events` (private, like the other SDK internals this client leans on) is where the events pass by.
    If a new SDK renamed it, `[DONE]` would go unseen and a reply without a finish_reason would read as cut:
    tests/model/test_model_replies.py checks that case in every mode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.end = StreamEnd(content_type=self.response.headers.get("content-type", ""))

    async def __stream__(self) -> AsyncIterator[object]:
        if not is_json(self.end.content_type or ""):
            try:
                async for chunk in super().__stream__():
                    yield chunk
            except json.JSONDecodeError as exc:  # as `ChatWire.stream` says it on the direct path
                raise BrokenStream(f"an event's data is not JSON ({exc})") from exc
            return
        try:
            whole = await self.response.aread()
        except httpx2.TimeoutException as exc:  # mapped as the SDK maps them while reading a stream
            raise openai.APITimeoutError(request=self.response.request) from exc
        except httpx2.RequestError as exc:
            raise openai.APIConnectionError(message=f"{type(exc).__name__}: {exc}",
                                            request=self.response.request) from exc
        finally:
            await self.response.aclose()
        try:
            chunk = completion_chunk(whole)
        except NotACompletion as exc:
            raise openai.APIResponseValidationError(
                response=self.response, body=whole.decode(errors="replace"), message=str(exc)) from exc
        self.end.done = True
        yield chunk

    async def _iter_events(self) -> AsyncIterator[ServerSentEvent]:
        async for event in super()._iter_events():
            if event.data.startswith("[DONE]"):
                self.end.done = True
            yield event


def http_mode() -> str:
    """How completions travel, from `SA_MODEL_HTTP` (see the module docstring)."""
    mode = os.environ.get("SA_MODEL_HTTP", "direct")
    if mode not in HTTP_MODES:
        why = "was removed (it was the openai SDK over aiohttp's pool)" if mode == "aiohttp" else "is unknown"
        raise ValueError(f"SA_MODEL_HTTP={mode!r} {why}: use 'direct' (the default) or 'httpx' (the SDK)")
    return mode


def http_client(timeout: float, max_connections: int = 1000) -> httpx2.AsyncClient:
    """The openai SDK's own HTTP client (httpx2 over httpcore2), bounded to `max_connections`: what the SDK
    sends everything but `direct` mode's completions with (`bench/runtime.py` measures the difference)."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=100)
    return openai.DefaultAsyncHttpxClient(timeout=timeout, limits=limits)


__all__ = ["HTTP_MODES", "RawChunks", "http_client", "http_mode"]
