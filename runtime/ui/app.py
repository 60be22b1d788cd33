"""The inspector's web app (`sa ui`): the runs index, a run's page, live following and fork, over HTTP.

    app = create_app(nats_url)           # or create_app(js=...) to reuse a connection (tests)
    uvicorn.run(app, host="127.0.0.1", port=8377)

Routes (pages are static files shipped in `runtime/ui/static`; everything they show comes from the API):

    GET  /                                  the runs index page
    GET  /runs/{run}                        a run's page
    GET  /api/runs?agent=&status=&tool=&error=&since=&until=&q=&limit=
                                            index rows, newest first, and the values each filter can take
    GET  /api/runs/{run}                    the run's view (`views.run_view`), events as stored
    GET  /api/runs/{run}/events/{seq}       one event with its big fields fetched from the object store
    GET  /api/runs/{run}/follow?after=N     server-sent events: each new event from seq N on, then `end`
    POST /api/runs/{run}/fork               {"at_seq": N, "edit": {...}?} -> {"run_id": new run}
    POST /api/runs/{run}/cancel             {"reason": "..."} -> {"event": the run's ending as recorded}
    POST /api/runs/{run}/approve            {"call_id": "1.0", "arguments": {...}?, "note": ""} -> the verdict
    POST /api/runs/{run}/deny               {"call_id": "1.0", "reason": "..."} -> the verdict
    GET  /api/runs/{run}/export             the run as one self-contained HTML file (`runtime.ui.export`)
    GET  /api/health                        {"ok": true, "followers": open live views}

Every read of a run goes through `runtime.log.RunLog` (read, resolve, follow); the `runs` KV bucket is only
the list of runs. Filters that look inside runs (tool, error kind, time, search) use a digest of each run's
events, cached per run and re-read only when the index says the run has grown, so an index of finished runs
is read once.

Live following uses one ordered consumer per open page (`RunLog.follow`). The response watches for the
client going away itself (rather than waiting for the next write to fail), so the consumer is released as
soon as the page closes, even on a run that is quiet for hours.

Commands (fork, cancel, approve, deny) go through the same functions as `sa fork` and `sa cancel` /
`sa approve` / `sa deny` (`runtime.client.fork`, `runtime.client.control`), so they are checked the same way,
and their errors come back as the same messages with status 400.

Safety: the app binds to loopback by default; a command must be a JSON POST, which a cross-site form cannot
send without a CORS preflight this app never answers; every page carries a Content-Security-Policy that
allows only the app's own scripts, as a second line behind the pages' escaping (they build the DOM with
`textContent`, never HTML strings of data).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
from nats.js import JetStreamContext
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from runtime import events as ev
from runtime import kernel, streaming
from runtime.client.control import Control, operator
from runtime.client.fork import fork, fork_points
from runtime.log import RunLog
from runtime.nats.connection import explain_refusal
from runtime.nats.jetstream import jetstream_for
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import check_token
from runtime.ui import views
from runtime.ui.export import NoSuchRun, export_run

log = logging.getLogger("runtime.ui")

STATIC = Path(__file__).parent / "static"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_SCAN = 5000  # runs whose digests one index request may read when a filter looks inside runs
READ_CONCURRENCY = 8
KEEPALIVE_S = 15.0
FORK_WAIT_S = 30.0
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class NotFound(LookupError):
    """No such run or event; the message says what to look at instead."""


class Refused(PermissionError):
    """NATS refused what the page asked for (this app's NATS user lacks the permission), or never
    answered; the message says which."""


class Inspector:
    """The app's state: the JetStream context, the digest cache and the count of open live views."""

    def __init__(self, js: JetStreamContext, *, fork_wait: float = FORK_WAIT_S) -> None:
        self.js = js
        self.fork_wait = fork_wait
        self.log = RunLog(js)
        self.digests: dict[str, views.Digest] = {}
        self.followers = 0
        self._reads = anyio.Semaphore(READ_CONCURRENCY)

    async def index(self) -> dict[str, RunIndex]:
        kv = await runs_kv(self.js)
        return {key: RunIndex.decode(e.value) for key, e in (await kv_entries(kv)).items() if e.value}

    async def _digest(self, run_id: str, entry: RunIndex) -> views.Digest:
        """The run's digest: cached once it ended (a host rewrites a run's index entry when it starts and
        when it ends, not at every event, so an unfinished run is read again each time)."""
        cached = self.digests.get(run_id)
        if cached is not None and cached.last_seq == entry.last_seq and entry.status in kernel.TERMINAL:
            return cached
        async with self._reads:
            history = await self.log.read(run_id, entry.actor or None, resolve=False)
        d = views.digest(run_id, history.events, entry.last_seq)
        self.digests[run_id] = d
        return d

    async def _digests(self, rows: list[tuple[str, RunIndex]]) -> dict[str, views.Digest]:
        out: dict[str, views.Digest] = {}

        async def one(run_id: str, entry: RunIndex) -> None:
            try:
                out[run_id] = await self._digest(run_id, entry)
            except Exception as e:  # a run whose log cannot be read is listed without its digest
                log.warning("run %s: cannot read its events for the index (%s)", run_id, e)

        async with anyio.create_task_group() as tg:
            for run_id, entry in rows:
                tg.start_soon(one, run_id, entry)
        return out

    async def runs(self, flt: views.RunFilter, limit: int) -> dict[str, Any]:
        """The index rows matching `flt`, newest first (at most `limit`), and the filters' values."""
        index = await self.index()
        for gone in [run_id for run_id in self.digests if run_id not in index]:  # purged since
            del self.digests[gone]
        ordered = sorted(index.items(), key=lambda kv: kv[1].updated, reverse=True)
        candidates = [(k, e) for k, e in ordered if flt.admits_entry(e)]
        scan = candidates[:MAX_SCAN] if flt.needs_events else candidates[:limit]
        digests = await self._digests(scan)
        rows = []
        for run_id, entry in scan:
            d = digests.get(run_id)
            if flt.needs_events and (d is None or not flt.admits(d)):
                continue
            rows.append(views.index_row(run_id, entry, d))
            if len(rows) >= limit:
                break
        return {"runs": rows, "total": len(index), "matched": len(rows),
                "scanned": len(scan), "truncated": flt.needs_events and len(candidates) > MAX_SCAN,
                "facets": views.facets(index.values(), self.digests.values())}

    async def run(self, run_id: str) -> dict[str, Any]:
        check_token(run_id, "run id")
        history = await self.log.read(run_id, resolve=False)
        if not history.events:
            raise NotFound(f"no events for run {run_id!r}: pick a run from the index")
        index = await self.index()
        view = views.run_view(run_id, history.actor, history.events, entry=index.get(run_id), index=index,
                              fork_points=fork_points(history.events))
        view["thread"] = await self._thread(history.actor, history.events[0], index)
        return view

    async def _thread(self, actor: str, first: ev.Event, index: dict[str, RunIndex]) -> dict[str, Any] | None:
        """The thread a run belongs to, as its runs in order (`runtime.log.threads`), or None."""
        if not isinstance(first, ev.RunStarted) or first.thread is None:
            return None
        from runtime.log.threads import Threads

        record, _ = await Threads(self.js).get(actor, first.thread)
        runs = record.runs if record is not None else [first.run_id]
        return {"thread": first.thread, "runs": [
            {"run_id": r, "status": index[r].status if r in index else None} for r in runs]}

    async def event(self, run_id: str, seq: int) -> dict[str, Any]:
        """One event whole: a stub's big fields are fetched from the object store (digest-checked)."""
        check_token(run_id, "run id")
        history = await self.log.read(run_id, resolve=False)
        match = [e for e in history.events if e.seq == seq]
        if not match:
            raise NotFound(f"run {run_id!r} has no event {seq} (it has {len(history.events)})")
        return views.event_view(await self.log.resolve(match[0]), views.start_of(history.events))

    async def export(self, run_id: str) -> str:
        try:
            return await export_run(self.js, run_id)
        except NoSuchRun as e:
            raise NotFound(str(e)) from None

    async def fork(self, run_id: str, at_seq: int, edit: ev.ForkEdit | None = None) -> dict[str, Any]:
        check_token(run_id, "run id")
        # ForkError (a ValueError) says what to change. A log write the server refuses (a user whose role
        # may not write events) is retried by the run log as if NATS were down: bound the wait here.
        with anyio.move_on_after(self.fork_wait) as waited:
            forked = await fork(self.js, run_id, at_seq, edit)
        if waited.cancelled_caught:
            raise Refused(f"the fork was not written within {self.fork_wait:g} s: the NATS user `sa ui` runs "
                          "as may not write events (forking needs the host or admin role), or NATS does "
                          "not answer; a fork left halfway is never driven")
        return {"run_id": forked.run_id, "source_run": forked.source_run, "at_seq": forked.at_seq}

    async def pump(self, run_id: str, after: int, emit: Callable[[str], Awaitable[None]]) -> None:
        """Send the run's events from `after` on as server-sent events until it ends (then `end`)."""
        self.followers += 1
        # the model's output as it is generated (core NATS, not stored): subscribed before the log is
        # read, so nothing published meanwhile is missed; the recorded reply stays the truth
        sub, deltas = await streaming.subscribe(self.js._nc, run_id)
        follow = self.log.follow(run_id)
        seen: list[ev.Event] = []

        async def tokens() -> None:
            async with deltas:
                async for d in deltas:
                    await emit(_sse("token", msgspec.to_builtins(d)))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(tokens)
                async for event in follow:
                    seen.append(event)
                    if event.seq < after:
                        continue
                    await emit(_sse("event", {"event": views.event_view(event, views.start_of(seen)),
                                              "summary": views.summary_view(seen)}, event.seq))
                await emit(_sse("end", {"summary": views.summary_view(seen)}))
                tg.cancel_scope.cancel()
        finally:
            self.followers -= 1
            with anyio.CancelScope(shield=True):
                await follow.aclose()  # type: ignore[attr-defined]  # an async generator
                await sub.unsubscribe()


def _sse(kind: str, data: Any, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class FollowResponse(Response):
    """A server-sent event stream that ends when the run ends or the client goes away, whichever is first.

    Starlette's StreamingResponse, under ASGI 2.4 servers, notices a gone client only when a write fails:
    a page closed on a quiet run would keep its consumer until the next event. This one listens for
    `http.disconnect` alongside, and keeps idle proxies from cutting the stream with comments."""

    media_type = "text/event-stream"

    def __init__(self, inspector: Inspector, run_id: str, after: int) -> None:
        # no body, so no Content-Length (Response.__init__ would set it to 0), as StreamingResponse does
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.inspector, self.run_id, self.after = inspector, run_id, after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        lock = anyio.Lock()

        async def emit(text: str) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})

        async with anyio.create_task_group() as tg:
            async def pump() -> None:
                with contextlib.suppress(OSError):
                    await self.inspector.pump(self.run_id, self.after, emit)
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


# The edits a page may ask for. Not `bundle`: it names a file on the server's disk to load, which is for the
# command line (`sa fork --bundle PATH`), not for anyone who can reach the page.
WEB_EDITS: dict[str, type[ev.OutputEdit | ev.ReplyEdit | ev.SystemEdit]] = {
    "output": ev.OutputEdit, "reply": ev.ReplyEdit, "system": ev.SystemEdit}


def web_edit(raw: Any) -> ev.ForkEdit | None:
    """The fork edit of a page's request (None for none); ValueError saying what is wrong with it."""
    if raw is None:
        return None
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind not in WEB_EDITS:
        raise ValueError(f'"edit" must be an object whose "kind" is one of {", ".join(WEB_EDITS)}, not '
                         f"{json.dumps(kind if isinstance(raw, dict) else raw)}")
    try:
        return msgspec.convert(raw, WEB_EDITS[kind])
    except msgspec.ValidationError as e:
        raise ValueError(f"the {kind} edit is not valid: {e}") from None


def web_operator() -> str:
    """The `by` of a command sent from a page: the inspector has no login, so it names itself and the
    account it runs as, never a person it cannot know."""
    return f"sa ui ({operator()})"


class BadBody(ValueError):
    """A request body the app cannot take; `status` is 415 (not JSON) or 400."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _json_body(request: Request, shape: str) -> dict[str, Any]:
    """The request's JSON object. Only JSON is taken: a cross-site form cannot send it without a CORS
    preflight, which this app never answers, so a page elsewhere cannot fork, cancel or approve."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise BadBody(415, f"send JSON: {shape} with Content-Type application/json")
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise BadBody(400, f"the body is not JSON: send {shape}") from None
    if not isinstance(body, dict):
        raise BadBody(400, f"the body must be a JSON object: {shape}")
    return body


def _text(body: dict[str, Any], name: str, *, required: bool = False) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or (required and not value):
        kind = "a non-empty string" if required else "a string"
        raise BadBody(400, f'"{name}" must be {kind}, not {json.dumps(value)}')
    return value


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _int(text: str | None, what: str, default: int) -> int:
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what}={text!r}: give a whole number") from None


def create_app(nats_url: str | None = None, *, js: JetStreamContext | None = None,
               fork_wait: float = FORK_WAIT_S) -> Starlette:
    """The inspector app, on its own connection to `nats_url` (opened at startup) or on `js`; a fork that
    is not written within `fork_wait` seconds is reported as refused."""
    if (nats_url is None) == (js is None):
        raise ValueError("create_app needs a NATS url or a JetStream context (one of them)")
    holder: dict[str, Inspector] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if js is not None:
            holder["inspector"] = Inspector(js, fork_wait=fork_wait)
            yield
            return
        from runtime import nats as bus

        assert nats_url is not None
        nc = await bus.connect(nats_url, name="sa-ui")
        holder["inspector"] = Inspector(jetstream_for(nc), fork_wait=fork_wait)
        try:
            yield
        finally:
            await bus.close(nc)

    def inspector() -> Inspector:
        return holder["inspector"]

    async def guarded(call: Callable[[], Awaitable[Any]]) -> Response:
        try:
            result = await call()
        except BadBody as e:
            return _error(e.status, str(e))
        except NotFound as e:
            return _error(404, str(e))
        except views.FilterError as e:
            return _error(400, str(e))
        except ValueError as e:  # a bad run id, a bad number, ForkError, ControlError: the user's to fix
            return _error(400, str(e))
        except Refused as e:
            return _error(403, str(e))
        except Exception as e:
            refused = explain_refusal(e)
            if refused is not None:
                return _error(403, refused)
            log.exception("the inspector failed")
            return _error(500, f"the inspector failed: {type(e).__name__}: {e}")
        if isinstance(result, Response):
            return result
        return JSONResponse(result)

    async def index_page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def run_page(request: Request) -> Response:
        return FileResponse(STATIC / "run.html")

    async def api_runs(request: Request) -> Response:
        async def call() -> Any:
            params = dict(request.query_params)
            limit = min(max(_int(params.get("limit"), "limit", DEFAULT_LIMIT), 1), MAX_LIMIT)
            return await inspector().runs(views.RunFilter.from_query(params), limit)
        return await guarded(call)

    async def api_run(request: Request) -> Response:
        return await guarded(lambda: inspector().run(request.path_params["run"]))

    async def api_event(request: Request) -> Response:
        async def call() -> Any:
            return await inspector().event(request.path_params["run"],
                                           _int(request.path_params["seq"], "seq", 0))
        return await guarded(call)

    async def api_follow(request: Request) -> Response:
        async def call() -> Any:
            run_id = check_token(request.path_params["run"], "run id")
            return FollowResponse(inspector(), run_id, _int(request.query_params.get("after"), "after", 0))
        return await guarded(call)

    async def api_fork(request: Request) -> Response:
        async def call() -> Any:
            body = await _json_body(request, '{"at_seq": N}')
            at = body.get("at_seq")
            if not isinstance(at, int) or isinstance(at, bool):
                return _error(400, f'"at_seq" must be a whole number (the seq of the event to fork at), not '
                                   f"{json.dumps(at)}")
            return await inspector().fork(request.path_params["run"], at, web_edit(body.get("edit")))
        return await guarded(call)

    async def api_cancel(request: Request) -> Response:
        async def call() -> Any:
            body = await _json_body(request, '{"reason": "why"}')
            ended = await Control(inspector().js).cancel(request.path_params["run"], by=web_operator(),
                                                         reason=_text(body, "reason"))
            return {"event": views.event_view(ended, ended.ts)}
        return await guarded(call)

    async def api_approve(request: Request) -> Response:
        async def call() -> Any:
            body = await _json_body(request, '{"call_id": "1.0"}')
            arguments = body.get("arguments")
            if arguments is not None and not isinstance(arguments, dict):
                raise ValueError(f'"arguments" must be a JSON object (the call\'s arguments), not '
                                 f"{json.dumps(arguments)}")
            verdict = await Control(inspector().js).approve(
                request.path_params["run"], _text(body, "call_id", required=True), arguments=arguments,
                note=_text(body, "note"), by=web_operator())
            return {"event": views.event_view(verdict, verdict.ts)}
        return await guarded(call)

    async def api_deny(request: Request) -> Response:
        async def call() -> Any:
            body = await _json_body(request, '{"call_id": "1.0", "reason": "why"}')
            verdict = await Control(inspector().js).deny(
                request.path_params["run"], _text(body, "call_id", required=True),
                reason=_text(body, "reason"), by=web_operator())
            return {"event": views.event_view(verdict, verdict.ts)}
        return await guarded(call)

    async def api_export(request: Request) -> Response:
        async def call() -> Any:
            run_id = request.path_params["run"]
            html = await inspector().export(run_id)
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", run_id)  # a run id may hold quotes; a header may not
            return Response(html, media_type="text/html", headers={
                "Content-Disposition": f'attachment; filename="run-{safe}.html"'})
        return await guarded(call)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "followers": inspector().followers})

    app = Starlette(routes=[
        Route("/", index_page),
        Route("/runs/{run}", run_page),
        Route("/api/health", health),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run}", api_run),
        Route("/api/runs/{run}/events/{seq}", api_event),
        Route("/api/runs/{run}/follow", api_follow),
        Route("/api/runs/{run}/fork", api_fork, methods=["POST"]),
        Route("/api/runs/{run}/cancel", api_cancel, methods=["POST"]),
        Route("/api/runs/{run}/approve", api_approve, methods=["POST"]),
        Route("/api/runs/{run}/deny", api_deny, methods=["POST"]),
        Route("/api/runs/{run}/export", api_export),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ], lifespan=lifespan)

    app.state.inspector = inspector
    app.add_middleware(SecurityHeaders)
    return app


class SecurityHeaders:
    """Adds the Content-Security-Policy and friends to every response. Plain ASGI (not Starlette's
    BaseHTTPMiddleware, which buffers a streamed body and hides the client's disconnect from it)."""

    HEADERS = ((b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
               (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = ["Inspector", "create_app"]
