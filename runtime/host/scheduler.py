"""The hosts' side of the cluster's clock: fires become tasks, wake-ups become wake commands.

Every host pulls from one durable consumer of SCHEDULES (``scheduler``, filtering ``schedules.fire.>`` and
``schedules.wake.>``: `runtime.nats.topology`), whatever bundles it serves, so fires are taken as long as
one host of any bundle runs. What this host does with each message, then acks it (the stream, a
WorkQueue, forgets it):

* a schedule's fire (`runtime.schedules.fires`): unless its schedule's `catch_up` says to skip it (a fire
  taken more than `grace_s` after it fired was missed), publish its task for the schedule's actor with the
  task id the fire derives (``Nats-Msg-Id``: a fire delivered twice is stored once, and its run id is the
  same), carrying which schedule and fire in its metadata. The task then travels as any task does, to a
  host serving its agent.
* a timer's wake-up: publish `events.Wake` for the run on ``ops.<actor>.scheduler``, the run's partition,
  with one Msg-Id per timer; the host serving the run folds it if it is parked, and records
  `timer.fired` (`runtime.host.routing`, `runtime.host.driver`).

A message that is not a fire or a wake-up is logged and terminated; a publish that fails (NATS trouble) is
retried by redelivery. Also here: `ensure_bundle_schedules`, which stores a bundle's `schedules:` when a
host starts (the same schedule again changes nothing; a paused one stays paused).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from runtime import events as ev
from runtime.commands import publish_task
from runtime.host.config import HostStats
from runtime.host.served import AgentRuntime
from runtime.nats.pull import consume
from runtime.nats.retry import backoff
from runtime.nats.subjects import (
    HDR_MSG_ID,
    SCHEDULE_OPERATOR,
    SCHEDULER_CONSUMER,
    SCHEDULES,
    command_subject,
)
from runtime.schedules import ScheduleError, WakeUp, fire_of, get_schedule, put_schedule, skip_reason

log = logging.getLogger("runtime.host")

RETRY_S = 1.0


class Scheduler:
    """Takes fires and wake-ups from the shared ``scheduler`` consumer until stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, stats: HostStats, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.nc, self.js, self.stats, self.clock = nc, js, stats, clock

    async def run(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            try:  # NATS trouble (a reconnect, a leader election): keep taking fires
                await consume(self.nc, SCHEDULES, SCHEDULER_CONSUMER, self.on_message, stop=stop, batch=64)
            except Exception as e:
                await backoff("taking schedule fires", e, delay=RETRY_S, logger=log)

    async def on_message(self, msg: Msg) -> None:
        """`handle` the message, then ack it; a message that is not a fire or a wake-up is terminated, one
        whose publish failed (NATS trouble) comes again a little later."""
        try:
            await self.handle(msg)
        except (ScheduleError, ValueError) as e:
            self.stats.rejected += 1
            log.error("dropped %s: %s", msg.subject, e)
            await msg.term()
            return
        except Exception as e:
            log.warning("%s: %s (%s); it comes again", msg.subject, type(e).__name__, e)
            await msg.nak(delay=RETRY_S)
            return
        await msg.ack()

    async def handle(self, msg: Msg) -> None:
        """Publish what a fire or a wake-up becomes (idempotent: done twice, it is stored once)."""
        kind = msg.subject.split(".")[1] if msg.subject.count(".") >= 2 else ""
        if kind == "fire":
            await self._fire(msg)
        elif kind == "wake":
            await self._wake(msg)
        else:
            raise ScheduleError(f"not a fire or a wake-up: {msg.subject}")

    async def _fire(self, msg: Msg) -> None:
        md = msg.metadata
        fire = fire_of(msg.data, msg.headers, md.timestamp.timestamp(), md.sequence.stream)
        spec = fire.schedule
        newest = await self._newest(msg.subject) if spec.catch_up == "latest" else None
        reason = skip_reason(fire, self.clock(), newest)
        if reason is not None:
            self.stats.fires_skipped += 1
            log.info("schedule %s: fire %s skipped: %s", spec.name, fire.key, reason)
            return
        run_id = await publish_task(self.js, spec.actor, spec.input, task_id=fire.task_id, thread=spec.thread,
                                    metadata=fire.metadata())
        self.stats.fires += 1
        log.info("schedule %s: fire %s is run %s of %s", spec.name, fire.key, run_id, spec.actor)

    async def _newest(self, subject: str) -> int | None:
        try:
            last = await self.js.get_last_msg(SCHEDULES, subject, direct=True)
        except NotFoundError:
            return None
        return int(last.seq or 0)

    async def _wake(self, msg: Msg) -> None:
        wake = WakeUp.decode(msg.data)
        command = ev.Wake(run_id=wake.run_id, call_id=wake.call_id)
        await self.js.publish(command_subject(wake.actor, SCHEDULE_OPERATOR), ev.encode_command(command),
                              headers={HDR_MSG_ID: wake.msg_id})
        self.stats.wakes += 1


async def ensure_bundle_schedules(js: Any, agents: dict[str, AgentRuntime]) -> None:
    """Store the `schedules:` of every bundle served (`runtime.bundle`). A schedule already stored the same
    is left as it is (an interval keeps counting from when it was stored); one of the same name that
    differs is replaced by the bundle's, and says so, unless another bundle's stored it (two bundles naming
    one schedule would replace each other at every start: the first stays, with an error); a paused one
    stays paused either way. A schedule the server refuses is logged, and the host serves on."""
    for agent in agents.values():
        origin = f"bundle {agent.bundle.name}"
        for schedule in agent.bundle.schedules:
            existing = await get_schedule(js, schedule.name)
            if existing is not None and existing.same_as(schedule):
                continue
            if existing is not None and existing.origin.startswith("bundle ") and existing.origin != origin:
                log.error("schedule %s of %s not stored: %s has a schedule of that name; rename one of them",
                          schedule.name, origin, existing.origin)
                continue
            if existing is not None:
                schedule = msgspec.structs.replace(schedule, paused=existing.paused)
                log.warning("schedule %s (%s) replaced by %s's (%s)", schedule.name, existing.when, origin,
                            schedule.when)
            try:
                await put_schedule(js, schedule, replace=True)
            except ScheduleError as e:  # the server refuses it (a zone it lacks): the rest is still served
                log.error("schedule %s of %s not stored: %s", schedule.name, origin, e)
                continue
            log.info("schedule %s (%s, %s) stored from %s", schedule.name, schedule.actor, schedule.when,
                     origin)


__all__ = ["Scheduler", "ensure_bundle_schedules"]
