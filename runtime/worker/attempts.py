"""Deliveries of a tool job: heartbeats while a worker holds one, and why an earlier delivery ended.

Heartbeats. A worker holding a job (running it, or waiting to in its prefetch buffer) sends
`msg.in_progress()` every `heartbeat_period(AckWait)` = AckWait / 4 for as long as it holds it, whatever
the tool's max duration: each one restarts the job's AckWait on the server. So the TOOLS ``workers``
consumer's AckWait only has to outlast a few missed heartbeats, not a tool's run time, and a job whose
worker was killed, cut off from NATS or stalled is delivered again AckWait after its last heartbeat
(default `DEFAULT_TOOL_ACK_WAIT_S` = 3 s: the job runs elsewhere within about 3 s of the worker's death).
One loop beats every held job (a task per job would cost more than most tool runs); a held job goes at
most 1.5 periods (3/8 of AckWait) without a beat, so a worker's event loop may stall for over half the
AckWait before a live job is delivered twice (which would still be harmless: see `runtime.worker`).

AckWait is a property of the consumer, shared by every worker. A worker sets it at start-up when the
consumer has another value (`sync_ack_wait`: consumers created with the former 30 s default are updated
in place), and every worker re-reads it periodically (`JobHeartbeats.follow`), so a worker started
before a change adapts its period instead of losing its jobs to a shorter AckWait.

Why a delivery ended. Every delivery counts against the consumer's MaxDeliver, a crashed one too. A
delivery ends without an outcome in one of two ways: its worker gave the job back (`nak`), recording why
first (`record_end`, in the ``attempts`` bucket, one key per job, kept an hour), because it hit NATS
trouble or because it lacks the tool version the job names (a hand-off, `runtime.worker.handoff`, which
is recorded as such: `handed_off`); or its worker stopped heartbeating and the server delivered the job
again after AckWait, with nobody left to record anything. So the worker that gets delivery n explains
deliveries 1..n-1 (`explain`): the recorded reason where there is one, else that it was not acknowledged
because its worker stopped heartbeating. The explanation travels in the outcome (`ToolOutcome.earlier`)
and the host records it as a `tool.redelivered` event, so `sa replay` shows why a call took longer.
Reading the bucket happens only for redeliveries and writing it only before a nak: a first delivery pays
nothing for it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import anyio
import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from runtime.nats.kv import fleet_kv, put_kv
from runtime.nats.subjects import ATTEMPTS_BUCKET, TOOLS, WORKERS_CONSUMER

log = logging.getLogger("runtime.worker")

ATTEMPTS_TTL_S = 3600.0  # a recorded reason outlives every redelivery of its job (MaxDeliver x 10 s naks)
FOLLOW_S = 5.0  # how often a worker re-reads the consumer's AckWait


def heartbeat_period(ack_wait: float) -> float:
    """How often a held job is heartbeated under `ack_wait`."""
    return max(0.05, ack_wait / 4)


async def consumer_ack_wait(js: JetStreamContext) -> float:
    """The AckWait of the shared ``workers`` consumer, in seconds."""
    return float((await js.consumer_info(TOOLS, WORKERS_CONSUMER)).config.ack_wait or 0.0)


async def sync_ack_wait(js: JetStreamContext, ack_wait: float) -> float:
    """Give the ``workers`` consumer this AckWait if it has another (an update in place: jobs held now
    keep their deliveries); returns the AckWait in force. If the update is refused, the consumer's own
    value stays in force and is returned."""
    info = await js.consumer_info(TOOLS, WORKERS_CONSUMER)
    current = float(info.config.ack_wait or 0.0)
    if abs(current - ack_wait) < 1e-3:
        return current
    try:
        await js.add_consumer(TOOLS, dataclasses.replace(info.config, ack_wait=ack_wait))
    except Exception as e:
        log.warning("cannot set the tool AckWait to %g s (%s); keeping %g s", ack_wait, e, current)
        return current
    log.info("tool AckWait set to %g s (was %g s): a dead worker's job is delivered again that long "
             "after its last heartbeat", ack_wait, current)
    return ack_wait


class JobHeartbeats:
    """The jobs one worker holds, each heartbeated until it is settled (see the module docstring)."""

    def __init__(self, ack_wait: float) -> None:
        self.ack_wait = ack_wait
        self.period = heartbeat_period(ack_wait)
        self._held: dict[int, tuple[Msg, float]] = {}  # id(msg) -> (msg, monotonic time of its last beat)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, msg: Msg) -> None:
        self._held[id(msg)] = (msg, time.monotonic())

    def settle(self, msg: Msg) -> None:
        self._held.pop(id(msg), None)

    def set_ack_wait(self, ack_wait: float) -> None:
        if ack_wait > 0 and abs(ack_wait - self.ack_wait) >= 1e-3:
            log.info("tool AckWait is now %g s: heartbeating held jobs every %g s", ack_wait,
                     heartbeat_period(ack_wait))
            self.ack_wait, self.period = ack_wait, heartbeat_period(ack_wait)

    async def run(self) -> None:
        """Every half period, beat each job whose last beat is a period old (so at most 1.5 periods
        apart); `in_progress()` is a publish: it never waits for the server."""
        while True:
            await anyio.sleep(self.period / 2)
            due = time.monotonic() - self.period
            for key, (msg, since) in list(self._held.items()):
                if since <= due and key in self._held:
                    self._held[key] = (msg, time.monotonic())
                    try:
                        await msg.in_progress()
                    except Exception as e:  # reconnecting: the next beat may get through
                        log.debug("in_progress failed: %s", e)

    async def follow(self, js: JetStreamContext) -> None:
        """Adopt the consumer's AckWait whenever it changes (another worker or an operator set it)."""
        while True:
            await anyio.sleep(FOLLOW_S)
            try:
                self.set_ack_wait(await consumer_ack_wait(js))
            except Exception as e:  # NATS away: keep the period we have
                log.debug("reading the tool AckWait failed: %s", e)


def deliveries(msg: Msg) -> int:
    """How many times the job was delivered, read straight from the reply subject (`msg.metadata` parses
    every field and a timestamp per job); 1 for a message without one (tests calling `handle`)."""
    if not msg.reply:
        return 1
    tokens = msg.reply.split(".")
    try:
        return int(tokens[4] if len(tokens) == 9 else tokens[Msg.Ack.NumDelivered])
    except (IndexError, ValueError):
        return msg.metadata.num_delivered


def retry_delay(attempt: int) -> float:
    """Redelivery delay after the `attempt`-th delivery failed for infrastructure reasons: 2, 4, 8, 10 s,
    so MaxDeliver (5) deliveries span more than a cluster leader election (4-6 s)."""
    return min(10.0, 2.0 ** attempt)


# ---------------------------------------------------------------------------------------------------------
# why earlier deliveries ended
# ---------------------------------------------------------------------------------------------------------

_KEY_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=")


def _key(msg_id: str) -> str:
    return "".join(c if c in _KEY_OK else f"={ord(c):x}=" for c in msg_id)


_reasons = msgspec.msgpack.Decoder(dict[str, str])


async def _recorded(js: JetStreamContext, msg_id: str) -> dict[str, str]:
    kv = await fleet_kv(js, ATTEMPTS_BUCKET)
    try:
        entry = await kv.get(_key(msg_id))
    except KeyNotFoundError:
        return {}
    return _reasons.decode(entry.value) if entry.value else {}


_HANDOFFS = "handoffs"  # the key (beside the numbered reasons) listing the deliveries that were hand-offs


async def record_end(js: JetStreamContext, msg_id: str, attempt: int, worker: str, reason: str, *,
                     handoff: bool = False) -> None:
    """Record why delivery `attempt` of a job ends without an outcome (called before a nak; best effort:
    without it the next delivery reports that this one was not acknowledged). `handoff`: the worker
    lacked the job's tool version and left the job to one that has it (`runtime.worker.handoff`): the
    job never ran, which `handed_off` tells the last delivery."""
    try:
        reasons = await _recorded(js, msg_id)
        reasons[str(attempt)] = f"delivery {attempt} was given back by worker {worker}: {reason}"
        if handoff:
            reasons[_HANDOFFS] = ",".join(filter(None, (reasons.get(_HANDOFFS, ""), str(attempt))))
        await put_kv(js, ATTEMPTS_BUCKET, _key(msg_id), msgspec.msgpack.encode(reasons), ttl=ATTEMPTS_TTL_S,
                     timeout=2.0)
    except Exception as e:
        log.debug("cannot record why delivery %d of %s ended: %s", attempt, msg_id, e)


async def handed_off(js: JetStreamContext, msg_id: str) -> set[int]:
    """The deliveries of a job that were hand-offs (recorded by `record_end(handoff=True)`): deliveries
    that ended without an outcome because the worker lacked the tool version, not because it died."""
    try:
        recorded = (await _recorded(js, msg_id)).get(_HANDOFFS, "")
    except Exception as e:  # unknown: as if none were (the caller then treats them as crashes)
        log.debug("cannot read the hand-offs of %s: %s", msg_id, e)
        return set()
    return {int(n) for n in recorded.split(",") if n.isdigit()}


async def explain(js: JetStreamContext, msg_id: str, attempt: int, ack_wait: float) -> tuple[str, ...]:
    """Why each delivery before `attempt` ended, oldest first (empty for a first delivery)."""
    if attempt <= 1:
        return ()
    try:
        recorded: dict[str, Any] = await _recorded(js, msg_id)
    except Exception as e:
        log.debug("cannot read why earlier deliveries of %s ended: %s", msg_id, e)
        recorded = {}
    return tuple(recorded.get(str(n)) or
                 f"delivery {n} was not acknowledged: its worker stopped heartbeating (killed, cut off "
                 f"from NATS or stalled), so the job was delivered again {ack_wait:g} s after its last "
                 f"heartbeat" for n in range(1, attempt))


__all__ = ["ATTEMPTS_TTL_S", "JobHeartbeats", "consumer_ack_wait", "deliveries", "explain", "handed_off",
           "heartbeat_period", "record_end", "retry_delay", "sync_ack_wait"]
