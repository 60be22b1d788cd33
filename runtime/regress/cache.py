"""The model reply cache of regressions: a second regression of the same runs on the same candidate asks the
model nothing.

    cache = ModelCache(js)                 # the bucket is opened (created) on first use
    client = CachedModelClient(cache, base_url="http://gpu:8000/v1", model="qwen3")
    with regression_run("r3f2"):           # the run whose requests these are
        completion = await client.complete(messages, **extras)   # asked once, then served from the cache

The key is the request as sent: sha256 of the endpoint's URL and the request body's bytes exactly as the
client puts them on the wire (`ModelClient._request`: the SDK's key order, compact JSON), so any change to
what the model is asked (a prompt, a tool's description, the sampling, the model's name, the constraint)
is a different key and a real call. One normalisation: the id of the regression run itself is written
`{run}` in the key, because a native tool call's id carries it (`<run>/<turn>.<index>`) and a new
regression of the same set is made of new runs; nothing else about the run is in the request.

Why a KV bucket (`regress_model_cache`, history 1, file storage) and not a file: a regression is driven by a
client anywhere the fleet is reachable (a laptop, a CI job), and the next regression of the same set should
find the replies whichever machine drives it; the fleet's own store is the one place all of them reach. A
reply is a few kilobytes at most, far under a KV value's limit.

Only what a model answered is cached: an error (a refused or unreachable server) is asked again next time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from runtime.model.client import ModelClient, _Reply
from runtime.nats.kv import fleet_kv
from runtime.types import Usage

CACHE_BUCKET = "regress_model_cache"
RUN_PLACEHOLDER = b"{run}"

_run: ContextVar[str | None] = ContextVar("regression_run", default=None)


@contextmanager
def regression_run(run_id: str) -> Iterator[None]:
    """Requests made inside (in this task and the tasks it starts) belong to regression run `run_id`."""
    token = _run.set(run_id)
    try:
        yield
    finally:
        _run.reset(token)


class _Cached(msgspec.Struct, frozen=True, array_like=True):
    text: str
    calls: list[dict[str, Any]] | None
    usage: Usage
    finish: str
    model: str
    id: str


class ModelCache:
    """Replies by request key, in the fleet's KV (see the module docstring); the bucket is opened, and created
    if need be, by the first request, so a regression refused before its first run writes nothing."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await fleet_kv(self.js, CACHE_BUCKET)
        return self._kv

    async def get(self, key: str) -> bytes | None:
        try:
            entry = await (await self.kv()).get(key)
        except KeyNotFoundError:
            return None
        return entry.value or None

    async def put(self, key: str, value: bytes) -> None:
        await (await self.kv()).put(key, value)


def request_key(base_url: str, body: bytes, run_id: str | None) -> str:
    """The cache key of one request (see the module docstring)."""
    if run_id:
        body = body.replace(run_id.encode(), RUN_PLACEHOLDER)
    return hashlib.sha256(base_url.encode() + b"\n" + body).hexdigest()


class CachedModelClient(ModelClient):
    """A `ModelClient` whose non-streamed requests are answered from a `ModelCache` when the same bytes were
    sent before; `hits` and `misses` count them (a miss is a real request to the server), in all and per
    regression run (`counted`: what one run cost, wherever it was driven)."""

    def __init__(self, cache: ModelCache, **client: Any) -> None:
        super().__init__(**client)
        self.cache = cache
        self.hits = self.misses = 0
        self._per_run: dict[str, list[int]] = {}

    def counted(self, run_id: str) -> tuple[int, int]:
        """The hits and misses of regression run `run_id` (forgotten once asked)."""
        hits, misses = self._per_run.pop(run_id, [0, 0])
        return hits, misses

    def _count(self, hit: bool) -> None:
        run = _run.get()
        if run is not None:
            self._per_run.setdefault(run, [0, 0])[0 if hit else 1] += 1

    async def _once(self, params: dict[str, Any]) -> _Reply:
        body, _ = self._request(params)
        key = request_key(self.base_url, body, _run.get())
        cached = await self.cache.get(key)
        self._count(cached is not None)
        if cached is not None:
            self.hits += 1
            c = msgspec.msgpack.decode(cached, type=_Cached)
            return _Reply(c.text, c.calls, c.usage, c.finish, c.model, c.id)
        self.misses += 1
        reply = await super()._once(params)
        await self.cache.put(key, msgspec.msgpack.encode(_Cached(*reply)))
        return reply


__all__ = ["CACHE_BUCKET", "CachedModelClient", "ModelCache", "regression_run", "request_key"]
