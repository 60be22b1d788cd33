"""How `sa mcp serve` is reached: stdio (a client starts it as a child process), or streamable HTTP on
loopback with a bearer token.

    await serve_stdio(server)                                           # until stdin closes
    await serve_http(server, sock, token)                               # until cancelled

Why a token on HTTP and none on stdio: a stdio server talks only to the process that started it, while a port
on loopback is reachable by every process of every user of the machine, and a call starts runs that spend
model tokens. The token is compared in constant time (`hmac.compare_digest`), and a request without it is
refused with 401 before the MCP layer reads it. The SDK's own DNS-rebinding guard stays on for loopback, so a
web page cannot reach the port through a name it resolves to 127.0.0.1.
"""

from __future__ import annotations

import hmac
import json
import socket
from typing import Any

from mcp.server.lowlevel import Server
from starlette.types import ASGIApp, Receive, Scope, Send

MCP_PATH = "/mcp"


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one client over this process's stdin and stdout until it closes stdin (the SDK points fd 1 at
    stderr meanwhile, so a stray print cannot corrupt the wire)."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


class BearerToken:
    """ASGI middleware: a request passes only with ``Authorization: Bearer <token>``; any other gets 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let every request in")
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan messages
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "unauthorized", "error_description": "send the token of `sa mcp serve "
                                    "--http` as `Authorization: Bearer <token>`"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def http_app(server: Server[Any], token: str, *, host: str = "127.0.0.1") -> ASGIApp:
    """The server's streamable-HTTP app at `MCP_PATH`, behind the bearer token."""
    return BearerToken(server.streamable_http_app(streamable_http_path=MCP_PATH, host=host), token)


async def serve_http(server: Server[Any], sock: socket.socket, token: str) -> None:
    """Serve streamable HTTP on the bound socket `sock` until cancelled."""
    import uvicorn

    host = sock.getsockname()[0]
    config = uvicorn.Config(http_app(server, token, host=host), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


__all__ = ["MCP_PATH", "BearerToken", "http_app", "serve_http", "serve_stdio"]
