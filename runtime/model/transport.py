"""The HTTP transport under the openai SDK: aiohttp's connection pool behind httpx2's transport interface.

Why not the SDK's default (httpx2 over httpcore2): on every request, acquiring and releasing a pooled
connection probes each idle keep-alive connection (`has_expired()`, one `getpeername` system call each), so a
host with 100 model calls in flight pays O(idle connections) per request: about a fifth of its CPU went there.
aiohttp's connector hands out the most recently released connection to the host in O(1) and expires idle
ones on a timer. The SDK keeps everything above the transport: request building, auth, response types, SSE
parsing, and its error types, because failures are raised here as the httpx2 exceptions httpcore2 would
raise (a refused connection is `ConnectError`, a silent server `ReadTimeout`, a dropped connection
`RemoteProtocolError`), which the SDK turns into `APIConnectionError` / `APITimeoutError` as before.

Why our own ~100 lines rather than the SDK's `DefaultAioHttpClient` (httpx-aiohttp, vendored): that adapter
maps every `aiohttp.ClientConnectionError`, a refused connection included, to `ConnectTimeout`, so an
unreachable server would read "timed out" instead of "cannot reach".
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2


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


class Pool:
    """One aiohttp session with a bounded connection pool, made on first use (it belongs to the running
    event loop; a new one if a later request comes from another loop), and the proxy of each scheme and
    host read once from the environment. Shared by the SDK's transport below and `runtime.model.wire`."""

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
            # no decompression (httpx2 decodes by Content-Encoding itself; the wire path asks for none), no
            # cookies (nothing here sends any), and no `trust_env`: with it aiohttp reads ~/.netrc and the
            # proxy variables in a thread on every request; the proxies are read once instead (`proxy_for`)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 for the SDK over one `Pool`."""

    def __init__(self, *, max_connections: int = 1000, keepalive_expiry: float = 30.0,
                 pool: Pool | None = None) -> None:
        self.pool = pool or Pool(max_connections=max_connections, keepalive_expiry=keepalive_expiry)

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
