"""The KV buckets and the payload object store: opening them, writing with a TTL, listing them.

Why a module: nats-py's bucket helpers miss three things this runtime needs, so every bucket is opened,
written and listed through here.

* Opening (`runs_kv`, `applied_kv`, `workspace_kv`, `fleet_kv`, `payloads_store`) creates a bucket on first
  use, with ``max_consumers`` set: nats-py leaves it at -1, which nats-server 2.15 silently caps at 1,000.
* `put_kv` writes with an optional per-key TTL (the ``Nats-TTL`` header) and an optional expected revision
  (create with ``last=0``, compare-and-set with a revision); nats-py's `put`/`update` take no TTL.
* `kv_entries` lists a bucket (or one partition of it) exactly, where nats-py's `watch`/`keys` can report
  no keys while keys exist on a cluster.

The buckets:

* ``runs``: key = run id, value = `RunIndex` (msgpack), the run index `sa runs` lists.
* ``ws_<workspace>``: one per workspace, tool data; key = the file's path relative to ``/data/``
  (`runtime.tools.data`); history 5 so a bad write can be inspected.
* ``applied``: one key per tool job whose workspace writes were applied, holding the recorded result, TTL
  one day: a redelivered job replays it instead of writing twice.
* Fleet buckets, for hosts and workers on many machines. Every key carries a per-message TTL, so a process
  that dies simply stops existing after the TTL, with no clean-up by anyone:

  - ``leases``: key ``<bundle>.p<N>`` = the host holding partition N of that bundle (`runtime.host.leases`:
    hosts serving different bundles hold leases of their own bundles only). Taken with create
    (expected revision 0), renewed with a revision-checked update, gone when the TTL passes without
    renewal (measured: the key vanishes within ~20 ms of its TTL).
  - ``hosts``: key = host id, value = `HostBeat`: liveness for fair shares, and `sa status`.
  - ``workers``: key = worker id, value = `WorkerBeat`: `sa status` only.
  - ``active``: key ``p<N>.<run>`` (value: the actor) for every run not yet ended, so a host taking
    partition N over scans only that partition's unfinished runs (`active_filter`), never the whole
    ``runs`` index. Removed with a purge whose marker expires (`ACTIVE_PURGE_TTL_S`).

* object store ``payloads``: payloads too big for an event (`runtime.log.payloads`), named per run and
  bounded by age (`runtime.nats.retention`); a purged run's objects are deleted with it (`runtime.log.purge`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    BucketNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from runtime.nats.pull import delivery_status
from runtime.nats.retention import DEFAULT_PAYLOADS_MAX_AGE_S, DEFAULT_PAYLOADS_MAX_BYTES
from runtime.nats.retry import placing, retrying
from runtime.nats.subjects import (
    APPLIED_BUCKET,
    APPLIED_TTL_S,
    HDR_EXPECTED_SUBJECT_SEQ,
    PAYLOADS_BUCKET,
    RUNS_BUCKET,
    WRONG_LAST_SEQUENCE,
    workspace_bucket,
)

KV_MAX_CONSUMERS = 10_000
CREATED_VISIBLE_S = 10.0  # how long a bucket just created may stay unknown to the server asked about it
_ERR_STREAM_NAME_EXISTS = 10058  # another process created the bucket meanwhile (with another config)

log = logging.getLogger("runtime.nats")


async def runs_kv(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    """The run index bucket (created on first use)."""
    return await _kv(js, KeyValueConfig(bucket=RUNS_BUCKET, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True))


async def applied_kv(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    """Markers of tool jobs whose workspace writes were applied (see `runtime.tools.data`)."""
    return await _kv(js, KeyValueConfig(bucket=APPLIED_BUCKET, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True, ttl=APPLIED_TTL_S))


async def workspace_kv(js: JetStreamContext, workspace: str, *, replicas: int = 1) -> KeyValue:
    """The bucket of one workspace (created on first use; history 5 so a bad write can be inspected).
    Its stream allows atomic batches: one tool call's writes to several keys land together or not at all
    (`allow_atomic_writes` turns it on for a bucket made by an older version)."""
    return await _kv(js, KeyValueConfig(bucket=workspace_bucket(workspace), history=5, replicas=replicas,
                                        storage=StorageType.FILE, direct=True), atomic=True)


async def allow_atomic_writes(js: JetStreamContext, workspace: str) -> None:
    """Let the workspace bucket's stream take atomic batches (a no-op if it already does)."""
    info = await js.stream_info(f"KV_{workspace_bucket(workspace)}")
    if not info.config.allow_atomic:
        await js.update_stream(dataclasses.replace(info.config, allow_atomic=True))


async def fleet_kv(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> KeyValue:
    """One of the fleet buckets (`leases`, `hosts`, `workers`, `active`): history 1, memory of nothing
    but the current value; liveness comes from per-key TTLs (`put_kv`), not from a bucket max age."""
    return await _kv(js, KeyValueConfig(bucket=bucket, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True))


async def put_kv(js: JetStreamContext, bucket: str, key: str, value: bytes, *, last: int | None = None,
                 ttl: float | None = None, timeout: float | None = None) -> int:
    """Put `key` (create if `last == 0`, compare-and-set if `last` is a revision) with an optional
    per-key TTL in whole seconds (at least 1); returns the new revision.

    nats-py's `KeyValue.update` takes no TTL, and `put` neither: this is the same publish with the
    `Nats-TTL` header. A failed revision check raises `KeyWrongLastSequenceError`, as `update` does.
    """
    headers = {HDR_EXPECTED_SUBJECT_SEQ: str(last)} if last is not None else None
    kwargs: dict[str, Any] = {"headers": headers}
    if ttl is not None:
        kwargs["msg_ttl"] = max(1, round(ttl))
    if timeout is not None:
        kwargs["timeout"] = timeout
    try:
        ack = await js.publish(f"$KV.{bucket}.{key}", value, **kwargs)
    except nats.js.errors.APIError as e:
        if e.err_code in WRONG_LAST_SEQUENCE:
            raise KeyWrongLastSequenceError(description=e.description) from None
        raise
    return ack.seq


@dataclass(frozen=True)
class KvEntry:
    """One key's latest entry, as `kv_entries` reads it (the fields of nats-py's `KeyValue.Entry` used)."""

    key: str
    value: bytes  # empty for a delete marker
    revision: int
    operation: str | None = None  # None for a value, "DEL" / "PURGE" for a delete marker
    created: datetime.datetime | None = None  # when it was written


async def kv_entries(kv: KeyValue, keys: str = ">", *, deleted: bool = False,
                     complete: bool = False) -> dict[str, KvEntry]:
    """The current entries (key -> `KvEntry`) matching `keys`: the way to list a bucket or one partition
    of it. Deleted keys are left out unless `deleted` (their entry then has `operation` set and carries
    the revision to compare-and-set on).

    `complete`: checked against the stream leader's own list of the keys (a small listing only: one
    partition's keys). The listing consumer is a replica-1 consumer, which the cluster may place on any
    replica of the bucket, and a replica that was cut off and is still catching up reads from its stale
    copy: a takeover that listed the unfinished runs there missed the ones started while it was away,
    and nothing drove them again (seen on machines of their own, `bench/partitions.py`, the cut of a
    minority node). Keys the leader has and the listing lacks: listed again, then `IncompleteListing`.

    Not nats-py's `watch`/`keys`/`history`: their "initial values done" marker comes from a consumer-info
    round trip that races the messages already on their way, so on a cluster they can report no keys
    while keys exist (seen in tests/system/test_faults.py). Here an ephemeral pull consumer (last per subject)
    says at creation how many entries there are, and exactly that many are read.
    """
    js: JetStreamContext = kv._js  # nats-py keeps these on the bucket handle
    stream, prefix = kv._stream, kv._pre
    msgs = await last_per_subject(js, stream, prefix + keys)
    for attempt in range(COMPLETE_RETRIES if complete else 0):
        leader = (await js.stream_info(stream, subjects_filter=prefix + keys)).state.subjects or {}
        missing = set(leader) - {m.subject for m in msgs}
        if not missing:
            break
        if attempt == COMPLETE_RETRIES - 1:
            raise IncompleteListing(f"{stream}: {len(missing)} key(s) of {prefix + keys} the stream leader "
                                    f"has were not listed (a replica catching up?), e.g. {min(missing)}")
        await asyncio.sleep(COMPLETE_RETRY_S)
        msgs = await last_per_subject(js, stream, prefix + keys)
    out: dict[str, KvEntry] = {}
    for msg in msgs:
        op = kv_operation(msg.headers)
        if op is not None and not deleted:  # a purge marker: most of a busy `active` partition's listing
            continue
        meta, key = msg.metadata, msg.subject[len(prefix):]  # parsed here, for what is kept only
        out[key] = KvEntry(key=key, value=msg.data, operation=op, revision=meta.sequence.stream,
                           created=meta.timestamp)
    return out


def kv_operation(headers: dict[str, str] | None) -> str | None:
    """None for a value; "DEL" or "PURGE" for a delete marker (a client's, or the server's when a key's TTL
    ran out: ``Nats-Marker-Reason``)."""
    headers = headers or {}
    op = headers.get("KV-Operation")
    if op is None and headers.get("Nats-Marker-Reason"):
        op = "DEL" if headers["Nats-Marker-Reason"] == "Remove" else "PURGE"
    return op


async def latest(js: JetStreamContext, bucket: str, key: str) -> tuple[int, bytes | None]:
    """The key's latest revision and value (0 and None if it never was written; the marker's revision and
    None if it was deleted), asked of the bucket's leader: a direct get may be answered by a replica still
    catching up after a cut, whose older revision would only fail a compare-and-set made on it."""
    try:
        msg = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except NotFoundError:
        return 0, None
    seq: int = msg.seq  # type: ignore[assignment]  # a message read from a stream has one
    return seq, (None if kv_operation(msg.headers) else msg.data)


async def last_per_subject(js: JetStreamContext, stream: str, subjects: str) -> list[Msg]:
    """The last message of every subject of `stream` matching `subjects`, read exactly: an ephemeral pull
    consumer (last per subject) says at creation how many there are, and exactly that many are read.

    A listing that times out (a request or a fetch unanswered for 5 s: once in ~1,000 listings on a
    healthy 3-node cluster under a full test run's load) is made again with a new consumer, up to
    `LISTING_ATTEMPTS` in all: it is a read, so trying again is safe."""
    for attempt in range(1, LISTING_ATTEMPTS + 1):
        try:
            return await _last_per_subject(js, stream, subjects)
        except nats.errors.TimeoutError as e:
            if attempt == LISTING_ATTEMPTS:
                raise
            log.info("listing %s of %s timed out (%s); listing again", subjects, stream, e)
    raise AssertionError("unreachable")


LISTING_ATTEMPTS = 3


async def _last_per_subject(js: JetStreamContext, stream: str, subjects: str) -> list[Msg]:
    name = "kvls-" + os.urandom(8).hex()
    info = await js.add_consumer(stream, ConsumerConfig(
        name=name, filter_subject=subjects, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1, inactive_threshold=30.0))
    out: list[Msg] = []
    try:
        if info.num_pending:
            await _read_all(js._nc, stream, name, info.num_pending, out)  # nats-py keeps nc on the context
    finally:
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, name)
    return out


async def _read_all(nc: NATS, stream: str, consumer: str, count: int, out: list[Msg]) -> None:
    """Read what a new listing consumer holds (`count` messages, or fewer if some went meanwhile) into `out`:
    pull requests for all of it, the messages taken by a callback on one inbox, the end known from the
    last message's own pending count (in its reply subject).

    Why not nats-py's `fetch`: it waits for each message in a task of its own and parses every message's
    metadata into dataclasses: ~33 us of CPU per listed key. A host's look for orphans lists its
    partitions' ``active`` keys every 15 s, purge markers included (they live `ACTIVE_PURGE_TTL_S`), so
    at a sustained 170 runs/s that was ~5 % of the host's CPU (measured with py-spy). This is ~4x less.

    A pull request answered 503 (no responders: the consumer was just created, perhaps on another node of
    a cluster, and the client's node has not learnt yet where it takes its requests; about 1 read in 100
    on a healthy cluster, tests/nats/test_kv_cluster_read.py) is made again every 25 ms, for a second at
    most (then `ServiceUnavailableError`). A request lives `PULL_EXPIRES_S`: one that expires while its
    messages still came (a big listing on a slow server) is followed by another for the rest; one that
    brought nothing, or a server silent for a second longer, ends in nats-py's `TimeoutError`, which
    `last_per_subject` answers by listing again."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[str] = loop.create_future()
    inbox = nc.new_inbox()

    async def on_msg(msg: Msg) -> None:  # per message: the least work possible
        if ended.done():
            return
        status = delivery_status(msg)
        if status is not None:
            ended.set_result(status)
            return
        out.append(msg)
        if len(out) >= count or _pending(msg.reply) == 0:
            ended.set_result("")

    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        unanswered = 0
        while True:
            asked = len(out)
            request = json.dumps({"batch": max(count - asked, 1), "expires": int(PULL_EXPIRES_S * 1e9)})
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", request.encode(), reply=inbox)
            try:
                status = await asyncio.wait_for(ended, PULL_EXPIRES_S + 1.0)
            except TimeoutError:
                raise nats.errors.TimeoutError from None
            if status == "":
                return
            ended = loop.create_future()
            if status == "503":
                unanswered += 1
                if unanswered > UNAVAILABLE_RETRIES:
                    raise ServiceUnavailableError(code=503, description=f"no server took the pull requests "
                                                  f"of {consumer} on {stream} for a second")
                await asyncio.sleep(0.025)
                continue
            if status == "408" and len(out) > asked:  # expired while its messages still came: the rest
                continue
            log.info("listing %s of %s: the pull request ended with status %s after %d of %d",
                     consumer, stream, status, len(out), count)
            raise nats.errors.TimeoutError  # 408 with nothing new, 404, 409: no end in sight, list again
    finally:
        await sub.unsubscribe()


def _pending(reply: str | None) -> int:
    """The consumer's pending count a JetStream delivery carries in its reply subject (either layout:
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``, or with domain and account
    hash after ``$JS.ACK`` and a random token at the end); -1 if it has none."""
    tokens = (reply or "").split(".")
    if len(tokens) == 9:
        return int(tokens[8])
    if len(tokens) >= 11:
        return int(tokens[10])
    return -1


PULL_EXPIRES_S = 5.0  # a listing's pull request: what a fetch of it waited before


COMPLETE_RETRIES = 20  # x COMPLETE_RETRY_S: how long a complete listing waits for a lagging replica
COMPLETE_RETRY_S = 0.25


class IncompleteListing(RuntimeError):
    """A `kv_entries(..., complete=True)` listing still lacked keys the stream leader has."""


UNAVAILABLE_RETRIES = 40  # x 25 ms: the route interest of a new consumer arrives within milliseconds


async def _kv(js: JetStreamContext, config: KeyValueConfig, *, atomic: bool = False) -> KeyValue:
    """The bucket, created on first use as nats-py's `create_key_value` would, except for `max_consumers`:
    nats-py leaves it at -1, which server 2.15 caps at 1,000, and every `watch`/`history` leaves an
    ordered consumer behind for its inactive threshold (5 min): a busy workspace bucket hit the cap in
    the fault-injection soak (1,500 jobs, each listing the workspace)."""
    try:
        return await js.key_value(config.bucket)
    except BucketNotFoundError:
        pass
    stream = StreamConfig(
        name=f"KV_{config.bucket}", subjects=[f"$KV.{config.bucket}.>"], allow_direct=config.direct,
        allow_rollup_hdrs=True, allow_msg_ttl=True, deny_delete=True, discard=DiscardPolicy.NEW,
        duplicate_window=min(120.0, config.ttl) if config.ttl else 120.0, max_age=config.ttl,
        max_msgs=-1, max_msgs_per_subject=config.history, num_replicas=config.replicas,
        storage=config.storage, max_consumers=KV_MAX_CONSUMERS, allow_atomic=atomic or None)
    try:
        await placing(lambda: js.add_stream(stream), what=f"creating bucket {config.bucket}")
    except nats.js.errors.BadRequestError as e:
        if e.err_code != _ERR_STREAM_NAME_EXISTS:  # not a race with another creator: say what NATS said
            raise
    # on a cluster, the server answering the bucket's info may not know a stream created a moment ago
    # (seen: "stream not found" right after the create on a fresh 3-node cluster): wait for it, briefly
    return await retrying(lambda: js.key_value(config.bucket), what=f"opening bucket {config.bucket}",
                          retry_on=BucketNotFoundError, delay=0.1, give_up=CREATED_VISIBLE_S,
                          level=logging.DEBUG)


async def payloads_store(js: JetStreamContext, *, replicas: int = 1) -> ObjectStore:
    """The object store for payloads too big for an event (created on first use, with the default age
    bound: `runtime.nats.retention`, which also applies configured bounds to it)."""
    try:
        return await js.object_store(PAYLOADS_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_object_store(PAYLOADS_BUCKET, ObjectStoreConfig(
            replicas=replicas, storage=StorageType.FILE, ttl=DEFAULT_PAYLOADS_MAX_AGE_S or None,
            max_bytes=DEFAULT_PAYLOADS_MAX_BYTES or -1))


__all__ = ["KV_MAX_CONSUMERS", "IncompleteListing", "KvEntry", "allow_atomic_writes", "applied_kv",
           "fleet_kv", "kv_entries", "kv_operation", "last_per_subject", "latest", "payloads_store", "put_kv",
           "runs_kv", "workspace_kv"]
