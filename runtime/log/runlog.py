"""The run log: the one way anything reads or writes a run's events.

    log = RunLog(js)
    seq = await log.create(started)                   # the first event; None if the run already exists
    seq = await log.append(event, expect=seq)         # one more, as the run's single writer
    history = await log.read(run_id)                  # every event back, big payloads resolved
    async for event in log.follow(run_id): ...        # live, from the first event to the last
    tail = await log.tail("sa-otel")                  # every run's events, acked as handled (durable)
    sub = await log.watch_cancels(on_cancelled)       # every run cancelled from now on (tool workers)
    copy = await log.copy_prefix(run_id, 8, "r-new")  # a new run whose log is the first 8 events
    raw = await log.stored(run_id)                    # every message as stored, undecoded (an audit)
    sizes = await log.sizes()                         # messages per (actor, run), from one stream info
    purged = await log.purge([run_id])                # a finished run deleted: events, payloads, index

Where the events live: the JetStream stream EVENTS, one subject per event,
`events.<actor>.<run>.<kind>`, msgpack (`runtime.events`). A run's `seq` is its own, 0-based and
contiguous; the stream sequence of its last event is what the next append expects.

Single writer. Every append carries `Nats-Expected-Last-Subject-Sequence` for the run's subjects and
`Nats-Msg-Id = <run>/<seq>[/<writer>]` (`event_msg_id`). If another writer appended in between, the
stream refuses with "wrong last sequence" and the append raises `Superseded`: the loser stops, the log
never forks. A retried append
whose first attempt did land (the ack was lost) is recognised by its Msg-Id being the run's last, and
counts as done.

What is retried and what is not. A NATS outage (timeouts, no responders during a leader election, a
reconnect) is retried with the same Msg-Id and expectation, so a retry cannot write twice. An event the
stream can never accept (over the server's message size even after offloading, or refused outright) is
`LogRejected` at once: retrying it would wedge the run's actor forever, so the writer records why the
run cannot go on instead (`runtime.host.driver`).

Big payloads. An event whose encoding is over the payload threshold (`runtime.log.payloads`, 256 KiB by
default, always below the server's max_payload) has its big fields stored in the object store and the
log keeps a stub with a `PayloadRef` (`events.externalize`). `read` gives whole events back (digest-checked);
`follow` yields events as stored unless asked to resolve, because a live view wants to be fast and a
stub still says what happened. Objects are named per run and content-addressed within it
(`runtime.log.payloads`), so a retried offload is a lookup and a purged run takes exactly its own objects.

Reading every run (`tail`): a durable pull consumer on all of EVENTS, for a reader that derives something
from the log and must neither miss an event nor lose its place (the trace exporter): it acks what it has
handled, resumes after a crash where it stopped, and several processes sharing one durable split the
events between them. It never writes.

Reading uses an ordered push consumer in callback mode on the run's subjects (about 2.5x faster than
fetching), bounded by the run's last stream sequence taken first with a direct get, so a read is a
consistent snapshot even while the run is being appended to. A run id is found without knowing its
actor: `events.*.<run>.>`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from runtime import events as ev
from runtime.log.payloads import Payloads
from runtime.log.purge import Purged, purge_runs
from runtime.log.rebase import rebased
from runtime.log.tail import Tail, Tailed
from runtime.nats import subjects as names
from runtime.nats.connection import refused_publish
from runtime.nats.retry import retrying

log = logging.getLogger("runtime.log")

APPEND_RETRY_S = 0.25
TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled"})
CANCELLED_FILTER = "events.*.*.run.cancelled"  # the `run.cancelled` event of every run


class Superseded(RuntimeError):
    """Another writer appended to this run first: it owns the run now, and this writer must stop."""


class LogRejected(RuntimeError):
    """The stream will never accept this event (too large even as a stub, or refused outright):
    retrying cannot help, so the run must end with the reason instead."""


@dataclass(frozen=True)
class Stored:
    """One message of a run as the stream holds it: its stream sequence, subject, bytes, writer (the
    `Sa-Writer` header: the host that appended it; "" when written by another process) and Msg-Id."""

    stream_seq: int
    subject: str
    data: bytes
    writer: str = ""
    msg_id: str = ""


@dataclass
class RunHistory:
    """A run's events in order, the stream sequence of each, and the actor whose subjects hold them."""

    run_id: str
    actor: str = ""
    events: list[ev.Event] = field(default_factory=list)
    stream_seqs: list[int] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The stream sequence of the run's last event (0: empty): what the next append expects."""
        return self.stream_seqs[-1] if self.stream_seqs else 0


def event_msg_id(event: ev.Event, writer: str = "") -> str:
    """An event's `Nats-Msg-Id`: `<run>/<seq>`, then `/<writer>` when the writer has an id (a host), and
    `/taken` for a fence (`events.RunTaken`).

    A retry of one event by its writer is the same message, which JetStream drops within its dedup
    window. Two writers' events with the same seq must not be: the stream would answer the stale one as
    a duplicate of the other, with the other's stream sequence, as if it were stored; its writer would
    then expect the run's true last sequence and its next append would land (a fence bypassed)."""
    msg_id = f"{event.run_id}/{event.seq}"
    if writer:
        msg_id += f"/{writer}"
    if isinstance(event, ev.RunTaken):
        msg_id += "/taken"
    return msg_id


def group_msg_id(events: Sequence[ev.Event], writer: str = "") -> str:
    """A group's `Nats-Msg-Id` (`RunLog.append_group`): `<run>/<first seq>-<last seq>`, then `/<writer>`, for
    the reasons `event_msg_id` gives. A group never holds a fence (`run.taken` is appended alone)."""
    msg_id = f"{events[0].run_id}/{events[0].seq}-{events[-1].seq}"
    return f"{msg_id}/{writer}" if writer else msg_id


def run_filter(run_id: str, actor: str | None = None) -> str:
    """The subjects of one run's events (any actor when `actor` is not known)."""
    if actor:
        return names.run_events_filter(actor, run_id)
    return f"events.*.{names.check_token(run_id, 'run id')}.>"


class RunLog:
    """The EVENTS stream seen as runs. Cheap to make; the object store is opened on first big payload."""

    def __init__(self, js: JetStreamContext, *, payloads: Payloads | None = None, writer: str = "",
                 stream: str = names.EVENTS) -> None:
        self.js = js
        self._payloads = payloads
        self.writer = writer  # stored with each event appended (`Sa-Writer`): a host's id
        self.stream = stream  # what reads read: EVENTS, or a mirror of it (`runtime.log.backup`)

    @property
    def payloads(self) -> Payloads:
        if self._payloads is None:
            self._payloads = Payloads(self.js)
        return self._payloads

    # -- writing ---------------------------------------------------------------------------------------

    async def create(self, started: ev.RunStarted) -> int | None:
        """Append a run's first event only if the run has none yet; its stream sequence, or None if the
        run exists already (a redelivered or re-sent task finds its run instead of starting another)."""
        return await self._publish(started, 0, creating=True)

    async def append(self, event: ev.Event, *, expect: int) -> int:
        """Append a stamped `event` expecting `expect` as the run's last stream sequence; return the
        event's own. Raises `Superseded` (another writer got there first) or `LogRejected`."""
        seq = await self._publish(event, expect, creating=False)
        assert seq is not None
        return seq

    async def append_group(self, events: Sequence[ev.Event], *, expect: int) -> int | None:
        """Append stamped `events` of one run, in order, as ONE message expecting `expect` as the run's last
        stream sequence (`events.encode_group`): one round trip and one disk sync for all of them, stored
        or refused as a whole. Returns the message's stream sequence (every event of the group has it), or
        None when together they are over the payload threshold: append them one by one then. Raises
        `Superseded` or `LogRejected` as `append` does (nothing of the group is stored then)."""
        if len(events) == 1:
            return await self.append(events[0], expect=expect)
        ev.check_group(events)
        first, last = events[0], events[-1]
        encoded = [await self._encoded(event) for event in events]
        if sum(len(data) for data in encoded) > self.payloads.threshold:
            return None
        what = f"events {first.seq}-{last.seq} ({', '.join(ev.kind_of(e) for e in events)})"
        return await self._store(last, ev.encode_group(encoded), group_msg_id(events, self.writer), expect,
                                 what=what, creating=False)

    async def _publish(self, event: ev.Event, expect: int, *, creating: bool) -> int | None:
        ev.check_stamped(event)
        return await self._store(event, await self._encoded(event), event_msg_id(event, self.writer), expect,
                                 what=f"{ev.kind_of(event)} seq {event.seq}", creating=creating)

    async def _store(self, event: ev.Event, data: bytes, msg_id: str, expect: int, *, what: str,
                     creating: bool) -> int | None:
        """Store one message of `event`'s run (`event` alone, or the last of a group: its kind names the
        subject, so a reader of run endings by subject sees a group that ends the run)."""
        subject = names.event_subject(event.actor, event.run_id, ev.kind_of(event))
        headers = names.occ_headers(event.actor, event.run_id, expect, msg_id, self.writer)
        while True:
            try:
                ack = await self.js.publish(subject, data, headers=headers)
            except BadRequestError as e:
                if e.err_code not in names.WRONG_LAST_SEQUENCE:
                    raise LogRejected(f"the EVENTS stream refused {what} of run {event.run_id}: "
                                      f"{e.description or e}") from None
                if creating:
                    return None  # the run exists (perhaps from our own attempt whose ack was lost)
                # asked of the leader, which a cluster may be electing right now (503): a read, retried
                landed = await retrying(lambda: self.last(event.run_id, event.actor),
                                        what=f"run {event.run_id}: reading its last event",
                                        delay=APPEND_RETRY_S, logger=log)
                if landed is not None and landed[1] == msg_id:
                    return landed[0]  # our own earlier attempt landed; its ack was lost
                raise Superseded(f"run {event.run_id}: another writer appended first (this one expected "
                                 f"the run's last stream sequence to be {expect})") from None
            except MaxPayloadError as e:
                raise LogRejected(f"{what} of run {event.run_id} is "
                                  f"{len(data):,} bytes even with its big fields in the object store, over "
                                  f"what the server accepts in one message ({e})") from None
            except Exception as e:  # timeouts, no responders during an election, reconnects
                refused = refused_publish(subject)
                if refused is not None:  # not an outage: this user may not write events, ever
                    raise LogRejected(f"NATS refused to store {what} of run "
                                      f"{event.run_id}: {refused} (writing events takes the host or admin "
                                      "role)") from None
                log.warning("run %s: append of %s failed (%s: %s); retrying", event.run_id, what,
                            type(e).__name__, e)
                await anyio.sleep(APPEND_RETRY_S)
                continue
            return None if creating and ack.duplicate else ack.seq

    async def _encoded(self, event: ev.Event) -> bytes:
        """The message for `event`: itself, or a stub over the payload threshold (the event is stored)."""
        data = ev.encode(event)
        if not self.payloads.is_big(data) or not ev.can_offload(event) or event.ref is not None:
            return data
        ref = await self.payloads.put_bytes(ev.payload_bytes(event), run=event.run_id)
        return ev.encode(ev.externalize(event, ref))

    async def last(self, run_id: str, actor: str | None = None) -> tuple[int, str] | None:
        """The stream sequence and Msg-Id of the run's last event, or None if it has none.

        Asked of the stream's leader, not as a direct get (which any replica answers): a replica that was
        cut off and is catching up answers with an older last event, and a host folding a run from it
        re-made a model call the log had already recorded (`bench/partitions.py`, a minority cut)."""
        try:
            msg = await self.js.get_last_msg(self.stream, run_filter(run_id, actor))
        except NotFoundError:
            return None
        # nats-py types `seq` Optional; a message read from the stream always has one
        return msg.seq, (msg.headers or {}).get(names.HDR_MSG_ID, "")  # type: ignore[return-value]

    # -- reading ---------------------------------------------------------------------------------------

    async def read(self, run_id: str, actor: str | None = None, *, timeout: float = 30.0,
                   resolve: bool = True) -> RunHistory:
        """Every event of `run_id` (an empty history if there is none); `EventDecodeError` on a bad one.

        With `resolve` (the default: folding, replay and verify need the real values) a stub comes back
        as its whole event; without it, events are as stored, refs included."""
        out = RunHistory(run_id, actor or "")
        failed: list[Exception] = []

        def take(msg: Msg, seq: int) -> bool:  # per message: the least work possible
            try:
                for event in ev.decode_all(msg.data):  # a group's events share its stream sequence
                    out.events.append(event)
                    out.stream_seqs.append(seq)
                return True
            except Exception as e:  # raised to the caller below, not into nats-py's callback loop
                failed.append(e)
                return False

        last = await self._scan(run_filter(run_id, actor), take, timeout)
        if last is None:
            return out
        out.actor = actor or (last.subject or "").split(".")[1]
        if failed:
            raise failed[0]
        if resolve and any(e.ref is not None for e in out.events):
            out.events = [await self.resolve(e) for e in out.events]
        return out

    async def stored(self, run_id: str, actor: str | None = None, *, timeout: float = 30.0) -> list[Stored]:
        """Every message of `run_id` as the stream holds it, undecoded, in stream order: what an audit
        checks (`runtime.client.audit`), where `read` would stop at the first event it cannot decode."""
        out: list[Stored] = []

        def take(msg: Msg, seq: int) -> bool:
            headers = msg.headers or {}
            out.append(Stored(seq, msg.subject, msg.data, headers.get(names.HDR_WRITER, ""),
                              headers.get(names.HDR_MSG_ID, "")))
            return True

        await self._scan(run_filter(run_id, actor), take, timeout)
        return out

    async def _scan(self, flt: str, take: Callable[[Msg, int], bool], timeout: float) -> Any:
        """Hand every message of `flt` up to its last one now to `take(msg, stream seq)`, in order, until it
        returns False: a consistent snapshot, even while the run is appended to. Returns that last message
        (None: there is none). The end is asked of the leader (see `last`); the ordered consumer, in
        callback mode, then waits for it on any replica."""
        try:
            last = await self.js.get_last_msg(self.stream, flt)
        except NotFoundError:
            return None
        end: int = last.seq  # type: ignore[assignment]  # a message read from the stream has a seq
        done = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            seq = _stream_seq(msg)
            if seq <= end and not take(msg, seq):
                seq = end
            if seq >= end and not done.done():
                done.set_result(None)

        sub = await self.js.subscribe(flt, stream=self.stream, ordered_consumer=True, cb=on_msg,
                                      deliver_policy=DeliverPolicy.ALL)
        try:
            await asyncio.wait_for(done, timeout)
        finally:
            await sub.unsubscribe()
        return last

    async def runs(self, actor: str | None = None) -> list[tuple[str, str]]:
        """(actor, run id) of every run with an event in the stream (of `actor` only, if given)."""
        return sorted(await self.sizes(actor))

    async def sizes(self, actor: str | None = None) -> dict[tuple[str, str], int]:
        """Messages the stream holds per (actor, run id) (of `actor` only, if given), from its per-subject
        counts: one request, no message read (a scheduled audit's `runtime.client.audit.Memo`)."""
        flt = f"events.{names.check_token(actor, 'agent')}.>" if actor else "events.>"
        info = await self.js.stream_info(self.stream, subjects_filter=flt)
        found: dict[tuple[str, str], int] = {}
        for subject, count in (info.state.subjects or {}).items():
            parts = subject.split(".", 3)
            if len(parts) == 4:
                key = (parts[1], parts[2])
                found[key] = found.get(key, 0) + count
        return found

    async def started(self, run_id: str, actor: str) -> ev.RunStarted | None:
        """The run's `run.started` alone, in one direct get (None for a fork or a run not started): what a
        tool worker needs to know of the task (its metadata), without reading the whole run."""
        subject = names.event_subject(actor, run_id, "run.started")
        try:
            msg = await self.js.get_last_msg(self.stream, subject)
        except NotFoundError:
            return None
        event = await self.resolve(ev.decode_all(msg.data or b"")[0])
        return event if isinstance(event, ev.RunStarted) else None

    async def resolve(self, event: ev.Event) -> ev.Event:
        """The whole event for a stub (fetched and digest-checked); any other event as it is."""
        if event.ref is None:
            return event
        return ev.internalize(event, await self.payloads.fetch(event.ref))

    async def follow(self, run_id: str, actor: str | None = None, *,
                     resolve: bool = False) -> AsyncIterator[ev.Event]:
        """Every event of the run from the first, live, ending after its terminal event (`sa send
        --follow`, tests). Works before the run exists: it waits for the first event."""
        send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=100_000)

        async def on_msg(msg: Msg) -> None:
            send.send_nowait(msg.data)

        sub = await self.js.subscribe(run_filter(run_id, actor), stream=self.stream, ordered_consumer=True,
                                      cb=on_msg, deliver_policy=DeliverPolicy.ALL)
        try:
            async with receive:
                async for data in receive:
                    for event in ev.decode_all(data):
                        yield await self.resolve(event) if resolve else event
                        if ev.kind_of(event) in TERMINAL_KINDS:
                            return
        finally:
            await sub.unsubscribe()
            send.close()

    async def tail(self, durable: str, *, ack_wait: float = 30.0, max_pending: int = 1024) -> Tail:
        """Every run's events through the durable consumer `durable` (made if missing, its AckWait and
        MaxAckPending set to these), from the first event it has not acked (see the module docstring)."""
        names.check_token(durable, "consumer name")
        # `name` too: nats-py then uses the current consumer-create API (the subject a reader's permission
        # names: `$JS.API.CONSUMER.CREATE.EVENTS.>`), not the legacy durable one
        config = ConsumerConfig(name=durable, durable_name=durable, filter_subject="events.>",
                                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                ack_wait=ack_wait, max_ack_pending=max_pending)
        await self.js.add_consumer(names.EVENTS, config)  # an update when it exists (same filter)
        return Tail(await self.js.pull_subscribe_bind(durable=durable, stream=names.EVENTS))

    async def ends(self, durable: str, *, ack_wait: float = 30.0) -> Tail:
        """Every run's end (`run.completed`, `run.failed`, `run.cancelled`) appended after the durable
        consumer `durable` was first made, through it: how the tool workers learn that a sub-run ended,
        to answer its parent's call (`runtime.worker.subruns`), without holding anything while it runs."""
        names.check_token(durable, "consumer name")
        # `name` as well: the create goes to CONSUMER.CREATE.<stream>.<name>, which a worker may use
        ends = [f"events.*.*.{k}" for k in sorted(TERMINAL_KINDS)]
        config = ConsumerConfig(name=durable, durable_name=durable, filter_subjects=ends,
                                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW,
                                ack_wait=ack_wait, max_ack_pending=1024)
        await self.js.add_consumer(names.EVENTS, config)
        return Tail(await self.js.pull_subscribe_bind(durable=durable, stream=names.EVENTS))

    async def watch_cancels(self, on_cancelled: Callable[[ev.RunCancelled], None]) -> Any:
        """Call `on_cancelled` with every `run.cancelled` appended from now on, of any run: how a tool
        worker learns that the job it runs is for a run that ended, to stop its sandbox at once.

        A plain subscription on the events' subjects (`events.*.*.run.cancelled`), not a consumer: an
        append is also delivered to whoever listens on its subject, so this costs the log nothing and
        the hot path nothing. Missed while disconnected, which is harmless: the job then runs to its
        end and its outcome is dropped as that of an ended run. Returns the subscription (unsubscribe
        it when done)."""

        async def on_msg(msg: Msg) -> None:
            try:
                events = ev.decode_all(msg.data)
            except ev.EventDecodeError as e:
                log.warning("ignoring an undecodable event on %s: %s", msg.subject, e)
                return
            for event in events:
                if isinstance(event, ev.RunCancelled):
                    on_cancelled(event)

        return await self.js._nc.subscribe(CANCELLED_FILTER, cb=on_msg)

    # -- deleting --------------------------------------------------------------------------------------

    async def purge(self, run_ids: list[str], *, dry_run: bool = False) -> list[Purged]:
        """Delete each finished run of `run_ids`: its events, its payload objects and its `runs` index
        entry; a run still in flight is skipped with the reason, never touched. With `dry_run`, report
        what would go and delete nothing. One `Purged` per run, in order (`runtime.log.purge`)."""
        return await purge_runs(self.js, self.payloads, list(run_ids), dry_run=dry_run,
                                terminal_kinds=TERMINAL_KINDS)

    # -- copying ---------------------------------------------------------------------------------------

    async def copy_prefix(self, run_id: str, at_seq: int, new_run: str, *,
                          source: RunHistory | None = None) -> RunHistory:
        """Write a new run `new_run` whose log is the first `at_seq` events of `run_id`, every id
        re-derived for the new run (`kernel.rebase_id`): folded, it is exactly the state the source had
        before event `at_seq`, so a host resuming it re-issues only what was pending there and never
        re-calls the model for a recorded reply. The basis of fork. Raises `Superseded` if `new_run`
        exists, ValueError if the prefix is empty or longer than the run."""
        source = source or await self.read(run_id)
        if not 0 < at_seq <= len(source.events):
            raise ValueError(f"run {run_id} has {len(source.events)} event(s): a prefix must keep 1 to "
                             f"{len(source.events)}, not {at_seq}")
        return await self.write_run([ev.stamp(rebased(e, run_id, new_run), seq=e.seq, actor=source.actor)
                                     for e in source.events[:at_seq]])

    async def write_run(self, events: list[ev.Event]) -> RunHistory:
        """Write a whole new run from its stamped events (the first a `run.started`), as its single
        writer; raises `Superseded` if the run exists. How a fork (`runtime.client.fork`) is written."""
        first = events[0] if events else None
        if not isinstance(first, ev.RunStarted):
            raise ValueError("a new run's log starts with its run.started (or run.forked)")
        names.check_token(first.run_id, "run id")
        out = RunHistory(first.run_id, first.actor)
        seq = await self.create(first)
        if seq is None:
            raise Superseded(f"run {first.run_id} exists already: write to a new run id")
        out.stream_seqs.append(seq)
        out.events.append(first)
        for event in events[1:]:
            out.stream_seqs.append(await self.append(event, expect=out.last_seq))
            out.events.append(event)
        return out


def _stream_seq(msg: Msg) -> int:
    """The stream sequence of a JetStream message from its reply subject (`$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>...`, or the longer form with domain and account): `msg.metadata` builds a
    whole metadata object with a timestamp, a quarter of the reader's time per event."""
    tokens = (msg.reply or "").split(".")
    try:
        return int(tokens[5] if len(tokens) == 9 else tokens[Msg.Ack.StreamSeq])
    except (IndexError, ValueError):
        return int(msg.metadata.sequence.stream)


__all__ = ["LogRejected", "Purged", "RunHistory", "RunLog", "Stored", "Superseded", "Tail", "Tailed",
           "event_msg_id", "rebased", "run_filter"]
