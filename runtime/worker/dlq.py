"""Dead letters: tool jobs that cannot be delivered any more, kept in the DLQ stream for an operator.

A job becomes a dead letter in one of three ways:

* it is malformed (not a `ToolJob`): the worker copies it here and `term()`s it at once;
* it reached its last delivery (`num_delivered >= MaxDeliver`) without an outcome: every earlier
  delivery ended with the worker killed, disconnected or out of time. The worker that gets the last
  delivery does not run it again (it would likely kill that worker too): it copies the job here,
  publishes a tool failure of kind `crashed` that says how many times it was delivered, and
  `term()`s it. The run goes on and the model reads why the call failed;
* it slipped through (the worker holding the last delivery died as well): NATS then leaves the
  message in the WorkQueue stream, invisible to every consumer, and only publishes the advisory
  ``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TOOLS.workers``.
  `MaxDeliveriesWatch`, run by every worker in one queue group, reads the message by its stream
  sequence, settles it the same way and deletes it from TOOLS.

Settling is idempotent, so the paths may overlap: the DLQ copy has Msg-Id ``dlq:<stream>:<seq>``
and the `crashed` outcome the job's own ``<run>/<call>``, so a second settle of the same message
stores nothing new.

A dead letter is the original bytes on ``dlq.<original subject>`` with headers saying where it came
from (`HDR_*`). `list_dead_letters` reads them all (`sa dlq`); `replay` re-publishes one to its
original subject with a fresh Msg-Id (so the TOOLS duplicate window does not drop it) and removes it
from DLQ (`sa dlq replay SEQ|--all`). Note what a replay means for a `crashed` job: its run already
went on with the failure and the kernel keeps the first result of a call, so the re-run applies its
workspace writes but its outcome (same Msg-Id ``<run>/<call>``) is dropped by RESULTS within the
duplicate window and ignored by the host after it: replay after fixing what killed the workers, for
the side effects, or to re-check that the job now runs (the worker logs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from runtime.jobs import JobDecodeError, ToolJob, ToolOutcome
from runtime.nats.subjects import DLQ, HDR_MSG_ID, TOOLS, WORKERS_CONSUMER, dlq_subject
from runtime.types import ToolResult

log = logging.getLogger("runtime.worker.dlq")

HDR_SUBJECT = "Sa-Original-Subject"
HDR_STREAM = "Sa-Stream"
HDR_STREAM_SEQ = "Sa-Stream-Seq"
HDR_DELIVERIES = "Sa-Deliveries"
HDR_REASON = "Sa-Reason"
HDR_ORIGINAL_MSG_ID = "Sa-Original-Msg-Id"
HDR_DEAD_AT = "Sa-Dead-At"
HDR_REPLAYS = "Sa-Replays"  # how many times this job was replayed from the DLQ before

CRASHED_DETAIL = "dead_letter"
WATCH_QUEUE = "sa-dlq"


def max_deliveries_advisory(stream: str = TOOLS, consumer: str = WORKERS_CONSUMER) -> str:
    """The subject on which the server announces a message that exhausted MaxDeliver."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"


# ---------------------------------------------------------------------------------------------------------
# settling a message
# ---------------------------------------------------------------------------------------------------------


def crashed_outcome(job: ToolJob, deliveries: int, reason: str, *, worker: str = "") -> ToolOutcome:
    """The tool failure a run receives for a dead-lettered job: kind `crashed`, with the count."""
    message = (f"the call to {job.tool!r} was delivered {deliveries} time(s) to tool workers and never "
               f"finished ({reason}); it was moved to the dead-letter queue and will not be retried "
               f"automatically")
    return ToolOutcome.for_job(job, ToolResult.failure("crashed", message, detail=CRASHED_DETAIL),
                               worker=worker, attempt=deliveries)


async def copy_to_dlq(js: JetStreamContext, *, subject: str, data: bytes, stream_seq: int, deliveries: int,
                      reason: str, stream: str = TOOLS, headers: dict[str, str] | None = None) -> int:
    """Store the original bytes on `dlq.<subject>` with where-from headers; returns the DLQ sequence.

    The Msg-Id is the original stream and sequence, so copying the same message twice stores it once.
    """
    original = headers or {}
    hdrs = {
        HDR_SUBJECT: subject,
        HDR_STREAM: stream,
        HDR_STREAM_SEQ: str(stream_seq),
        HDR_DELIVERIES: str(deliveries),
        HDR_REASON: reason[:500],
        HDR_DEAD_AT: f"{time.time():.3f}",
        HDR_MSG_ID: f"dlq:{stream}:{stream_seq}",
    }
    if original.get(HDR_MSG_ID):
        hdrs[HDR_ORIGINAL_MSG_ID] = original[HDR_MSG_ID]
    if original.get(HDR_REPLAYS):
        hdrs[HDR_REPLAYS] = original[HDR_REPLAYS]
    ack = await js.publish(dlq_subject(subject), data, headers=hdrs)
    return ack.seq


async def settle(js: JetStreamContext, *, subject: str, data: bytes, stream_seq: int, deliveries: int,
                 reason: str, worker: str = "", headers: dict[str, str] | None = None) -> ToolJob | None:
    """Dead-letter one TOOLS message that exhausted its deliveries: the DLQ copy first, then (if the
    bytes are a job) its `crashed` outcome, so a crash in between loses nothing (the next settle
    repeats both, deduplicated). Returns the job, or None if the bytes were not one."""
    await copy_to_dlq(js, subject=subject, data=data, stream_seq=stream_seq, deliveries=deliveries,
                      reason=reason, headers=headers)
    try:
        job = ToolJob.decode(data)
    except JobDecodeError:
        return None
    outcome = crashed_outcome(job, deliveries, reason, worker=worker)
    await js.publish(outcome.subject, outcome.encode(), headers=outcome.headers())
    return job


# ---------------------------------------------------------------------------------------------------------
# the safety net: MaxDeliver advisories
# ---------------------------------------------------------------------------------------------------------


class MaxDeliveriesWatch:
    """Moves TOOLS messages the server gave up on to the DLQ (see the module docstring).

    Every worker runs one; they share a queue group, so each advisory is handled once. Known limit:
    advisories are core NATS messages, so one published while no worker runs is lost and its message
    stays in TOOLS, counted in the consumer's `num_ack_pending` (one MaxAckPending slot) until it is
    deleted; the server offers no per-message delivery count to find it by afterwards.
    """

    def __init__(self, nc: NATS, js: JetStreamContext, *, worker: str = "") -> None:
        self.nc, self.js, self.worker = nc, js, worker
        self.settled = 0
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(max_deliveries_advisory(), queue=WATCH_QUEUE,
                                            cb=self._on_advisory)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_advisory(self, msg: Any) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries", 0))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("unreadable MaxDeliver advisory %r: %s", msg.data[:200], e)
            return
        try:
            await self.settle_stuck(seq, deliveries)
        except Exception as e:  # NATS trouble: the message stays stuck; `sa dlq` shows it
            log.warning("cannot dead-letter TOOLS message %d after its advisory: %s", seq, e)

    async def settle_stuck(self, seq: int, deliveries: int) -> bool:
        """Dead-letter TOOLS message `seq` and delete it; False if it is already gone."""
        try:
            raw = await self.js.get_msg(TOOLS, seq)
        except NotFoundError:
            return False
        reason = f"the server stopped delivering it after {deliveries} deliveries (MaxDeliver advisory)"
        job = await settle(self.js, subject=raw.subject or "", data=raw.data or b"", stream_seq=seq,
                           deliveries=deliveries, reason=reason, worker=self.worker,
                           headers=dict(raw.headers or {}))
        with contextlib.suppress(NotFoundError):
            await self.js.delete_msg(TOOLS, seq)
        self.settled += 1
        log.error("TOOLS message %d (%s) exhausted %d deliveries: moved to %s%s", seq, raw.subject,
                  deliveries, DLQ, f", run {job.run_id} told it crashed" if job else "")
        return True


# ---------------------------------------------------------------------------------------------------------
# reading and replaying (`sa dlq`)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class DeadLetter:
    """One DLQ entry as `sa dlq` shows it."""

    seq: int  # sequence in the DLQ stream: what `sa dlq replay` takes
    subject: str  # where it was first published (and where a replay sends it)
    stream_seq: int
    deliveries: int
    reason: str
    dead_at: float
    data: bytes
    headers: dict[str, str]

    @property
    def job(self) -> ToolJob | None:
        try:
            return ToolJob.decode(self.data)
        except JobDecodeError:
            return None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `sa dlq --json` (the bytes only as a size; the job's fields when it is one)."""
        job = self.job
        return {
            "seq": self.seq, "subject": self.subject, "stream_seq": self.stream_seq,
            "deliveries": self.deliveries, "reason": self.reason, "dead_at": self.dead_at,
            "size": len(self.data),
            "job": None if job is None else {"run_id": job.run_id, "actor": job.actor, "call_id": job.call_id,
                                             "tool": job.tool, "arguments": job.arguments},
        }

    @classmethod
    def from_msg(cls, seq: int, subject: str, data: bytes, headers: dict[str, str] | None) -> DeadLetter:
        h = dict(headers or {})

        def num(key: str, kind: type = int) -> Any:
            try:
                return kind(h.get(key, 0))
            except ValueError:
                return kind(0)

        return cls(seq=seq, subject=h.get(HDR_SUBJECT) or subject.removeprefix("dlq."),
                   stream_seq=num(HDR_STREAM_SEQ), deliveries=num(HDR_DELIVERIES),
                   reason=h.get(HDR_REASON, ""), dead_at=num(HDR_DEAD_AT, float), data=data, headers=h)


async def list_dead_letters(js: JetStreamContext, *, timeout: float = 30.0) -> list[DeadLetter]:
    """Every dead letter, oldest first (an ordered consumer bounded by the stream's last sequence)."""
    try:
        info = await js.stream_info(DLQ)
    except NotFoundError:
        return []
    if info.state.messages == 0:
        return []
    end = info.state.last_seq
    out: list[DeadLetter] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Any) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= end:
            out.append(DeadLetter.from_msg(seq, msg.subject, msg.data, msg.headers))
        if (seq >= end or msg.metadata.num_pending == 0) and not done.done():
            done.set_result(None)

    sub = await js.subscribe("dlq.>", stream=DLQ, ordered_consumer=True, cb=on_msg,
                             deliver_policy=DeliverPolicy.ALL)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    return out


async def get_dead_letter(js: JetStreamContext, seq: int) -> DeadLetter:
    """One dead letter by its DLQ sequence; KeyError if there is none."""
    try:
        raw = await js.get_msg(DLQ, seq)
    except NotFoundError:
        raise KeyError(f"no dead letter with sequence {seq}") from None
    return DeadLetter.from_msg(seq, raw.subject or "", raw.data or b"", raw.headers)


async def replay(js: JetStreamContext, seq: int) -> DeadLetter:
    """Re-publish dead letter `seq` to its original subject and remove it from DLQ.

    The new Msg-Id is the original one plus ``#dlq<seq>``: unique per dead letter, so TOOLS does not
    drop it as a duplicate of the first publication, yet replaying the same entry twice (a crash
    between publish and delete) stores it once.
    """
    dead = await get_dead_letter(js, seq)
    job = dead.job
    base = dead.headers.get(HDR_ORIGINAL_MSG_ID) or (job.msg_id if job else f"dlq-{dead.stream_seq}")
    replays = int(dead.headers.get(HDR_REPLAYS, "0") or 0) + 1
    headers = {HDR_MSG_ID: f"{base}#dlq{seq}", HDR_REPLAYS: str(replays)}
    await js.publish(dead.subject, dead.data, headers=headers)
    with contextlib.suppress(NotFoundError):
        await js.delete_msg(DLQ, seq)
    return dead


__all__ = ["CRASHED_DETAIL", "DeadLetter", "MaxDeliveriesWatch", "copy_to_dlq", "crashed_outcome",
           "get_dead_letter", "list_dead_letters", "max_deliveries_advisory", "replay", "settle"]
