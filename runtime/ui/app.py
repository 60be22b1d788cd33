"""The inspector's web app (`sa ui`): its parts put together, and the connection they share.

    app = create_app(nats_url)                # or create_app(client=Client(nc)) to share one
    uvicorn.run(app, host="127.0.0.1", port=8377)

The parts, each in its own module: `guard` (the Content-Security-Policy of every answer), `routes`
(HTTP in, JSON out), `reads` (what the pages show, through `runtime.client`), `actions` (fork, cancel,
approve, deny, through `RunHandle`) and `follow` (live views over server-sent events). All of them reach
the fleet through one `Client`: the app's own, opened at startup and closed at shutdown, or the one it
is given.

Safety, in layers: the app binds to loopback by default (`sa ui --host` says otherwise); commands are JSON
only; the pages build the DOM with `textContent`, never HTML strings of data, behind a CSP that runs only
the app's own scripts; and the NATS user the app connects as bounds what any command can do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware

from runtime.client import Client
from runtime.ui.actions import FORK_WAIT_S, Actions
from runtime.ui.follow import Following
from runtime.ui.guard import Guard
from runtime.ui.reads import Reads
from runtime.ui.routes import ROUTES, Services

# tests/test_conversations.py and older callers name the reads `Inspector` (`Inspector(js).run(run_id)`)
Inspector = Reads


def create_app(nats_url: str | None = None, *, client: Client | None = None,
               fork_wait: float = FORK_WAIT_S) -> Starlette:
    """The inspector app, on its own connection to `nats_url` (opened at startup) or on `client`. A fork
    not written within `fork_wait` seconds is reported as refused. ValueError for neither or both of
    `nats_url` and `client`."""
    if (nats_url is None) == (client is None):
        raise ValueError("create_app needs a NATS url or a client (one of them)")

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

    return Starlette(routes=ROUTES, lifespan=lifespan, middleware=[Middleware(Guard)])


__all__ = ["Inspector", "create_app"]
