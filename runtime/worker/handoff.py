"""A job for a tool version this worker does not have: hand it to a worker that has it, or fail it naming
the version that is missing.

A job names the exact version of its tool (`ToolJob.tool_digest` and its actor's bundle: a `ToolVersion`,
`runtime.worker.registry`), and a worker never runs another version in its place. But every worker binds
the one ``workers`` consumer on TOOLS, whose jobs are published to ``tools.<tool>``: a job for bundle A's
`add` may be delivered to a worker that serves only bundle B's `add`, or no `add` at all. That worker
decides here (`decide`), by what the live workers advertise in their `WorkerBeat`s (the versions each
serves, in the ``workers`` bucket, read only when a job needs it and then at most once per `FLEET_READ_S`):

1. no other live worker serves the version: the job fails now, an `input` error value the run's model
   reads: "tool add version 1a2b3c4d5e6f7a8b (bundle A) is not served by any worker: start a worker with
   that bundle" (plus the versions this worker does have, which is how a stale bundle copy shows);
2. others do: the worker hands them the delivery itself (`offer`): it sends the delivery's ack subject to
   one of them at a time on ``handoffs.<worker key>`` (core NATS), and the first with room that serves the
   version (`Offers`, which reads the job from TOOLS by its sequence rather than trusting the offer) takes
   it: from then on that worker heartbeats, runs, acks or naks the same delivery, exactly as if the server
   had delivered it there. A delivery handed over is not a new delivery: MaxDeliver is not used up. An
   answer that comes later than `OFFER_TIMEOUT_S` (or is lost) leaves the job taken there and given back
   here: it may then run twice, which the job protocol absorbs as any redelivery (`runtime.worker.loop`);
3. none of them takes it (all busy, or gone since their last beat), or the beats cannot be read: the job
   goes back to the stream (`nak`) for `handoff_delay` seconds, recorded as a hand-off so its next delivery
   explains it (`runtime.worker.attempts`), and whoever gets it next decides again; at its last delivery
   (MaxDeliver) it fails instead, naming the version and the workers that serve it.

A job whose every earlier delivery ended in such a nak never ran, so at its last delivery it is not taken
for a poison job: a worker that has the version runs it (`runtime.worker.loop`).

Why a hand-over and not a nak alone: which worker gets a redelivered job is the server's choice, and a
batch pull request still open on the worker that gave the job back takes it again (seen in tests: one job
went back to the same worker four times, until its deliveries ran out). Why not route jobs by version:
publishing to ``tools.<tool>.<digest>`` helps only with a consumer per version, since TOOLS is a WorkQueue
stream, whose consumers may not overlap (no consumer could take exactly the versions one worker serves).
That means a pull subscription per tool version in every worker, AckWait, MaxDeliver advisories and queue
depths per consumer, consumers created by workers (which may not create TOOLS consumers today), and a job
whose version no worker serves would wait in the stream with no worker to tell its run. The hand-over keeps
the subjects, the one consumer and its fault handling as they are, costs nothing when every worker serves
every version, and otherwise one round trip to the worker that has the version; and the worker that lacks
a version is the one that says which version is missing.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from runtime.jobs import ToolJob, ToolOutcome
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import WorkerBeat
from runtime.nats.subjects import TOOLS, WORKERS_BUCKET, WORKERS_CONSUMER, handoff_subject
from runtime.types import ToolResult
from runtime.worker.registry import ToolRegistry, ToolVersion
from runtime.worker.stats import beat_key

log = logging.getLogger("runtime.worker")

FLEET_READ_S = 1.0  # how long a worker trusts what it read of the other workers' beats
OFFER_TIMEOUT_S = 2.0  # how long an offer waits for the other worker's answer
TAKEN, BUSY, LACKS, REFUSED = b"taken", b"busy", b"lacks", b"refused"  # the answers to an offer


def handoff_delay(attempt: int) -> float:
    """How long a job no worker took waits in the stream before its next delivery: 0.5, 2, 8, 10 s, so
    the workers that serve its version have time to make room."""
    return min(10.0, 0.5 * 4.0 ** (attempt - 1))


@dataclass(frozen=True)
class HandOff:
    """Hand the delivery to one of `targets` (the live workers that serve the version, in the order to
    try); if none takes it, `last` is the job's outcome (its last delivery), else it goes back to the
    stream for `delay` seconds. `reason` names the version and who serves it."""

    targets: tuple[str, ...]
    delay: float
    reason: str
    last: ToolOutcome | None = None


class Fleet:
    """What the other live workers serve, from their `WorkerBeat`s (a beat lives `3 x BEAT_S`; a worker that
    stops removes its own)."""

    def __init__(self, js: JetStreamContext, worker: str) -> None:
        self.js, self.worker = js, worker
        self._served: dict[str, list[ToolVersion]] = {}  # worker name -> the versions it serves
        self._read_at = -math.inf
        self._lock = anyio.Lock()

    async def serving(self, wanted: ToolVersion) -> list[str] | None:
        """The other live workers that serve `wanted`, by name; None if the beats cannot be read."""
        try:
            served = await self._read()
        except Exception as e:
            log.warning("worker %s: cannot read which workers serve %s: %s", self.worker,
                        wanted.describe(), e)
            return None
        return sorted(name for name, versions in served.items()
                      if name != self.worker and any(v.serves(wanted) for v in versions))

    async def _read(self) -> dict[str, list[ToolVersion]]:
        async with self._lock:  # many jobs handed over at once read the bucket once
            if time.monotonic() - self._read_at >= FLEET_READ_S:
                entries = await kv_entries(await fleet_kv(self.js, WORKERS_BUCKET))
                beats = [WorkerBeat.decode(e.value) for e in entries.values() if e.value]
                self._served = {b.name: [ToolVersion(*v) for v in b.versions]
                                or [ToolVersion(t) for t in b.tools] for b in beats}  # older: by name
                self._read_at = time.monotonic()
            return self._served


async def decide(fleet: Fleet, registry: ToolRegistry, job: ToolJob, *, attempt: int, max_deliver: int,
                 worker: str, done: Callable[[ToolResult], ToolOutcome]) -> HandOff | ToolOutcome:
    """What becomes of a job whose tool version this worker lacks (see the module docstring); `done`
    makes the job's outcome of a result."""
    wanted = ToolVersion.wanted_by(job)
    detail = "missing_version" if wanted.digest else "unknown_tool"
    others = await fleet.serving(wanted)
    if others == []:
        return done(ToolResult.failure("input", _not_served(wanted, registry, worker), detail=detail))
    serving = f"worker(s) {', '.join(others)} serve it" if others else "other workers may serve it"
    last = None
    if 0 < max_deliver <= attempt:
        last = done(ToolResult.failure(
            "input", f"{wanted.describe()} was delivered {attempt} times, never to a worker that had it "
                     f"and room for it: {serving} but did not take it (busy, or cut off from NATS?); start "
                     "more workers with that bundle", detail=detail))
    targets = list(others or ())
    random.shuffle(targets)  # spread the jobs a worker cannot run over those that can
    return HandOff(tuple(targets), handoff_delay(attempt), f"it lacks {wanted.describe()}; {serving}", last)


def _not_served(wanted: ToolVersion, registry: ToolRegistry, worker: str) -> str:
    """The error for a version no live worker serves, with the versions of that tool this worker has."""
    if not wanted.digest:  # a job naming no version: no tool of that name anywhere
        known = ", ".join(sorted(registry.tools)) or "none"
        return (f"no tool named {wanted.name!r} is loaded on worker {worker} (it has: {known}), nor on any "
                "other live worker")
    text = f"{wanted.describe()} is not served by any worker: start a worker with that bundle"
    here = [s.version for s in registry.served() if s.tool.name == wanted.name]
    if here:
        text += f" (worker {worker} has {'; '.join(v.describe() for v in here)})"
    return text


# ---------------------------------------------------------------------------------------------------------
# handing a delivery over
# ---------------------------------------------------------------------------------------------------------


async def offer(js: JetStreamContext, delivery: Msg, targets: Sequence[str], *, worker: str) -> str | None:
    """Offer `delivery` to each of `targets` in turn; the name of the worker that took it (it owns the
    delivery now: this worker must not settle it), or None."""
    nc = js._nc  # nats-py keeps the connection on the context
    for target in targets:
        answer_to = f"{handoff_subject(beat_key(worker))}.{secrets.token_hex(8)}"
        sub = await nc.subscribe(answer_to, max_msgs=1)
        try:
            await nc.publish(handoff_subject(beat_key(target)), delivery.reply.encode(), reply=answer_to)
            answer = await sub.next_msg(timeout=OFFER_TIMEOUT_S)
        except Exception as e:  # no answer in time, or NATS trouble: the next one
            log.debug("worker %s: offer to %s: %s", worker, target, e)
            continue
        finally:
            await _unsubscribe(sub)
        if answer.data == TAKEN:
            return target
        log.debug("worker %s: %s did not take the offer: %s", worker, target,
                  answer.data.decode(errors="replace") or (answer.headers or {}).get("Status", "no answer"))
    return None


async def _unsubscribe(sub: Subscription) -> None:
    try:
        await sub.unsubscribe()
    except Exception as e:  # already gone (its one message arrived)
        log.debug("offer answer subscription: %s", e)


class Offers:
    """The deliveries other workers offer this one: each taken (`accept`) when it is a delivery of the
    ``workers`` consumer, its job is still in TOOLS, this worker has the version it names, and `accept`
    finds room for it (see the module docstring)."""

    def __init__(self, js: JetStreamContext, registry: ToolRegistry, *, worker: str,
                 accept: Callable[[Msg], bool]) -> None:
        self.js, self.registry, self.worker, self.accept = js, registry, worker, accept
        self._sub: Subscription | None = None

    async def open(self) -> None:
        self._sub = await self.js._nc.subscribe(handoff_subject(beat_key(self.worker)), cb=self._on_offer)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await _unsubscribe(sub)

    async def _on_offer(self, request: Msg) -> None:
        try:
            answer = await self._take(request.data.decode(errors="replace"))
        except Exception as e:  # a bug must not end the subscription: the offering worker falls back
            log.warning("worker %s: cannot consider an offered delivery: %s", self.worker, e)
            answer = BUSY
        if request.reply:
            try:
                await self.js._nc.publish(request.reply, answer)
            except Exception as e:  # the offering worker times out and falls back
                log.debug("worker %s: cannot answer an offer: %s", self.worker, e)

    async def _take(self, ack_subject: str) -> bytes:
        nc = self.js._nc
        probe = Msg(nc, reply=ack_subject)
        try:
            md = probe.metadata
        except Exception:  # not a JetStream delivery
            return REFUSED
        if (md.stream, md.consumer) != (TOOLS, WORKERS_CONSUMER):
            return REFUSED
        try:  # the job as stored, not as offered: an offer can only bring work that is in TOOLS
            raw = await self.js.get_msg(TOOLS, md.sequence.stream)
            job = ToolJob.decode(raw.data or b"")
        except Exception as e:  # gone (settled meanwhile) or NATS trouble
            log.debug("worker %s: offered delivery %s: %s", self.worker, ack_subject, e)
            return REFUSED
        if self.registry.find(job) is None:
            return LACKS
        delivery = Msg(nc, subject=raw.subject or "", reply=ack_subject, data=raw.data or b"",
                       headers=raw.headers)
        if not self.accept(delivery):
            return BUSY
        try:
            await delivery.in_progress()  # the offering worker stops heartbeating it: restart AckWait now
        except Exception as e:  # the regular heartbeat follows within a period
            log.debug("worker %s: in_progress on a taken delivery: %s", self.worker, e)
        log.info("worker %s: took %s (delivery %d) from another worker", self.worker, job.msg_id,
                 md.num_delivered)
        return TAKEN
