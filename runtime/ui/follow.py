"""Live following: a run's page receives its events as they are appended, as server-sent events.

    GET /api/runs/{run}/follow?after=N   ->   event: token | script | event | end

Each open page holds one `RunHandle.watch()` (one ordered consumer on the run's events and two core
subscriptions: the model's token stream, the run's script notices) and nothing else. `event` carries the
event's view with the run's totals and flags so far (`views.summary_view`, `views.flags`), `token` a piece
of the model's output as it is generated (never stored: the recorded reply replaces it), `script` a tool
job still running a moment after it began (`runtime.streaming.ScriptRunning`: its call, tool, worker and
start; the page shows it until the call's outcome arrives as an `event`), `end` the totals once the run
ended. Events before seq `after` (what the page already has) are read but not sent; a call's outcome that
carries its script run is sent as its rows (`views.entry_views`), each with the outcome's seq as its `id`.

Why a response class of its own: Starlette's StreamingResponse, under ASGI 2.4 servers, notices a gone
client only when a write fails, so a page closed on a quiet run would keep its consumer until the next
event, possibly hours. `FollowResponse` listens for `http.disconnect` alongside and releases the consumer
at once, and keeps idle proxies from cutting the stream with comment lines.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from runtime import events as ev
from runtime.client import Client
from runtime.streaming import Delta, ScriptRunning
from runtime.ui import views

KEEPALIVE_S = 15.0


def sse(kind: str, data: Any, seq: int | None = None) -> str:
    """One server-sent event (`id` is the event's seq, so a reconnecting browser says where it was)."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Following:
    """The live views of one inspector: how to feed one, and how many are open (`/api/health`)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.open = 0

    async def pump(self, run_id: str, after: int, emit: Callable[[str], Awaitable[None]]) -> None:
        """Send the run's events from seq `after` on, and its tokens, until it ends (then `end`)."""
        self.open += 1
        watch = self.client.get(run_id).watch()
        seen: list[ev.Event] = []
        try:
            async for item in watch:
                if isinstance(item, Delta):
                    await emit(sse("token", msgspec.to_builtins(item)))
                    continue
                if isinstance(item, ScriptRunning):
                    await emit(sse("script", msgspec.to_builtins(item)))
                    continue
                seen.append(item)
                if item.seq < after:
                    continue
                for view in views.entry_views(item, views.start_of(seen)):  # a script run: its rows first
                    await emit(sse("event", {"event": view, "summary": views.summary_view(seen),
                                             "flags": views.flag_views(views.flags(seen))}, item.seq))
            await emit(sse("end", {"summary": views.summary_view(seen),
                                   "flags": views.flag_views(views.flags(seen))}))
        finally:
            self.open -= 1
            with anyio.CancelScope(shield=True):  # release the consumer even when the page went away
                await watch.aclose()


class FollowResponse(Response):
    """A server-sent event stream that ends when the run ends or the client goes away, whichever is first
    (see the module docstring)."""

    media_type = "text/event-stream"

    def __init__(self, following: Following, run_id: str, after: int) -> None:
        # no body, so no Content-Length (Response.__init__ would set it to 0), as StreamingResponse does
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.following, self.run_id, self.after = following, run_id, after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        lock = anyio.Lock()

        async def emit(text: str) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})

        async with anyio.create_task_group() as tg:
            async def pump() -> None:
                with contextlib.suppress(OSError):
                    await self.following.pump(self.run_id, self.after, emit)
                tg.cancel_scope.cancel()

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            async def beat() -> None:
                while True:
                    await anyio.sleep(KEEPALIVE_S)
                    with contextlib.suppress(OSError):
                        await emit(": keepalive\n\n")

            tg.start_soon(pump)
            tg.start_soon(watch)
            tg.start_soon(beat)
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


__all__ = ["KEEPALIVE_S", "FollowResponse", "Following", "sse"]
