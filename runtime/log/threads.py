"""Threads: conversations that continue across runs, each run reading the one before it from the log.

    threads = Threads(js); await threads.open()
    previous = await threads.latest(actor, "support-42")        # the thread's latest run, or None
    conv = await conversation(log, config, previous, upto=seq)  # what that run's conversation ended as
    state = kernel.fold(config, events, conv)                   # a run of the thread, folded

A task may name a thread. Its run's `run.started` then says which run it continues and up to which `seq`
(`previous_run`, `previous_seq`): a reference, never a copy. The messages that run ended with are folded
from its own events, and those of the run before it the same way, so a thread's storage grows with its new
messages only, however long it gets (a model request records only what was added, and the earlier
messages count as recorded: `runtime.kernel`). Every read goes through the run log (`runtime.log`).

Runs of one thread are serialised by construction: a thread belongs to one actor, and an actor works on
one task at a time, so the previous run has ended when the next one starts.

The `threads` bucket maps an actor and a thread to its runs in order: how a host finds a thread's latest
run without scanning EVENTS, and what `sa threads` lists. It is an index; the log stays the truth.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from runtime import events as ev
from runtime import history, kernel
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries, put_kv
from runtime.nats.records import ThreadRecord
from runtime.nats.subjects import THREADS_BUCKET

CACHE_SIZE = 1024  # conversations a host keeps at hand: the latest of each thread it served recently
CACHE_BYTES = 64 * 1024 * 1024  # and at most this much of them (their messages as msgpack)


def thread_key(actor: str, thread: str) -> str:
    """The `threads` bucket key of one actor's thread: hashed, because a thread name is free text and a
    key allows only a few characters."""
    return "t" + hashlib.blake2b(f"{actor}\x00{thread}".encode(), digest_size=12).hexdigest()


class Conversations:
    """The conversations runs ended with, by (run id, seq): a host remembers the one each run it drove
    ended with, so the thread's next run does not read the logs back.

    Bounded by count (`size`) and by bytes (`max_bytes`: each entry weighs its messages as msgpack, so
    entries of one thread that share messages are counted more than once: an upper estimate); the least
    recently used go first. A count alone would let idle threads with long conversations hold a host's
    memory (1,024 of them at 500 KB each is 500 MB); a forgotten conversation is read back from the log."""

    def __init__(self, size: int = CACHE_SIZE, max_bytes: int = CACHE_BYTES) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0  # what the entries held now weigh
        self._items: OrderedDict[str, tuple[kernel.Conversation, int]] = OrderedDict()  # run id -> latest

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, run_id: str) -> bool:
        """Whether a conversation of `run_id` is held (without making it recently used)."""
        return run_id in self._items

    def get(self, run_id: str, seq: int | None = None) -> kernel.Conversation | None:
        """The conversation of `run_id` after its events below `seq` (None: the one it ended with)."""
        held = self._items.get(run_id)
        if held is None or (seq is not None and held[0].seq != seq):
            return None
        self._items.move_to_end(run_id)
        return held[0]

    def put(self, conv: kernel.Conversation) -> None:
        """Remember `conv` (a later one of the same run replaces an earlier one)."""
        known = self._items.get(conv.run_id)
        if known is None or known[0].seq <= conv.seq:
            weight = len(_messages_encoder.encode(conv.messages))
            self.bytes += weight - (known[1] if known is not None else 0)
            self._items[conv.run_id] = (conv, weight)
        self._items.move_to_end(conv.run_id)
        while self._items and (len(self._items) > self.size or self.bytes > self.max_bytes):
            _, (_, weight) = self._items.popitem(last=False)
            self.bytes -= weight

    def remember(self, state: kernel.State) -> kernel.Conversation:
        """The conversation the run of `state` ended with (all its events), remembered."""
        conv = ended_with(state)
        self.put(conv)
        return conv


_messages_encoder = msgspec.msgpack.Encoder()


def ended_with(state: kernel.State) -> kernel.Conversation:
    """What the next run of a thread continues from, given its previous run's final state."""
    return kernel.Conversation(state.run_id, state.seq, history.continued(state.messages))


async def conversation(run_log: RunLog, config: kernel.KernelConfig, run_id: str, upto: int | None = None,
                       *, cache: Conversations | None = None) -> kernel.Conversation:
    """The conversation run `run_id` had after its events with seq below `upto` (None: all of them):
    read from its log, and from the logs of the runs of its thread before it (back to the first, or to
    one `cache` holds), then folded forward with `config`. `LookupError` if a run it needs has no events."""
    chain: list[tuple[list[ev.Event], int]] = []  # newest first: (events below `upto`, upto)
    base: kernel.Conversation | None = None
    at: tuple[str, int | None] | None = (run_id, upto)
    while at is not None:
        base = cache.get(*at) if cache is not None else None
        if base is not None:
            break
        read = await run_log.read(at[0])
        limit = at[1] if at[1] is not None else (read.events[-1].seq + 1 if read.events else 0)
        events = [e for e in read.events if e.seq < limit]
        if not events or not isinstance(events[0], ev.RunStarted):
            raise LookupError(f"run {at[0]} of the thread has no events: its conversation cannot be read")
        chain.append((events, limit))
        started = events[0]
        at = (started.previous_run, started.previous_seq or 0) if started.previous_run else None
    for events, _upto in reversed(chain):
        state = kernel.fold(config, events, base)
        base = kernel.Conversation(state.run_id, _upto, history.continued(state.messages))
        if cache is not None:
            cache.put(base)
    assert base is not None
    return base


async def conversation_for(run_log: RunLog, config: kernel.KernelConfig, events: Sequence[ev.Event], *,
                           cache: Conversations | None = None) -> kernel.Conversation | None:
    """The conversation a run's log continues (its `run.started` names it), or None for a run that is
    in no thread or is its thread's first: what `kernel.fold`, `sa replay --verify` and recovery need."""
    started = events[0] if events else None
    if not isinstance(started, ev.RunStarted) or started.previous_run is None:
        return None
    return await conversation(run_log, config, started.previous_run, started.previous_seq or 0, cache=cache)


async def fold_run(run_log: RunLog, config: kernel.KernelConfig, events: Sequence[ev.Event], *,
                   cache: Conversations | None = None) -> kernel.State:
    """A run's state from its events, with the conversation it continues when it is in a thread."""
    conv = await conversation_for(run_log, config, events, cache=cache)
    return kernel.fold(config, events, conv)


class Threads:
    """The `threads` bucket: each actor's threads and their runs in order."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.kv: KeyValue | None = None

    async def open(self) -> KeyValue:
        if self.kv is None:
            self.kv = await fleet_kv(self.js, THREADS_BUCKET)
        return self.kv

    async def get(self, actor: str, thread: str) -> tuple[ThreadRecord | None, int]:
        """The thread's record and its revision (0: no record)."""
        kv = await self.open()
        try:
            entry = await kv.get(thread_key(actor, thread))
        except (KeyNotFoundError, NotFoundError):
            return None, 0
        if not entry.value:
            return None, 0
        return ThreadRecord.decode(entry.value), int(entry.revision or 0)

    async def latest(self, actor: str, thread: str) -> str | None:
        """The thread's latest run, or None if the thread has none yet."""
        record, _ = await self.get(actor, thread)
        return record.runs[-1] if record is not None and record.runs else None

    async def add(self, actor: str, thread: str, run_id: str) -> ThreadRecord:
        """Append `run_id` to the thread (a no-op if it is there already: a redelivered task); the write
        compares and sets, so two writers never lose each other's run."""
        while True:
            record, revision = await self.get(actor, thread)
            record = record or ThreadRecord(actor=actor, thread=thread)
            if run_id in record.runs:
                return record
            record = ThreadRecord(actor=actor, thread=thread, runs=[*record.runs, run_id],
                                  updated=time.time())
            try:
                await put_kv(self.js, THREADS_BUCKET, thread_key(actor, thread), record.encode(),
                             last=revision)
            except KeyWrongLastSequenceError:
                continue
            return record

    async def all(self, agent: str | None = None) -> list[ThreadRecord]:
        """Every thread (of `agent`: the bundle and its instances, or one `bundle:instance`), most
        recently used first."""
        entries = await kv_entries(await self.open())
        records = [ThreadRecord.decode(e.value) for e in entries.values() if e.value]
        if agent is not None:
            records = [r for r in records if r.actor == agent or r.actor.split(":", 1)[0] == agent]
        return sorted(records, key=lambda r: r.updated, reverse=True)


__all__ = ["Conversations", "Threads", "conversation", "conversation_for", "ended_with",
           "fold_run", "thread_key"]
