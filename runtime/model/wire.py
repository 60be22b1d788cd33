"""POST /chat/completions straight over aiohttp, with the openai SDK's headers and the SDK's own errors.

Why not through the SDK: a host with 100 model calls in flight spent about a quarter of its CPU in the
SDK's request path (building an httpx request and URL per call, its option handling, parsing the reply
into pydantic models we then read five fields of), more than the run log costs. This module sends the
very body `ModelClient` builds (msgspec-encoded; the same bytes the SDK's `create` sends, which a test
compares) with the headers the SDK itself computed once, and decodes the reply with msgspec into the few
fields the runtime reads. What a caller can see of failures is unchanged, because they are the SDK's:
an HTTP error status becomes the exception the SDK makes from that response
(`AsyncOpenAI._make_status_error_from_response`: `BadRequestError`, `RateLimitError`, ... with the
response and its `Retry-After`), a timeout `openai.APITimeoutError`, anything else on the connection
`openai.APIConnectionError`, an SSE `error` event `openai.APIError`, and a 2xx body that is not a chat
completion `openai.APIResponseValidationError`.

`SA_MODEL_HTTP=httpx` (the openai SDK alone, with its own httpx transport: the fallback) bypasses this
module; `bench/runtime.py` compares the ways in one run.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx2
import msgspec
import openai
from openai._models import FinalRequestOptions

from runtime.model.reply import BrokenStream, NotACompletion, StreamEnd, completion_chunk, is_json

# headers of the SDK's request that describe one attempt, or that aiohttp sets itself
_PER_REQUEST = frozenset({"content-length", "host", "connection", "accept-encoding",
                          "x-stainless-retry-count",
                          "x-stainless-read-timeout"})


class FunctionCall(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # kept as sent: the runtime records them as dicts


class Choice(msgspec.Struct):
    message: Message
    finish_reason: str | None = None


class UsageBody(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ChatReply(msgspec.Struct):
    """The fields of an OpenAI chat completion the runtime reads; every other field is skipped unread."""

    choices: list[Choice] = []
    usage: UsageBody | None = None
    model: str | None = None
    id: str | None = None


_reply = msgspec.json.Decoder(ChatReply)
_any = msgspec.json.Decoder()


class Pool:
    """One aiohttp session with a bounded connection pool, made on first use (it belongs to the running
    event loop; a new one if a later request comes from another loop), and the proxy of each scheme and
    host read once from the environment.

    Why aiohttp's pool rather than httpx2/httpcore2's (the SDK's): on every request, acquiring and releasing
    a pooled connection there probes each idle keep-alive connection (`has_expired()`, one `getpeername`
    system call each), so a host with 100 model calls in flight pays O(idle connections) per request: about
    a fifth of its CPU went there. aiohttp's connector hands out the most recently released connection to
    the host in O(1) and expires idle ones on a timer."""

    def __init__(self, *, max_connections: int = 1000, keepalive_expiry: float = 30.0) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxies = urllib.request.getproxies()  # HTTP(S)_PROXY / NO_PROXY, as httpx honours them
        self._proxy: dict[tuple[str, str], str | None] = {}

    def proxy_for(self, scheme: str, host: str) -> str | None:
        """The proxy for this scheme and host from the environment read at start (None: connect directly)."""
        if not self._proxies:
            return None
        key = (scheme, host)
        if key not in self._proxy:
            proxy = self._proxies.get(scheme) or self._proxies.get("all")
            bypass = proxy is not None and urllib.request.proxy_bypass(host)
            self._proxy[key] = None if bypass else proxy
        return self._proxy[key]

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                             keepalive_timeout=self.keepalive_expiry)
            # no decompression (`ChatWire` asks for none: `Accept-Encoding: identity`), no cookies
            # (nothing here sends any), and no `trust_env`: with it aiohttp reads ~/.netrc and the
            # proxy variables in a thread on every request; the proxies are read once instead (`proxy_for`)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


class ChatWire:
    """Chat completions for one `AsyncOpenAI` client's base URL and credentials, over a `Pool` of its own."""

    def __init__(self, sdk: openai.AsyncOpenAI, *, timeout: float, max_connections: int = 1000) -> None:
        self._sdk = sdk
        self._pool = pool = Pool(max_connections=max_connections)
        self._timeout = timeout
        probe = sdk._build_request(FinalRequestOptions.construct(  # the SDK's own headers, auth included
            method="post", url="/chat/completions", json_data={}, security={"bearer_auth": True}))
        self.url = str(probe.url)
        url = httpx2.URL(self.url)
        self._proxy = pool.proxy_for(url.scheme, url.host)
        self._headers = {k: v for k, v in probe.headers.items() if k.lower() not in _PER_REQUEST}
        self._headers["Accept-Encoding"] = "identity"  # the pool does not decompress

    def _request_parts(self, headers: Mapping[str, str] | None, timeout: float | None
                       ) -> tuple[dict[str, str], aiohttp.ClientTimeout]:
        merged = {**self._headers, **headers} if headers else self._headers
        seconds = self._timeout if timeout is None else timeout
        return merged, aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)

    async def complete(self, body: bytes, *, headers: Mapping[str, str] | None = None,
                       params: Mapping[str, str] | None = None, timeout: float | None = None) -> ChatReply:
        """One non-streamed completion."""
        merged, limits = self._request_parts(headers, timeout)
        try:
            async with self._pool.session().post(self.url, data=body, headers=merged, params=params,
                                                 timeout=limits, proxy=self._proxy) as response:
                data = await response.read()
                if response.status >= 400:
                    raise self._status_error(response, data)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._connection_error(exc) from exc
        try:
            return _reply.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise openai.APIResponseValidationError(
                response=self._response(response, data), body=data.decode(errors="replace"),
                message=f"the server's reply is not a chat completion: {exc}") from exc

    async def stream(self, body: bytes, end: StreamEnd, *, headers: Mapping[str, str] | None = None,
                     params: Mapping[str, str] | None = None, timeout: float | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: each server-sent chunk as the decoded JSON dict, until `[DONE]` or the end
        of the body; `end` records which (`runtime.model.reply` says why the caller needs to know). A server
        that ignored `"stream": true` and sent one JSON completion yields it as one chunk holding all of it.
        """
        merged, limits = self._request_parts(headers, timeout)
        try:
            async with self._pool.session().post(self.url, data=body, headers=merged, params=params,
                                                 timeout=limits, proxy=self._proxy) as response:
                if response.status >= 400:
                    raise self._status_error(response, await response.read())
                end.content_type = response.headers.get("Content-Type", "")
                if is_json(end.content_type):
                    whole = await response.read()
                    try:
                        chunk = completion_chunk(whole)
                    except NotACompletion as exc:
                        raise openai.APIResponseValidationError(
                            response=self._response(response, whole), body=whole.decode(errors="replace"),
                            message=str(exc)) from exc
                    end.done = True
                    yield chunk
                    return
                event, data = "", []
                async for raw in response.content:  # one line at a time, as it arrives
                    line = raw.rstrip(b"\r\n")
                    if line:
                        field, _, value = line.partition(b":")
                        value = value[1:] if value.startswith(b" ") else value
                        if field == b"data":
                            data.append(value)
                        elif field == b"event":
                            event = value.decode()
                        continue
                    if not data:  # a blank line ends an event; a comment-only event carries nothing
                        event = ""
                        continue
                    payload = b"\n".join(data)
                    event, data, kind = "", [], event
                    if payload.startswith(b"[DONE]"):
                        end.done = True
                        return
                    try:
                        chunk = _any.decode(payload)
                    except msgspec.DecodeError as exc:
                        raise BrokenStream(f"an event's data is not JSON ({exc}): {payload[:160]!r}") from exc
                    if isinstance(chunk, dict) and chunk.get("error"):
                        raise self._stream_error(chunk["error"], kind)
                    yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._connection_error(exc) from exc

    async def aclose(self) -> None:
        await self._pool.aclose()

    # -- the SDK's errors ------------------------------------------------------------------------------

    def _request(self) -> httpx2.Request:
        return httpx2.Request("POST", self.url)

    def _response(self, response: aiohttp.ClientResponse, data: bytes) -> httpx2.Response:
        return httpx2.Response(status_code=response.status, headers=response.raw_headers, content=data,
                               request=self._request())

    def _status_error(self, response: aiohttp.ClientResponse, data: bytes) -> openai.APIStatusError:
        return self._sdk._make_status_error_from_response(self._response(response, data))

    def _connection_error(self, exc: BaseException) -> openai.APIConnectionError:
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            return openai.APITimeoutError(request=self._request())
        return openai.APIConnectionError(message=f"{type(exc).__name__}: {exc}", request=self._request())

    def _stream_error(self, error: Any, event: str) -> openai.APIError:
        message = error.get("message") if isinstance(error, dict) else None
        return openai.APIError(message=message or f"an error occurred during streaming ({event or 'data'})",
                               request=self._request(), body=error)


__all__ = ["ChatReply", "ChatWire", "Pool"]
