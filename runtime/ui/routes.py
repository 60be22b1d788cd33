"""The inspector's HTTP routes: each one turns a request into a call of `Reads`, `Actions` or
`Following`, and the answer into JSON. Nothing here reads a run or knows NATS beyond naming its refusals.

    GET  /                                  the runs index page
    GET  /runs/{run}                        a run's page
    GET  /api/runs?agent=&status=&tool=&error=&flag=&since=&until=&q=&limit=
                                            index rows, newest first, and the values each filter can take
    GET  /api/runs/{run}                    the run's view (`views.run_view`), events as stored
    GET  /api/runs/{run}/events/{seq}       one event with its big fields fetched from the object store
    GET  /api/runs/{run}/follow?after=N     server-sent events: each new event from seq N on (and the tokens
                                            and tool jobs still running, live), then `end`
    GET  /api/runs/{run}/export             the run as one self-contained HTML file (`runtime.ui.export`)
    GET  /api/approvals?agent=              every call waiting for a person, oldest first
    GET  /runs/{run}/waterfall              a run's time on one axis (page)
    GET  /runs/{run}/conversation?turn=N    what the model saw at turn N (page)
    GET  /api/runs/{run}/waterfall          its spans (the traces' own) and where the time went
    GET  /api/runs/{run}/conversation?turn=N|all
                                            the turn's prompt (no turn: the latest), every message marked
                                            sent or left out; `all`: the whole conversation so far
    GET  /api/runs/{run}/conversation/messages/{index}
                                            one message whole (its event's big payload fetched)
    POST /api/runs/{run}/fork               {"at_seq": N, "edit": {...}?} -> {"run_id": new run}
    POST /api/runs/{run}/cancel             {"reason": "..."} -> {"event": the run's ending as recorded}
    POST /api/runs/{run}/approve            {"call_id": "1.0", "arguments": {...}?, "note": ""} -> the verdict
    POST /api/runs/{run}/answer             {"call_id": "1.0", "answer": <JSON>} -> the answer recorded
    POST /api/runs/{run}/deny               {"call_id": "1.0", "reason": "..."} -> the verdict
    GET  /pending  /fleet  /agents/{agent}  the team's pages: everything waiting, the fleet, an agent
    GET  /schedules                         the cluster's schedules and the runs each started (page)
    GET  /api/pending                       approvals, tool jobs in flight, unfinished runs, what is stuck
    GET  /api/fleet                         hosts, partitions, workers, queues, dead letters (`sa status`)
    GET  /api/schedules                     every schedule, its runs (newest first) and how they ended
    GET  /regressions                       saved regression sets and reports (page)
    GET  /regressions/{report}              one report: each source run beside its regression run (page)
    GET  /api/regressions                   {"sets": [...], "reports": [...]} (reports newest first, no rows)
    GET  /api/regressions/{report}          the report whole (`runtime.regress.saved`)
    GET  /api/agents/{agent}                its bundle, the hosts serving it, its runs, failures over time
    POST /api/dead-letters/{seq}/replay     {} -> the dead letter sent back to its tool's workers
    GET  /api/health                        {"ok": true, "followers": open live views}

Every failure is `{"error": message}` with the status that says whose it is to fix (`failure`): 400 and
415 the request's, 404 a run or event that is not there, 403 a refusal (NATS would not let the
inspector's user do it), 500 the inspector's own. A command takes a JSON body only: a cross-site form
cannot send one, and a cross-origin script cannot without a CORS preflight this app never answers (the
Origin check in `runtime.ui.guard` comes first).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from runtime.nats.connection import explain_refusal
from runtime.nats.subjects import check_token
from runtime.ui import views
from runtime.ui.actions import Actions, Gone, Refused, web_edit
from runtime.ui.conversation import LATEST
from runtime.ui.follow import Following, FollowResponse
from runtime.ui.reads import NotFound, Reads

log = logging.getLogger("runtime.ui")

STATIC = Path(__file__).parent / "static"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Services:
    """What the routes call, over one client; the app keeps it in `app.state.services`."""

    reads: Reads
    actions: Actions
    following: Following


def services(request: Request) -> Services:
    found: Services = request.app.state.services  # set by the app's lifespan
    return found


class BadBody(ValueError):
    """A request the app cannot take; `status` is 415 (not JSON) or 400."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def failure(e: Exception) -> JSONResponse:
    """The answer to a route that raised `e` (see the module docstring for the statuses)."""
    status, message = 500, ""
    if isinstance(e, BadBody):
        status = e.status
    elif isinstance(e, NotFound | Gone):
        status = 404
    elif isinstance(e, ValueError):  # a bad run id, number or filter, ForkError, ControlError
        status = 400
    elif isinstance(e, Refused):
        status = 403
    else:
        message = explain_refusal(e) or ""
        status = 403 if message else 500
        if not message:
            log.exception("the inspector failed", exc_info=e)
            message = f"the inspector failed: {type(e).__name__}: {e}"
    return JSONResponse({"error": message or str(e)}, status_code=status)


Handler = Callable[[Request], Awaitable[Any]]


def answers(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A route from `handler`: what it returns as JSON (a Response as it is), what it raises as `failure`."""
    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        try:
            result = await handler(request)
        except Exception as e:
            return failure(e)
        return result if isinstance(result, Response) else JSONResponse(result)
    return route


async def json_body(request: Request, shape: str) -> dict[str, Any]:
    """The request's JSON object (`shape` shows what to send, for the error message)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise BadBody(415, f"send JSON: {shape} with Content-Type application/json")
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise BadBody(400, f"the body is not JSON: send {shape}") from None
    if not isinstance(body, dict):
        raise BadBody(400, f"the body must be a JSON object: {shape}")
    return body


def text_field(body: dict[str, Any], name: str, *, required: bool = False) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or (required and not value):
        kind = "a non-empty string" if required else "a string"
        raise BadBody(400, f'"{name}" must be {kind}, not {json.dumps(value)}')
    return value


def whole_number(text: str | None, what: str, default: int) -> int:
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what}={text!r}: give a whole number") from None


# -- pages -------------------------------------------------------------------------------------------------


def page(name: str) -> Callable[[Request], Awaitable[Response]]:
    """The route of a page: its static HTML file (`static/<name>.html`), whatever the path's parameters; the
    page's script reads them from its address and asks the API."""
    path = STATIC / f"{name}.html"

    async def serve(request: Request) -> Response:
        return FileResponse(path)

    serve.__name__ = f"{name}_page"
    return serve


async def health(request: Request) -> Response:
    return JSONResponse({"ok": True, "followers": services(request).following.open})


# -- reads -------------------------------------------------------------------------------------------------


@answers
async def api_runs(request: Request) -> Any:
    params = dict(request.query_params)
    limit = min(max(whole_number(params.get("limit"), "limit", DEFAULT_LIMIT), 1), MAX_LIMIT)
    return await services(request).reads.runs(views.RunFilter.from_query(params), limit)


@answers
async def api_run(request: Request) -> Any:
    return await services(request).reads.run(request.path_params["run"])


@answers
async def api_event(request: Request) -> Any:
    seq = whole_number(request.path_params["seq"], "seq", 0)
    return await services(request).reads.event(request.path_params["run"], seq)


@answers
async def api_follow(request: Request) -> Any:
    run_id = check_token(request.path_params["run"], "run id")
    after = whole_number(request.query_params.get("after"), "after", 0)
    return FollowResponse(services(request).following, run_id, after)


@answers
async def api_export(request: Request) -> Any:
    run_id = request.path_params["run"]
    html = await services(request).reads.export(run_id)
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", run_id)  # a run id may hold quotes; a header may not
    return Response(html, media_type="text/html", headers={
        "Content-Disposition": f'attachment; filename="run-{safe}.html"'})


@answers
async def api_approvals(request: Request) -> Any:
    return {"approvals": await services(request).reads.approvals(request.query_params.get("agent"))}


@answers
async def api_waterfall(request: Request) -> Any:
    return await services(request).reads.waterfall(request.path_params["run"])


@answers
async def api_conversation(request: Request) -> Any:
    raw = request.query_params.get("turn", "")
    turn = None if raw == "all" else whole_number(raw, "turn", LATEST)
    return await services(request).reads.conversation(request.path_params["run"], turn)


@answers
async def api_message(request: Request) -> Any:
    index = whole_number(request.path_params["index"], "index", 0)
    return await services(request).reads.message(request.path_params["run"], index)


@answers
async def api_pending(request: Request) -> Any:
    return await services(request).reads.pending()


@answers
async def api_fleet(request: Request) -> Any:
    return await services(request).reads.fleet()


@answers
async def api_schedules(request: Request) -> Any:
    return await services(request).reads.schedules()


@answers
async def api_regressions(request: Request) -> Any:
    return await services(request).reads.regressions()


@answers
async def api_regression(request: Request) -> Any:
    return await services(request).reads.regression(request.path_params["report"])


@answers
async def api_agent(request: Request) -> Any:
    return await services(request).reads.agent(request.path_params["agent"])


# -- commands ----------------------------------------------------------------------------------------------


@answers
async def api_fork(request: Request) -> Any:
    body = await json_body(request, '{"at_seq": N}')
    at = body.get("at_seq")
    if not isinstance(at, int) or isinstance(at, bool):
        raise BadBody(400, f'"at_seq" must be a whole number (the seq of the event to fork at), not '
                           f"{json.dumps(at)}")
    return await services(request).actions.fork(request.path_params["run"], at, web_edit(body.get("edit")))


@answers
async def api_cancel(request: Request) -> Any:
    body = await json_body(request, '{"reason": "why"}')
    return await services(request).actions.cancel(request.path_params["run"], text_field(body, "reason"))


@answers
async def api_approve(request: Request) -> Any:
    body = await json_body(request, '{"call_id": "1.0"}')
    arguments = body.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise BadBody(400, f'"arguments" must be a JSON object (the call\'s arguments), not '
                           f"{json.dumps(arguments)}")
    return await services(request).actions.approve(
        request.path_params["run"], text_field(body, "call_id", required=True), arguments=arguments,
        note=text_field(body, "note"))


@answers
async def api_deny(request: Request) -> Any:
    body = await json_body(request, '{"call_id": "1.0", "reason": "why"}')
    return await services(request).actions.deny(
        request.path_params["run"], text_field(body, "call_id", required=True), text_field(body, "reason"))


@answers
async def api_answer(request: Request) -> Any:
    body = await json_body(request, '{"call_id": "1.0", "answer": "yes"}')
    if "answer" not in body:
        raise BadBody(400, '"answer" is missing: the answer, any JSON value the question\'s schema allows')
    return await services(request).actions.answer(
        request.path_params["run"], text_field(body, "call_id", required=True), body["answer"])


@answers
async def api_replay_dead_letter(request: Request) -> Any:
    await json_body(request, "{}")
    seq = whole_number(request.path_params["seq"], "seq", 0)
    return await services(request).actions.replay_dead_letter(seq)


ROUTES: list[BaseRoute] = [
    Route("/", page("index")),
    Route("/runs/{run}", page("run")),
    Route("/runs/{run}/waterfall", page("waterfall")),
    Route("/runs/{run}/conversation", page("conversation")),
    Route("/pending", page("pending")),
    Route("/fleet", page("fleet")),
    Route("/schedules", page("schedules")),
    Route("/regressions", page("regressions")),
    Route("/regressions/{report}", page("regression")),
    Route("/agents/{agent}", page("agent")),
    Route("/api/health", health),
    Route("/api/pending", api_pending),
    Route("/api/fleet", api_fleet),
    Route("/api/schedules", api_schedules),
    Route("/api/regressions", api_regressions),
    Route("/api/regressions/{report}", api_regression),
    Route("/api/agents/{agent}", api_agent),
    Route("/api/dead-letters/{seq}/replay", api_replay_dead_letter, methods=["POST"]),
    Route("/api/approvals", api_approvals),
    Route("/api/runs", api_runs),
    Route("/api/runs/{run}", api_run),
    Route("/api/runs/{run}/events/{seq}", api_event),
    Route("/api/runs/{run}/follow", api_follow),
    Route("/api/runs/{run}/export", api_export),
    Route("/api/runs/{run}/waterfall", api_waterfall),
    Route("/api/runs/{run}/conversation", api_conversation),
    Route("/api/runs/{run}/conversation/messages/{index}", api_message),
    Route("/api/runs/{run}/fork", api_fork, methods=["POST"]),
    Route("/api/runs/{run}/cancel", api_cancel, methods=["POST"]),
    Route("/api/runs/{run}/approve", api_approve, methods=["POST"]),
    Route("/api/runs/{run}/deny", api_deny, methods=["POST"]),
    Route("/api/runs/{run}/answer", api_answer, methods=["POST"]),
    Mount("/static", StaticFiles(directory=STATIC), name="static"),
]


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "ROUTES", "STATIC", "BadBody", "Services", "answers", "failure",
           "json_body"]
