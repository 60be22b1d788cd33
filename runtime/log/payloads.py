"""Big payloads: values too large for a message travel through the JetStream object store `payloads`.

    payloads = Payloads(js)                       # threshold: SA_PAYLOAD_THRESHOLD or 256 KiB
    value_or_ref = await payloads.offload(value, run=run_id)  # small: unchanged; big: a PayloadRef
    value = await payloads.resolve(ref)           # the value back (digest-checked)

Why: a NATS message is capped by the server's `max_payload` (1 MiB by default), and events stay small
so a run's history grows linearly and replays fast. So a value over the threshold is stored once in the
object store (chunked in 128 KiB messages by nats-py) and the message carries a `PayloadRef` (name, size,
digest) instead.

Objects are named per run and content-addressed within it: ``<run>/sha256-<hex>`` of the msgpack bytes.
So offloading is idempotent (a worker or host that crashes and retries stores the same object under the
same name, and an existing object is not uploaded again), a reader can verify what it got against the
digest in the ref, and no object is shared between runs: deleting a run's objects (`delete_run`, used by
the run log's purge) can never break another run that produced the same bytes. Every writer knows the
run (the host from the event, the worker from its job). Refs written before objects were named per run
(``sha256-<hex>``, shared) are still read; a purge never deletes them, the store's age bound does
(`runtime.nats.retention`).

Who uses it:
* the run log (`runtime.log`) stores a whole event over the threshold and keeps a stub in EVENTS;
* the worker offloads a tool output before publishing its `ToolOutcome` (`offload_outcome`), and caps
  printed script text so an outcome always fits in one message; a workspace job's `applied` marker keeps
  a big output as a ref too (`runtime.tools.data`); the host resolves the outcome (`resolve_outcome`) because
  the model's next prompt needs the value.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from typing import Any, NamedTuple

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from runtime.events import PayloadRef
from runtime.jobs import ScriptNote, ToolOutcome
from runtime.nats.kv import last_per_subject, payloads_store
from runtime.nats.subjects import PAYLOADS_BUCKET, check_token
from runtime.types import ToolResult

log = logging.getLogger("runtime.log.payloads")

DEFAULT_THRESHOLD = 256 * 1024
ENV_THRESHOLD = "SA_PAYLOAD_THRESHOLD"
_ENVELOPE_ROOM = 16 * 1024  # headers and the event's other fields must still fit under max_payload

_enc = msgspec.msgpack.Encoder()


class PayloadError(RuntimeError):
    """A referenced payload is missing or its bytes do not match the ref's digest."""


def threshold_from_env(env: dict[str, str] | None = None) -> int:
    """`SA_PAYLOAD_THRESHOLD` ("256kb", "1mb" or bytes) or the default; a bad value is an error, not
    a silent default, because a wrong threshold shows up much later as a publish failure."""
    raw = (env if env is not None else os.environ).get(ENV_THRESHOLD, "").strip()
    if not raw:
        return DEFAULT_THRESHOLD
    from runtime.quantities import parse_size

    return parse_size(raw, field=ENV_THRESHOLD)


def object_name(data: bytes, run: str) -> str:
    """The name of `data` stored for `run` (what `PayloadRef.object_name` holds): the run, then the
    content address of the bytes."""
    return f"{check_token(run, 'run id')}/sha256-{hashlib.sha256(data).hexdigest()}"


def run_of(name: str) -> str | None:
    """The run an object belongs to (None: a shared object from before objects were named per run)."""
    run, sep, _ = name.rpartition("/")
    return run if sep else None


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Payloads:
    """The object store `payloads` seen as "store big values, read them back".

    One per process (per JetStream context); the bucket handle is opened on first use. `threshold` is
    in bytes of msgpack; it is lowered to fit the connected server's `max_payload` if needed, because
    an inline value bigger than a NATS message could never be published.
    """

    def __init__(self, js: JetStreamContext, *, threshold: int | None = None) -> None:
        self.js = js
        wanted = threshold if threshold is not None else threshold_from_env()
        if wanted < 1:
            raise ValueError("payload threshold must be ≥ 1 byte")
        limit = max(1024, int(getattr(js._nc, "max_payload", 0) or 1 << 20) - _ENVELOPE_ROOM)
        if wanted > limit:
            log.warning("payload threshold %d exceeds what the server accepts in one message; using %d",
                        wanted, limit)
        self.threshold = min(wanted, limit)
        self._store: ObjectStore | None = None

    async def store(self) -> ObjectStore:
        if self._store is None:
            self._store = await payloads_store(self.js)
        return self._store

    # -- values ----------------------------------------------------------------------------------------

    def is_big(self, data: bytes) -> bool:
        return len(data) > self.threshold

    async def put_bytes(self, data: bytes, *, run: str) -> PayloadRef:
        """Store `data` (whatever its size) for `run` and return its ref; a no-op if the run stored the
        same bytes already."""
        name = object_name(data, run)
        store = await self.store()
        try:
            info = await store.get_info(name)
            if info.size == len(data):
                return PayloadRef(object_name=name, size=len(data), digest=_digest(data))
        except (ObjectNotFoundError, NotFoundError):
            pass
        await store.put(name, data)
        return PayloadRef(object_name=name, size=len(data), digest=_digest(data))

    async def offload(self, value: Any, *, run: str) -> Any:
        """`value` itself when its msgpack encoding is within the threshold, else a `PayloadRef` to it
        stored for `run`."""
        data = _enc.encode(value)
        if not self.is_big(data):
            return value
        return await self.put_bytes(data, run=run)

    async def fetch(self, ref: PayloadRef) -> bytes:
        """The stored bytes of `ref`, checked against its size and digest."""
        store = await self.store()
        buf = io.BytesIO()
        try:
            await store.get(ref.object_name, writeinto=buf)  # writeinto: no quadratic bytes +=
        except (ObjectNotFoundError, NotFoundError):
            raise PayloadError(f"payload {ref.object_name} ({ref.size} bytes) is not in the "
                               f"{PAYLOADS_BUCKET!r} object store") from None
        data = buf.getvalue()
        if len(data) != ref.size or _digest(data) != ref.digest:
            raise PayloadError(f"payload {ref.object_name}: got {len(data)} bytes with digest "
                               f"{_digest(data)}, the ref says {ref.size} bytes {ref.digest}")
        return data

    async def resolve(self, ref: Any) -> Any:
        """The value a ref stands for (decoded msgpack); anything that is not a ref is returned as is."""
        if not isinstance(ref, PayloadRef):
            return ref
        return msgspec.msgpack.decode(await self.fetch(ref))

    # -- deleting ------------------------------------------------------------------------------------------

    async def objects_by_run(self) -> dict[str, list[StoredObject]]:
        """Every stored object named for a run, grouped by run (shared legacy objects are left out). One
        pass over the store's metadata, however many runs are asked about afterwards."""
        await self.store()  # the bucket exists
        stream = f"OBJ_{PAYLOADS_BUCKET}"
        out: dict[str, list[StoredObject]] = {}
        for msg in await last_per_subject(self.js, stream, f"$O.{PAYLOADS_BUCKET}.M.>"):
            try:
                meta = json.loads(msg.data)
            except ValueError:
                continue
            name = meta.get("name", "")
            if meta.get("deleted") or (run := run_of(name)) is None:
                continue
            size = int(meta.get("size") or 0)
            out.setdefault(run, []).append(StoredObject(name, size, meta.get("nuid", ""), msg.subject))
        return out

    async def delete_objects(self, objects: list[StoredObject]) -> None:
        """Remove `objects` entirely: their chunks and their metadata (no tombstone is left behind)."""
        stream = f"OBJ_{PAYLOADS_BUCKET}"
        for obj in objects:
            if obj.nuid:
                await self.js.purge_stream(stream, subject=f"$O.{PAYLOADS_BUCKET}.C.{obj.nuid}")
            await self.js.purge_stream(stream, subject=obj.meta_subject)

    # -- tool outcomes ---------------------------------------------------------------------------------

    async def offload_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        """The outcome as it may travel: a big output moved to the object store (the outcome's `ref`,
        which `ToolOutcome.events()` puts on `tool.completed`) and printed text capped so that the
        message fits whatever the script printed."""
        changes: dict[str, Any] = {}
        if outcome.result.error is None and outcome.ref is None:
            data = _enc.encode(outcome.result.output)
            if self.is_big(data):
                changes["ref"] = await self.put_bytes(data, run=outcome.run_id)
                changes["result"] = ToolResult(output=None, duration_ms=outcome.result.duration_ms)
        notes = _cap_notes(outcome.notes, self.threshold)
        if notes is not outcome.notes:
            changes["notes"] = notes
        return msgspec.structs.replace(outcome, **changes) if changes else outcome

    async def resolve_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        """The outcome with its output back inline (for readers that want the value, not the event)."""
        if outcome.ref is None:
            return outcome
        output = msgspec.msgpack.decode(await self.fetch(outcome.ref))
        return msgspec.structs.replace(
            outcome, ref=None, result=ToolResult(output=output, duration_ms=outcome.result.duration_ms))


class StoredObject(NamedTuple):
    """One object of the store as listed: its name, size in bytes, chunk id and metadata subject."""

    name: str
    size: int
    nuid: str
    meta_subject: str


def _cap_notes(notes: tuple[ScriptNote, ...], budget: int) -> tuple[ScriptNote, ...]:
    """Printed text beyond `budget` bytes in total is cut (one note says how much): prints are a
    debugging aid, and a script that prints megabytes must not make its own result undeliverable."""
    total = sum(len(n.text.encode()) for n in notes if n.kind == "printed")
    if total <= budget:
        return notes
    out: list[ScriptNote] = []
    left = budget
    for n in notes:
        if n.kind != "printed":
            out.append(n)
            continue
        raw = n.text.encode()
        if len(raw) <= left:
            out.append(n)
            left -= len(raw)
        elif left >= 0:  # the first note over budget keeps what fits and says what was cut
            kept = raw[:left].decode(errors="ignore")
            cut = total - budget
            out.append(msgspec.structs.replace(
                n, text=f"{kept}… [{cut} bytes of printed output cut: over the {budget}-byte budget "
                        f"of one outcome]"))
            left = -1
    return tuple(out)


__all__ = ["DEFAULT_THRESHOLD", "ENV_THRESHOLD", "PayloadError", "Payloads", "StoredObject", "object_name",
           "run_of", "threshold_from_env"]
