"""What a fire is, and what the hosts make of it: a task (a schedule's fire) or a wake command (a timer's).

What nats-server 2.15 does (probed; ADR-51): a message published with ``Nats-Schedule`` and
``Nats-Schedule-Target`` headers is held on its subject (one per subject: the server stamps it
``Nats-Rollup: sub``, so a new one replaces it) and, at each instant of its schedule, republished on the
target, which must be a subject of the same stream (else err 10190, "message schedules target is invalid").
The copy keeps the body and the schedule's other headers, but not its ``Nats-Msg-Id`` nor its
``Nats-Schedule-*`` headers, and gains ``Nats-Scheduler`` (the schedule's subject) and
``Nats-Schedule-Next``: the next instant for a recurring schedule (``2030-01-01T08:05:00Z``, in the
schedule's zone for a cron with one), ``purge`` for an ``@at``, whose schedule message the server then
removes. The fire's stored time is when it fired (within a few ms of the instant, later when the server
is busy). Ticks are whole seconds, and the server fires once for every tick even when nobody consumes:
fires are stored messages and wait. While the server itself is down, a recurring schedule's missed ticks
make a single fire when it comes back. A schedule stops when its message is purged or replaced by one
without the headers (how `pause` works). A client cannot forge a fire: a publish carrying
``Nats-Scheduler`` or ``Nats-Schedule-Next`` is refused (err 10212, "message schedules invalid
scheduler"); a pattern the server does not take is err 10189 (five-field cron, ``@every 500ms``, an
``@at`` without a zone, a zone on ``@every``), an unknown zone err 10223.

A fire's identity (`Fire.key`), unique per tick of a schedule: the ``@at`` instant; for ``every``, its
``Nats-Schedule-Next`` minus the interval (the tick); for a cron, ``before-<Nats-Schedule-Next>``. The task
id is the schedule's name and that key (`Fire.task_id`), so a fire delivered twice is stored once by TASKS
(``Nats-Msg-Id``) and, beyond the dedup window, finds the run its derived run id
(`runtime.commands.run_id_for`) already started. Pure: the host's consumer (`runtime.host.scheduler`) does
the I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runtime.nats.subjects import HDR_MSG_ID, timer_token
from runtime.schedules.spec import Schedule, ScheduleError
from runtime.timers import iso, parse_instant

HDR_SCHEDULE = "Nats-Schedule"
HDR_SCHEDULE_TARGET = "Nats-Schedule-Target"
HDR_SCHEDULE_TZ = "Nats-Schedule-Time-Zone"
HDR_SCHEDULER = "Nats-Scheduler"
HDR_SCHEDULE_NEXT = "Nats-Schedule-Next"
HDR_ROLLUP = "Nats-Rollup"

# task metadata of a scheduled run: which schedule, which fire, when the cluster fired it
META_SCHEDULE, META_FIRE, META_FIRED_AT = "sa.schedule", "sa.fire", "sa.fired_at"


@dataclass(frozen=True)
class Fire:
    """One fire of a schedule, as a host received it."""

    schedule: Schedule
    key: str  # the tick (see the module docstring)
    fired_at: float  # its stored time
    seq: int  # its stream sequence

    @property
    def task_id(self) -> str:
        return f"{TASK_PREFIX}{self.schedule.name}-{self.key}"

    def metadata(self) -> dict[str, Any]:
        return {META_SCHEDULE: self.schedule.name, META_FIRE: self.key, META_FIRED_AT: iso(self.fired_at)}


TASK_PREFIX = "schedule-"
_KEY = re.compile(r"(?:before-|seq-)?\d")  # how every fire key begins: an instant, before-<instant>, seq-<n>


def fired_by(name: str, task_id: str | None) -> str | None:
    """The fire key of a task that schedule `name` started (its `Fire.task_id`), or None for any other
    task. Exact although names may hold ``-``: a key always begins with a digit, ``before-`` or ``seq-``,
    so schedule ``a`` does not claim the fires of ``a-b``."""
    prefix = f"{TASK_PREFIX}{name}-"
    if not task_id or not task_id.startswith(prefix):
        return None
    key = task_id[len(prefix):]
    return key if _KEY.match(key) else None


def fire_of(data: bytes, headers: dict[str, str] | None, fired_at: float, seq: int) -> Fire:
    """The fire a message of ``schedules.fire.<name>`` holds; `ScheduleError` for one that is not."""
    schedule = Schedule.decode(data)
    nxt = (headers or {}).get(HDR_SCHEDULE_NEXT, "")
    if schedule.at is not None:
        key = schedule.at
    elif nxt and nxt != "purge" and schedule.every is not None:
        key = iso(parse_instant(nxt) - int(schedule.every.rstrip("s")))  # the tick: next minus the interval
    elif nxt and nxt != "purge":
        key = f"before-{nxt}"  # a cron's tick is the one before its next (which cron arithmetic would name)
    else:  # not a server's fire (published by hand): the stream sequence still names it once
        key = f"seq-{seq}"
    return Fire(schedule, key, fired_at, seq)


def skip_reason(fire: Fire, now: float, newest_seq: int | None) -> str | None:
    """Why `fire` is not run (its schedule's `catch_up` and `grace_s`), or None to run it. A fire taken
    within `grace_s` of its stored time is on time and always runs; a later one was missed (no host took
    it then). `newest_seq` is the stream sequence of the newest fire of the schedule still stored."""
    late = now - fire.fired_at
    spec = fire.schedule
    if late <= spec.grace_s or spec.catch_up == "all":
        return None
    if spec.catch_up == "none":
        return f"missed ({late:.0f} s late, grace {spec.grace_s:g} s) and catch_up is none"
    if newest_seq is not None and newest_seq > fire.seq:
        return f"missed ({late:.0f} s late) and a later fire of it is waiting (catch_up latest)"
    return None


@dataclass(frozen=True)
class WakeUp:
    """A run's timer wake-up: the body of its ``@at`` schedule (and of its fire)."""

    actor: str
    run_id: str
    call_id: str

    def encode(self) -> bytes:
        return json.dumps({"actor": self.actor, "run_id": self.run_id, "call_id": self.call_id}).encode()

    @classmethod
    def decode(cls, data: bytes) -> WakeUp:
        try:
            raw = json.loads(data)
            return cls(str(raw["actor"]), str(raw["run_id"]), str(raw["call_id"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ScheduleError(f"not a wake-up: {e}") from None

    @property
    def msg_id(self) -> str:
        """The dedup id of its schedule and of the wake command it becomes (one per timer)."""
        return f"wake-{timer_token(self.call_id)}"

    def headers(self, due: float, target: str) -> dict[str, str]:
        """An `@at` schedule for `due`, rounded up to the whole second (the server's resolution): it never
        fires before the timer is due."""
        whole = -(-due // 1)
        return {HDR_SCHEDULE: f"@at {iso(whole)}", HDR_SCHEDULE_TARGET: target, HDR_MSG_ID: self.msg_id}


__all__ = ["HDR_SCHEDULE", "HDR_SCHEDULER", "HDR_SCHEDULE_NEXT", "HDR_SCHEDULE_TARGET", "HDR_SCHEDULE_TZ",
           "META_FIRE", "META_FIRED_AT", "META_SCHEDULE", "TASK_PREFIX", "Fire", "WakeUp", "fire_of",
           "fired_by", "skip_reason"]
