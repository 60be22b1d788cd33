"""The inspector's door: which names it answers to (Host), whose commands it takes (Origin), and what
every answer tells the browser (Content-Security-Policy and friends).

Why Host: the inspector has no login, and binding to loopback keeps other machines out, but not other web
pages in the user's own browser. A page at `http://attacker.example:8377/` whose DNS name is rebound to
127.0.0.1 after it loaded is, to the browser, same-origin with itself while its requests reach the
inspector: without this check it could read every run and cancel or approve them. Such requests still say
`Host: attacker.example:8377`, so the app answers only to the names it was bound to
(`allowed_hosts`: the bind address, plus `localhost`, `127.0.0.1` and `[::1]` when it listens on
loopback) and to names given on purpose (`sa ui --allow-host NAME`, for a proxy or a DNS name); anything
else gets 400 saying which names it answers to and how to add one.

Why Origin: a command (any method but GET, HEAD and OPTIONS) from a page of another origin is refused with
403 before it is read, whatever its content type. The inspector's own origin is the one its Host header
names (already checked above); the Origin header is compared with it by host and port (a TLS proxy in
front changes the scheme, not the server). When a request has no Origin, its Referer's origin is used; a
request with neither comes from a program (curl, a script), not from a page: browsers send Origin with
every cross-origin POST, and the pages' own Referrer-Policy (`no-referrer`) is why Referer is only a
fallback. This is behind the pages' other defence (commands are JSON only, which a form cannot send and
a cross-origin script cannot send without a CORS preflight the app never answers), not instead of it.

One plain ASGI middleware, not Starlette's BaseHTTPMiddleware (which buffers a streamed body and hides
the client's disconnect from live views), and not TrustedHostMiddleware (it checks Host only, answers
"Invalid host header" without saying what to do, and its port split mangles `[::1]:8377`).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = ((b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"))
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_name(text: str) -> str:
    """A host name as compared here: lower-case, no port, an IPv6 address without its brackets
    (`[::1]:8377` -> `::1`, a bare `::1` as a bind address is written too); ValueError for text that
    is not a host name."""
    text = text.strip()
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"
    problem = ValueError(f"{text!r} is not a host name (give a name or an address, like inspector.example)")
    try:
        parts = urlsplit("//" + text)
        name, _ = parts.hostname, parts.port  # `port` raises ValueError for one that is not a number
    except ValueError:
        raise problem from None
    if not name or parts.username is not None or parts.path or parts.query or parts.fragment or \
            any(c.isspace() for c in name):
        raise problem
    return name


def shown(name: str) -> str:
    """A host name as a browser's address bar has it (`::1` -> `[::1]`)."""
    return f"[{name}]" if ":" in name else name


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names the app answers to when it listens on `bind`: that address; the loopback names when it
    listens on loopback or on every address (it answers on loopback then too); and `extra`."""
    names = {host_name(bind)}
    try:
        address = ipaddress.ip_address(host_name(bind))
        local = address.is_loopback or address.is_unspecified
    except ValueError:
        local = host_name(bind) == "localhost"
    if local:
        names.update(LOOPBACK_NAMES)
    names.update(host_name(name) for name in extra)
    return frozenset(names)


def _netloc(text: str) -> tuple[str, int | None] | None:
    """(host, port) of an origin or URL, the scheme's default port left out; None if it has none."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname, (None if port == _DEFAULT_PORTS.get(parts.scheme) else port)


def host_refusal(headers: Headers, allowed: frozenset[str]) -> str | None:
    """Why a request's Host is refused, or None if the app answers to it."""
    given = headers.get("host", "")
    try:
        name = host_name(given)
    except ValueError:
        name = ""
    if name in allowed:
        return None
    names = ", ".join(shown(n) for n in sorted(allowed))
    return (f"this inspector answers only to {names}, not to the Host {given!r}: open it by one of those "
            f"names, or if {shown(name) if name else 'that name'} is yours (a proxy, a DNS name), start it "
            f"with `sa ui --allow-host {shown(name) if name else 'NAME'}`")


def origin_refusal(method: str, headers: Headers) -> str | None:
    """Why a command is refused for coming from another origin, or None (see the module docstring)."""
    if method in SAFE_METHODS:
        return None
    claimed = headers.get("origin") or headers.get("referer")
    if claimed is None:
        return None  # a program, not a page
    own = _netloc("//" + headers.get("host", ""))
    if own is not None and _netloc(claimed) == own:
        return None
    which = "Origin" if headers.get("origin") else "Referer"
    return (f"a {method} from another origin is refused ({which}: {claimed!r}; this inspector is at "
            f"{headers.get('host', '?')!r}): commands are taken only from the inspector's own pages")


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """The ASGI middleware doing all of the above: refuses an unknown Host (400) and a cross-origin
    command (403), and adds `SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refused = host_refusal(headers, self.allowed)
        if refused is not None:
            await _refuse(send, 400, refused)
            return
        refused = origin_refusal(scope["method"], headers)
        if refused is not None:
            await _refuse(send, 403, refused)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = ["CSP", "SECURITY_HEADERS", "Guard", "allowed_hosts", "host_name", "host_refusal", "origin_refusal",
           "shown"]
