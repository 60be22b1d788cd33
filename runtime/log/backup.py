"""A copy of the log kept elsewhere, and a run restored from it.

    await ensure_copy(copy_js)                                  # EVENTS_COPY and RUNS_COPY, mirrors
    await ensure_copy(copy_js, source_domain="hub")             # ... of a JetStream in another domain
    state = await copy_state(copy_js)                           # how far behind the copy is
    restored = await restore_run(copy_js, js, run_id)           # the run's log put back from the copy
    missing = await runs_to_restore(copy_js, js)                # runs the copy holds more of

Why a mirror and not a snapshot: JetStream keeps a mirror up to date by itself, message by message, with the
subjects, headers and order of the source, and a mirror does not follow the source's deletes and purges: a
message the source lost (a purge by sequence, a node that lost unsynced writes, a truncated block) is still in
the copy. A mirror can live in the same cluster (on other nodes: a stream's placement) or in another cluster
or account, reached through a leaf node and a JetStream domain (`source_domain`); what it costs the hot path
is nothing, since the copying is the servers' work. nats-py has no stream snapshot API, so a point-in-time
file backup is `nats stream backup` (the NATS CLI), documented beside this.

What is copied: EVENTS (`COPY_STREAM`) and the ``runs`` index (`INDEX_COPY_STREAM`, the KV bucket's stream).
The big payloads' object store is not: a run restored from the copy whose stubs point at lost objects is
whole to the audit, and `sa replay` says which payload is missing.

Restoring one run (`restore_run`): the run's messages are read from the copy (`RunLog` over the copy stream)
and checked whole there: every seq from 0 on, once (a run restored before is in the copy twice, the same bytes
twice, and the first is kept; two different events with one seq, a fork, are refused). Then the run's subjects
in EVENTS are purged and the copy's messages appended again, in their order, as the run's single writer
(each with `Nats-Expected-Last-Subject-Sequence`, so a host appending to the run at the same time makes the
restore fail instead of interleaving). Each keeps its writer and gets its Msg-Id with `/restored-<token>`
added, a token of this restore: the original Msg-Id (or an earlier restore's) may still be in the stream's
dedup window, which would drop the message as a duplicate of the one that was lost. The restore refuses
(`RestoreRefused`) when the copy holds no event of the run, is not whole itself, or lacks events EVENTS holds
(it is behind): putting it back would lose more than it restores. The run's ``runs`` index entry then names
the restored log's last stream sequence; if the index has no entry for the run, the copy's last value of it
is put back.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ExternalStream, StreamConfig, StreamSource
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from runtime import events as ev
from runtime.log.runlog import RunLog, Stored, run_filter
from runtime.nats import subjects as names
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex

COPY_STREAM = "EVENTS_COPY"
INDEX_COPY_STREAM = "RUNS_COPY"
INDEX_STREAM = f"KV_{names.RUNS_BUCKET}"
KV_OPERATION = "KV-Operation"  # the header of a KV delete or purge marker
RESTORED = "/restored-"  # added to a restored message's Msg-Id, with the restore's own token


class RestoreRefused(RuntimeError):
    """The copy cannot put this run back whole (it has none of it, less of it, or a broken copy)."""


@dataclass(frozen=True)
class CopyState:
    """A copy's state: messages held, the last source sequence it has (a mirror keeps the source's stream
    sequences), and how many of the source's it has not yet (None: not known)."""

    stream: str
    messages: int
    last_seq: int
    lag: int | None
    source: str


@dataclass(frozen=True)
class Restored:
    """One run put back: how many events the copy gave, how many EVENTS held before, and the index entry."""

    run_id: str
    actor: str
    events: int
    had: int
    index_restored: bool


def _source(stream: str, domain: str | None) -> StreamSource:
    external = ExternalStream(api=f"$JS.{domain}.API") if domain else None
    return StreamSource(name=stream, external=external)


async def ensure_copy(copy_js: JetStreamContext, *, source_domain: str | None = None, replicas: int = 1,
                      events_copy: str = COPY_STREAM, index_copy: str = INDEX_COPY_STREAM) -> list[str]:
    """Make the mirrors of EVENTS and of the runs index on `copy_js`'s JetStream (kept as they are if they
    exist); `source_domain`: the JetStream domain of the fleet's servers, when the copy is in another one
    (a leaf node's). Returns the names of the streams made."""
    made = []
    for name, source in ((events_copy, names.EVENTS), (index_copy, INDEX_STREAM)):
        try:
            await copy_js.stream_info(name)
            continue
        except NotFoundError:
            pass
        config = StreamConfig(name=name, mirror=_source(source, source_domain), num_replicas=replicas,
                              description=f"structured-agents: a copy of {source} (runtime.log.backup)")
        await copy_js.add_stream(config)
        made.append(name)
    return made


async def copy_state(copy_js: JetStreamContext, stream: str = COPY_STREAM) -> CopyState:
    """How much the copy holds and how far behind its source it is (the mirror's lag, as the server says)."""
    info = await copy_js.stream_info(stream)
    mirror = info.mirror
    return CopyState(stream, info.state.messages, info.state.last_seq, mirror.lag if mirror else None,
                     mirror.name if mirror else "")


async def runs_to_restore(copy_js: JetStreamContext, js: JetStreamContext, *, actor: str | None = None,
                          stream: str = COPY_STREAM) -> list[tuple[str, str]]:
    """(actor, run id) of every run the copy holds events of that EVENTS does not: what a store that lost
    messages (or a whole stream) needs back. The candidates come from one stream info request on each side
    (the copy holds more messages of the run); each is then read on both sides, since a run restored once
    is in the copy twice (the mirror copied the restore too)."""
    have = await RunLog(js).sizes(actor)
    kept = await RunLog(copy_js, stream=stream).sizes(actor)
    out = []
    for key, n in sorted(kept.items()):
        if n <= have.get(key, 0):
            continue
        copied = await RunLog(copy_js, stream=stream).stored(key[1], key[0])
        held = await RunLog(js).stored(key[1], key[0]) if key in have else []
        if set(_seqs(copied)) - set(_seqs(held)):
            out.append(key)
    return out


async def restore_run(copy_js: JetStreamContext, js: JetStreamContext, run_id: str, *,
                      stream: str = COPY_STREAM, index_stream: str = INDEX_COPY_STREAM) -> Restored:
    """Put run `run_id`'s log back into EVENTS from the copy (see the module docstring); `RestoreRefused` if
    the copy cannot, or if a writer appended to the run while it was put back."""
    kept = _distinct(await RunLog(copy_js, stream=stream).stored(run_id), run_id)
    if not kept:
        raise RestoreRefused(f"the copy ({stream}) holds no event of run {run_id}: nothing to restore")
    actor = kept[0][1].subject.split(".")[1]
    copied = [seq for seqs, _ in kept for seq in seqs]
    if copied != list(range(len(copied))):
        raise RestoreRefused(f"the copy of run {run_id} is not whole either (its seqs are {_span(copied)}): "
                             "restoring it would not make the run whole")
    held = await RunLog(js).stored(run_id, actor)
    extra = set(_seqs(held)) - set(copied)
    if extra:
        raise RestoreRefused(f"{names.EVENTS} holds events of run {run_id} the copy does not (seq "
                             f"{min(extra)} and on): the copy is behind; wait for it, or restore later")
    if held:
        await js.purge_stream(names.EVENTS, subject=run_filter(run_id, actor))
    last, token = 0, secrets.token_hex(4)
    for seqs, message in kept:  # as stored: a group (several events in one message) stays one
        msg_id = f"{message.msg_id or f'{run_id}/{seqs[0]}'}{RESTORED}{token}"
        headers = names.occ_headers(actor, run_id, last, msg_id, message.writer)
        try:
            ack = await js.publish(message.subject, message.data, headers=headers)
        except BadRequestError as e:
            if e.err_code not in names.WRONG_LAST_SEQUENCE:
                raise
            raise RestoreRefused(f"run {run_id}: another writer appended while it was restored (a host "
                                 "driving it): wait for the run to end, then restore again") from None
        last = ack.seq
    index_restored = await _restore_index(copy_js, js, run_id, last, index_stream)
    return Restored(run_id, actor, len(copied), len(_seqs(held)), index_restored)


async def _restore_index(copy_js: JetStreamContext, js: JetStreamContext, run_id: str, last: int,
                         stream: str) -> bool:
    """The run's ``runs`` index entry, its `last_seq` set to the restored log's last stream sequence (what
    the next append expects, and what the inspector's cache is keyed on): the entry the index has, or the
    copy's last value of it put back when the index has none. True if it was put back. A write that finds
    the entry changed meanwhile leaves it: a host wrote a newer one."""
    kv = await runs_kv(js)
    restored = False
    try:
        found = await kv.get(run_id)
        value, revision = found.value, found.revision
    except KeyNotFoundError:  # no entry (or a deleted one): the copy's
        value, revision = await _last_value(copy_js, stream, f"$KV.{names.RUNS_BUCKET}.{run_id}"), None
        restored = value is not None
    if not value:
        return False
    try:
        entry = RunIndex.decode(value)
    except Exception:  # not an entry this version can read: put back as it was
        data = value
    else:
        data = msgspec.structs.replace(entry, last_seq=last).encode()
    try:
        if revision is None:
            await kv.put(run_id, data)
        else:
            await kv.update(run_id, data, last=revision)
    except KeyWrongLastSequenceError:
        pass
    return restored


async def _last_value(js: JetStreamContext, stream: str, subject: str) -> bytes | None:
    """The last value a KV key had in a copy of its bucket: the copy keeps every revision, the delete
    marker of a key deleted from the source among them, so the walk goes over the key's few messages."""
    value, seq = None, 1
    while True:
        try:
            msg = await js.get_msg(stream, seq, subject=subject, next=True)
        except (NotFoundError, BadRequestError):
            return value
        if msg.data and not (msg.headers or {}).get(KV_OPERATION):
            value = msg.data
        seq = (msg.seq or seq) + 1


def _seqs(stored: list[Stored]) -> list[int]:
    """The run seqs of the messages that are events (what is not an event is no part of a restore)."""
    out = []
    for message in stored:
        try:
            out += [event.seq for event in ev.decode_all(message.data)]
        except ev.EventDecodeError:
            continue
    return out


def _distinct(stored: list[Stored], run_id: str) -> list[tuple[tuple[int, ...], Stored]]:
    """The copy's messages of a run, once each, with the seqs of their events (several for a group), in
    stream order: a run restored before is in the copy twice, the same bytes each time (the first kept).
    Refused: a message that is not an event, or two different messages starting at the same seq (a fork the
    source had, which a restore must not pick a side of)."""
    out: dict[int, Stored] = {}
    seqs_of: dict[int, tuple[int, ...]] = {}
    for message in stored:
        try:
            seqs = tuple(event.seq for event in ev.decode_all(message.data))
            seq = seqs[0]
        except ev.EventDecodeError as e:
            raise RestoreRefused(f"the copy of run {run_id} holds a message that is not an event (stream seq "
                                 f"{message.stream_seq}: {e})") from None
        first = out.setdefault(seq, message)
        seqs_of.setdefault(seq, seqs)
        if first.data != message.data:
            raise RestoreRefused(f"the copy of run {run_id} holds two different events with seq {seq} "
                                 f"(stream seqs {first.stream_seq} and {message.stream_seq}): a fork, left "
                                 "to a person")
    kept = [(seqs_of[seq], message) for seq, message in out.items()]
    return sorted(kept, key=lambda item: item[1].stream_seq)


def _span(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs[:12])) + (", ..." if len(seqs) > 12 else "")


__all__ = ["COPY_STREAM", "INDEX_COPY_STREAM", "CopyState", "RestoreRefused", "Restored", "copy_state",
           "ensure_copy", "restore_run", "runs_to_restore"]
