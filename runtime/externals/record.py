"""Exactly-once external calls under redelivery: every answered call is recorded before the script goes on.

A tool job is redelivered when its worker dies, and its script then runs again from the start. Without
help, every external it calls would be called again: a payment charged twice. So each external call of a
job is numbered in the order the script makes it (1, 2, ...) and gets the key `<run>/<call>#<n>`
(`ExecutionContext.idempotency_key`). When the implementation answers, the answer is written to the
`externals` KV bucket under that key, and only after the write is acknowledged does the script see it.

The guarantee, exactly:

- an external call whose answer was recorded is never made again for that job: a redelivery's script
  gets the recorded answer for its `n`-th call (the script is deterministic, so its `n`-th call is the same
  call; a different external name at `n` is an `external` error, never a silent mismatch);
- a call that was in flight when the worker died (made, answer not yet recorded) is made again, with the
  same key: a service that de-duplicates on the key (an `Idempotency-Key` header, a unique column) sees
  one effect; one that does not may see two requests. That window is the implementation's own round trip;
- a call that raised is not recorded, so a redelivery makes it again (with the same key);
- externals marked unrecorded (reading a secret) are re-run: they have no effect, and their values must
  not be stored anywhere.

Records live in KV with a TTL (`RECORD_TTL_S`), far longer than any job's deliveries take.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from runtime.externals.context import ExecutionContext
from runtime.scripts import to_sandbox

__all__ = ["EXTERNALS_BUCKET", "RECORD_TTL_S", "CallRecorder", "ReplayMismatch", "externals_kv", "record_key"]

EXTERNALS_BUCKET = "externals"
RECORD_TTL_S = 7 * 24 * 3600.0
_KEY_UNSAFE = re.compile(r"[^-/_=.a-zA-Z0-9]")


class ReplayMismatch(RuntimeError):
    """A redelivered script made a different external call at position n than the recorded one."""


class _Record(msgspec.Struct, frozen=True):
    name: str
    value: Any


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(_Record)


def record_key(idempotency_key: str) -> str:
    """The KV key of a call's record (KV keys allow `-/_=.` and alphanumerics: others are escaped)."""
    return _KEY_UNSAFE.sub(lambda m: f"={ord(m.group()):02x}", idempotency_key.replace("#", "/n"))


async def externals_kv(js: JetStreamContext) -> KeyValue:
    """The bucket of recorded external answers (created on first use)."""
    try:
        return await js.key_value(EXTERNALS_BUCKET)
    except Exception:
        return await js.create_key_value(KeyValueConfig(bucket=EXTERNALS_BUCKET, history=1,
                                                        ttl=RECORD_TTL_S, storage=StorageType.FILE))


def takes_key(impl: Callable[..., Any]) -> bool:
    """Whether an implementation accepts the call's key as the keyword `idempotency_key`."""
    try:
        return "idempotency_key" in inspect.signature(impl).parameters
    except (TypeError, ValueError):
        return False


class CallRecorder:
    """Numbers one job's external calls, replays recorded answers and records new ones."""

    def __init__(self, kv: KeyValue | None, context: ExecutionContext, *,
                 unrecorded: Collection[str] = ()) -> None:
        """`kv` None: nothing is recorded (one process, where a call is never redelivered); keys are given."""
        self.kv = kv
        self.context = context
        self.unrecorded = frozenset(unrecorded)
        self.calls = 0
        self.replayed = 0
        self.made = 0

    def wrap(self, name: str, impl: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        """`impl` as an async external that replays a recorded answer or records a new one."""
        keyed = takes_key(impl)

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            key = self.context.idempotency_key(self.calls)
            if keyed:
                kwargs["idempotency_key"] = key
            if name in self.unrecorded or self.kv is None:
                return await _call(impl, args, kwargs)
            kv_key = record_key(key)
            try:
                entry = await self.kv.get(kv_key)
            except KeyNotFoundError:
                entry = None
            if entry is not None and entry.value:
                record = _dec.decode(entry.value)
                if record.name != name:
                    raise ReplayMismatch(
                        f"external call #{self.calls} of {self.context.call_id} was {record.name!r} on an "
                        f"earlier delivery but is {name!r} now: the script must make its external calls in "
                        "the same order every time it runs")
                self.replayed += 1
                return record.value
            value = to_sandbox(await _call(impl, args, kwargs))
            try:
                data = _enc.encode(_Record(name, value))
            except (TypeError, msgspec.EncodeError) as e:
                raise TypeError(f"external {name!r} returned a value that cannot be recorded ({e}); "
                                "return plain data (str, int, float, bool, None, list, dict)") from None
            await self.kv.put(kv_key, data)  # durable before the script sees the answer
            self.made += 1
            return value

        recorded.__name__ = name
        return recorded


async def _call(impl: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Await an async implementation; run a sync one in a thread, so a blocking client (an HTTP call, a
    database driver) does not stall the worker's other jobs."""
    if inspect.iscoroutinefunction(impl):
        value = await impl(*args, **kwargs)
    else:
        value = await asyncio.to_thread(functools.partial(impl, *args, **kwargs))
    if inspect.isawaitable(value):
        value = await value
    return value
