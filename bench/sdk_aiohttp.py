"""The openai SDK over aiohttp's pool: the `SA_MODEL_HTTP=aiohttp` variant the runtime used to ship, kept here
as the middle point of `bench/runtime.py`'s comparison of how a model call travels.

    sys.path.append("bench")  # after the runtime package: bench/runtime.py would shadow it
    import sdk_aiohttp; sdk_aiohttp.install()   # then `sa host` in this process, e.g. runtime.cli.main()
    # with SA_MODEL_HTTP=httpx: the SDK's request path, over this transport instead of httpx2/httpcore2's

The three points: the plain SDK (`httpx`, its httpx2/httpcore2 pool, which probes every idle keep-alive
connection on each request), the SDK over aiohttp's pool (this module: the pool's cost removed, the SDK's
per-request machinery kept), and `direct` (the default, `runtime.model.wire`: neither). The transport is
httpx2's interface over `runtime.model.wire.Pool`; failures are raised as the httpx2 exceptions httpcore2
would raise (a refused connection is `ConnectError`, a silent server `ReadTimeout`, a dropped connection
`RemoteProtocolError`), which the SDK turns into `APIConnectionError` / `APITimeoutError` as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2

from runtime.model.wire import Pool


class _Body(httpx2.AsyncByteStream):
    """A response body read from aiohttp as it arrives (SSE events reach the SDK without buffering)."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc, self._request, connecting=False) from exc

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 for the SDK over one `Pool`."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            data: Any = request.content or None
        except httpx2.RequestNotRead:  # a streamed upload: aiohttp sets the framing itself
            data = request.stream
            request.headers.pop("transfer-encoding", None)
        limits = aiohttp.ClientTimeout(connect=timeout.get("pool"), sock_connect=timeout.get("connect"),
                                       sock_read=timeout.get("read"))
        proxy = self.pool.proxy_for(request.url.scheme, request.url.host)
        try:
            response = await self.pool.session().request(
                request.method, str(request.url), headers=list(request.headers.multi_items()), data=data,
                allow_redirects=False, compress=False, proxy=proxy,
                timeout=limits,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc, request, connecting=True) from exc
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx2.Response(status_code=response.status, headers=response.raw_headers,
                               stream=_Body(response, request), request=request, extensions=extensions)

    async def aclose(self) -> None:
        await self.pool.aclose()


def _mapped(exc: BaseException, request: httpx2.Request, *, connecting: bool) -> httpx2.TransportError:
    """The httpx2 exception httpcore2 raises for the same failure (the SDK's error mapping keys on these)."""
    message = str(exc) or type(exc).__name__
    kind: type[httpx2.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx2.ConnectTimeout
    elif isinstance(exc, aiohttp.SocketTimeoutError):
        kind = httpx2.ReadTimeout
    elif isinstance(exc, TimeoutError):  # aiohttp's `connect` bound: waiting for a pooled connection
        kind = httpx2.PoolTimeout if connecting else httpx2.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx2.ConnectError
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        kind = httpx2.RemoteProtocolError
    elif isinstance(exc, aiohttp.InvalidURL):
        kind = httpx2.UnsupportedProtocol
    else:
        kind = httpx2.ReadError if not connecting else httpx2.ConnectError
    return kind(message, request=request)


def install() -> None:
    """Every `ModelClient` of this process builds its SDK client over `AiohttpTransport` (the SDK sends
    the completions under `SA_MODEL_HTTP=httpx`)."""
    from runtime.model import client

    def http_client(timeout: float, max_connections: int = 1000) -> httpx2.AsyncClient:
        transport = AiohttpTransport(Pool(max_connections=max_connections))
        return httpx2.AsyncClient(timeout=timeout, follow_redirects=True, transport=transport)

    client.http_client = http_client
