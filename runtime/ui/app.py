"""The inspector's web app (`sa ui`): its parts put together, and the connection they share.

    app = create_app(nats_url, bind="127.0.0.1")        # or create_app(client=Client(nc)) to share one
    uvicorn.run(app, host="127.0.0.1", port=8377)

The parts, each in its own module: `guard` (which Host names it answers to, which origins may send
commands, the Content-Security-Policy of every answer), `routes` (HTTP in, JSON out), `reads` (what the
pages show, through `runtime.client`), `actions` (fork, cancel, approve, deny, through `RunHandle`) and
`follow` (live views over server-sent events). All of them reach the fleet through one `Client`: the
app's own, opened at startup and closed at shutdown, or the one it is given.

Safety, in layers: the app binds to loopback by default (`sa ui --host` says otherwise); `guard` refuses
a Host it was not bound to (a DNS-rebinding page) and a command from another origin; commands are JSON
only; the pages build the DOM with `textContent`, never HTML strings of data, behind a CSP that runs only
the app's own scripts; and the NATS user the app connects as bounds what any command can do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from starlette.applications import Starlette
from starlette.middleware import Middleware

from runtime.client import Client
from runtime.ui.actions import FORK_WAIT_S, Actions
from runtime.ui.follow import Following
from runtime.ui.guard import Guard, allowed_hosts
from runtime.ui.reads import Reads
from runtime.ui.routes import ROUTES, Services

# tests/log/test_conversations.py and older callers name the reads `Inspector` (`Inspector(js).run(run_id)`)
Inspector = Reads


def create_app(nats_url: str | None = None, *, client: Client | None = None, fork_wait: float = FORK_WAIT_S,
               bind: str = "127.0.0.1", allow_hosts: Iterable[str] = ()) -> Starlette:
    """The inspector app, on its own connection to `nats_url` (opened at startup) or on `client`.

    `bind` is the address it listens on and `allow_hosts` the other names it may be reached by (a proxy,
    a DNS name): a request naming any other Host is refused (`runtime.ui.guard`). A fork not written
    within `fork_wait` seconds is reported as refused. ValueError for a name that is not a host name, or
    for neither or both of `nats_url` and `client`."""
    if (nats_url is None) == (client is None):
        raise ValueError("create_app needs a NATS url or a client (one of them)")
    allowed = allowed_hosts(bind, allow_hosts)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # a server runs for days: reconnect forever, unlike a command's client
        own = client or await Client.connect(nats_url, name="sa-ui", max_reconnect_attempts=-1)
        app.state.services = Services(Reads(own), Actions(own, fork_wait=fork_wait), Following(own))
        try:
            yield
        finally:
            if own is not client:
                await own.close()

    return Starlette(routes=ROUTES, lifespan=lifespan, middleware=[Middleware(Guard, allowed=allowed)])


__all__ = ["Inspector", "create_app"]
