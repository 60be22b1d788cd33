"""Tool work the fleet holds now, and the jobs no worker could finish: what `sa ui`'s pending and fleet
pages read.

    jobs = await tool_work(js)                  # every job in TOOLS: waiting, or held by a worker
    letters = await dead_letters(js)            # DLQ, with the reason each job died
    await replay_dead_letter(js, seq)           # send one back to the workers (`sa dlq replay SEQ`)

TOOLS is a WorkQueue stream: a job stays in it until a worker acknowledges its outcome, so the messages in
it now are exactly the jobs not done yet. Whether one was delivered (a worker holds it, or it waits to be
delivered again after its worker died) is read from the ``workers`` consumer: everything up to the last
stream sequence it delivered has been delivered at least once. Why an earlier delivery of a job ended is
in the ``attempts`` bucket when its worker lived to say so (`runtime.worker.attempts`: a nak records it
first); a delivery whose worker died says nothing, and the next worker to get the job explains it in the
run's `tool.redelivered` event once the job ends.

Dead letters are `runtime.worker.dlq`'s, read and replayed by its own functions, as `sa dlq` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from runtime.jobs import JobDecodeError, ToolJob
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.subjects import ATTEMPTS_BUCKET, TOOLS, WORKERS_CONSUMER

if TYPE_CHECKING:
    from runtime.worker.dlq import DeadLetter

MAX_JOBS = 500  # jobs one read lists (the oldest first); `ToolWork.truncated` says when there were more

_reasons = msgspec.msgpack.Decoder(dict[str, str])


@dataclass(frozen=True)
class QueuedJob:
    """One message of TOOLS: its job (None for bytes that are not one), when it was published, whether it
    was delivered, and why its earlier deliveries ended (delivery number -> reason) where recorded."""

    seq: int
    subject: str
    published: float | None
    delivered: bool
    job: ToolJob | None
    given_back: dict[int, str] = field(default_factory=dict)

    @property
    def deliveries(self) -> int:
        """The delivery the job is on (or waits for): one after the last given back, else 1 once delivered."""
        if self.given_back:
            return max(self.given_back) + 1
        return 1 if self.delivered else 0


@dataclass(frozen=True)
class ToolWork:
    """The jobs in TOOLS, oldest first; `truncated` when there were more than were read."""

    jobs: list[QueuedJob]
    truncated: bool
    ack_wait: float | None  # the ``workers`` consumer's: a dead worker's job is delivered again that late


async def _given_back(js: JetStreamContext) -> dict[str, dict[int, str]]:
    """The ``attempts`` bucket: key -> {delivery number: why it ended}."""
    out: dict[str, dict[int, str]] = {}
    for key, entry in (await kv_entries(await fleet_kv(js, ATTEMPTS_BUCKET))).items():
        try:
            reasons = _reasons.decode(entry.value) if entry.value else {}
        except msgspec.DecodeError:
            continue
        out[key] = {int(n): why for n, why in reasons.items() if n.isdigit()}
    return out


async def tool_work(js: JetStreamContext, limit: int = MAX_JOBS) -> ToolWork:
    """Every job in TOOLS now (at most `limit`, oldest first); see the module docstring."""
    from runtime.worker.attempts import _key  # the bucket's key of a job: the worker's own rule

    try:
        info = await js.stream_info(TOOLS)
    except NotFoundError:
        return ToolWork([], False, None)
    delivered_upto, ack_wait = 0, None
    try:
        consumer = await js.consumer_info(TOOLS, WORKERS_CONSUMER)
        delivered_upto = consumer.delivered.stream_seq if consumer.delivered else 0
        ack_wait = consumer.config.ack_wait
    except NotFoundError:  # no worker has ever started: nothing was delivered
        pass
    given_back = await _given_back(js)
    jobs: list[QueuedJob] = []
    seq, last = info.state.first_seq, info.state.last_seq
    while info.state.messages and seq <= last and len(jobs) < limit:
        try:
            raw = await js.get_msg(TOOLS, seq, subject="tools.>", next=True)
        except NotFoundError:
            break
        if raw.seq is None or raw.seq > last:
            break
        try:
            job: ToolJob | None = ToolJob.decode(raw.data or b"")
        except JobDecodeError:
            job = None
        jobs.append(QueuedJob(raw.seq, raw.subject or "", raw.time.timestamp() if raw.time else None,
                              raw.seq <= (delivered_upto or 0), job,
                              given_back.get(_key(job.msg_id), {}) if job is not None else {}))
        seq = raw.seq + 1
    return ToolWork(jobs, len(jobs) >= limit and seq <= last, ack_wait)


async def dead_letters(js: JetStreamContext) -> list[DeadLetter]:
    """Every dead letter, oldest first (`runtime.worker.dlq.list_dead_letters`)."""
    from runtime.worker.dlq import list_dead_letters

    return await list_dead_letters(js)


async def replay_dead_letter(js: JetStreamContext, seq: int) -> DeadLetter:
    """Send dead letter `seq` back to its tool's workers and remove it from DLQ; KeyError if there is
    none (`runtime.worker.dlq.replay`: what a replay means for a job whose run went on without it)."""
    from runtime.worker.dlq import replay

    return await replay(js, seq)


__all__ = ["MAX_JOBS", "QueuedJob", "ToolWork", "dead_letters", "replay_dead_letter", "tool_work"]
