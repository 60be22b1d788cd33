"""A turn's jobs on their way to the workers: sent at once, their acks awaited later, re-sent through outages.

`RunDriver._dispatch` hands each job to the connection (`send_job`), appends the jobs' `tool.called`
records, and only then waits for the jobs' acks (`job_acked`): the jobs travel while the records are
written, and a turn with several calls costs no task per job (a task and its cancel scope cost a host more
CPU than the publish itself, ~8 % of its CPU at 100 runs in flight). A job NATS did not take (a leader
election, a reconnect) is published again with the same Msg-Id until it is (TOOLS keeps one); a job the
stream refuses (`BadRequestError`) is not an outage and propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.errors import BadRequestError

from runtime.jobs import ToolJob
from runtime.nats.jetstream import PendingAck
from runtime.nats.retry import retrying

log = logging.getLogger("runtime.host")

PUBLISH_RETRY_S = 0.25


async def send_job(js: JetStreamContext, job: ToolJob) -> PendingAck | None:
    """Hand `job` to the connection; its ack is for `job_acked`. None: it is already published, the slow
    way (NATS refused the send just now, or this JetStream context has no `send`)."""
    send: Callable[..., Awaitable[PendingAck]] | None = getattr(js, "send", None)  # `JetStream.send`
    if send is not None:
        try:
            return await send(job.subject, job.encode(), headers=job.headers())
        except Exception as e:
            log.info("run %s: job %s not sent (%s); publishing it again", job.run_id, job.msg_id, e)
    await publish_job(js, job)
    return None


async def job_acked(js: JetStreamContext, job: ToolJob, pending: PendingAck | None) -> None:
    """Wait for a sent job's ack; without one (NATS unavailable for a moment), publish it again with the
    same Msg-Id. A rejected job (`BadRequestError`) propagates."""
    if pending is None:
        return
    try:
        await pending.acked()
        return
    except BadRequestError:
        raise
    except Exception as e:
        log.info("run %s: job %s not acked (%s); publishing it again", job.run_id, job.msg_id, e)
    await publish_job(js, job)


async def publish_job(js: JetStreamContext, job: ToolJob) -> None:
    """Publish `job`; while NATS is unavailable (leader election, reconnect), again with the same Msg-Id."""
    await retrying(lambda: js.publish(job.subject, job.encode(), headers=job.headers()),
                   what=f"run {job.run_id}: publishing job {job.msg_id}", fatal=BadRequestError,
                   delay=PUBLISH_RETRY_S, logger=log)


__all__ = ["PUBLISH_RETRY_S", "job_acked", "publish_job", "send_job"]
