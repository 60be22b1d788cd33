"""The HTTP surface: `POST /v1/chat/completions` (JSON and SSE), `GET /v1/models`, `GET /health`.

Everything that can be wrong with a request (body, model name, constraint, prompt length) is checked before
the job is queued, so errors come back as 4xx with an OpenAI-style body and never reach the decode loop.
Responses follow the OpenAI/vLLM chat completion shapes so the openai client and the runtime's vLLM adapter
work against this server unchanged.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.modelserver.engine import Delta, SamplingParams
from runtime.modelserver.generation import GenerationWorker, Job, QueueFull
from runtime.modelserver.grammar import GrammarCache, constraint_for
from runtime.modelserver.protocol import ChatCompletionRequest, RequestError, parse_chat_request

log = logging.getLogger("runtime.modelserver")

SERVED_MODEL_NAME = "smollm2-135m-instruct"
MODEL_ALIASES = ("local",)


class Backend(Protocol):
    """What the HTTP layer needs from a model (`engine.Engine`, or a stub in tests)."""

    context_length: int
    grammars: GrammarCache

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the chat prompt."""
        ...

    def token_budget(self, prompt_len: int, requested: int | None) -> int:
        """max_tokens for the request, or RequestError."""
        ...

    def generate(self, prompt_ids: list[int], params: SamplingParams, grammar: Any, cancelled: Any) -> Any:
        """Iterator of Delta; runs on the worker thread."""
        ...


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def create_app(
    backend: Backend,
    *,
    model_name: str = SERVED_MODEL_NAME,
    aliases: Sequence[str] = MODEL_ALIASES,
    max_waiting: int = 64,
) -> Starlette:
    """An ASGI app serving `backend`. The generation worker thread starts with the app and stops with it."""
    names = {model_name, *aliases}
    created = int(time.time())
    state: dict[str, GenerationWorker] = {}

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state["worker"] = GenerationWorker(max_waiting=max_waiting)
        try:
            yield
        finally:
            state.pop("worker").close()

    def worker() -> GenerationWorker:
        # Apps driven without lifespan events (some test clients) still get a worker.
        if "worker" not in state:
            state["worker"] = GenerationWorker(max_waiting=max_waiting)
        return state["worker"]

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name})

    async def models(_request: Request) -> Response:
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "structured-agents",
            "max_model_len": backend.context_length,
            "aliases": list(aliases),
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def prepare(request: Request) -> tuple[ChatCompletionRequest, list[int], SamplingParams, Any]:
        req = parse_chat_request(await request.body())
        if req.model is not None and req.model not in names:
            alias_note = f" (alias {', '.join(repr(a) for a in aliases)})" if aliases else ""
            raise RequestError(
                f"The model `{req.model}` does not exist; this server serves `{model_name}`{alias_note}",
                status=404,
                param="model",
            )
        constraint = constraint_for(req)
        prompt_ids = await run_in_threadpool(backend.render_prompt, req.messages, req.tools)
        max_tokens = backend.token_budget(len(prompt_ids), req.token_limit)
        grammar = await run_in_threadpool(backend.grammars.compile, constraint) if constraint else None
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stop_strings,
            ignore_eos=req.ignore_eos,
        )
        return req, prompt_ids, params, grammar

    async def chat(request: Request) -> Response:
        try:
            req, prompt_ids, params, grammar = await prepare(request)
            job = worker().start(lambda ev: backend.generate(prompt_ids, params, grammar, ev))
        except RequestError as e:
            return _error(e)
        except QueueFull as e:
            return _error(RequestError(str(e), status=503))
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        model = req.model or model_name
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _sse(job, completion_id, model, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _complete(request, job, completion_id, model)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


def _usage(last: Delta) -> dict[str, int]:
    return {
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": last.completion_tokens,
        "total_tokens": last.prompt_tokens + last.completion_tokens,
    }


async def _complete(request: Request, job: Job, completion_id: str, model: str) -> Response:
    """Collect a whole completion while watching for the client going away (which cancels the job)."""
    parts: list[str] = []
    last: Delta | None = None
    failure: BaseException | None = None

    async with anyio.create_task_group() as tg:

        async def collect() -> None:
            nonlocal last, failure
            try:
                async for d in job.deltas():
                    parts.append(d.text)
                    last = d
            except Exception as e:
                failure = e
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while not await request.is_disconnected():
                await anyio.sleep(0.2)
            job.cancel()
            tg.cancel_scope.cancel()

        tg.start_soon(collect)
        tg.start_soon(watch)

    if failure is not None:
        log.error("generation failed: %s", failure)
        return JSONResponse(
            {
                "error": {
                    "message": f"generation failed: {failure}",
                    "type": "InternalServerError",
                    "code": 500,
                }
            },
            status_code=500,
        )
    if last is None:  # cancelled because the client left; nobody reads this
        return Response(status_code=499)
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(parts), "tool_calls": []},
                "finish_reason": last.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": _usage(last),
    }
    return JSONResponse(body)


async def _sse(job: Job, completion_id: str, model: str, include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's chunk stream: a role delta, content deltas, a finish chunk, an optional usage chunk, [DONE].

    Starlette cancels this generator when the client disconnects; leaving `job.deltas()` cancels the job.
    """
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> str:
        choices = (
            [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
            if delta or finish
            else []
        )
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for d in job.deltas():
            if d.text:
                yield chunk({"content": d.text})
            if d.finish_reason is not None:
                yield chunk({}, finish=d.finish_reason)
                if include_usage:
                    yield chunk({}, usage=_usage(d))
    except Exception as e:  # headers are sent: report in-band, as vLLM does
        log.error("generation failed: %s", e)
        err = {"error": {"message": f"generation failed: {e}", "type": "InternalServerError", "code": 500}}
        yield f"data: {json.dumps(err)}\n\n"
    yield "data: [DONE]\n\n"
