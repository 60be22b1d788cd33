"""Schedules and timer wake-ups on the SCHEDULES stream: add, read, list, pause, resume, delete.

The stream is the only record: schedule `name` is the message on ``schedules.def.<name>`` (with the
``Nats-Schedule`` headers while active; a paused one is the same body without them, which stops the
server's schedule, since one message per subject holds it), its fires wait on ``schedules.fire.<name>``
until a host takes them. Deleting purges both, so fires not yet taken do not run either. A run's timer
wake-up is an ``@at`` schedule on ``schedules.timer.<timer>`` targeting ``schedules.wake.<timer>``,
published with a Msg-Id per timer (a host that schedules it again after a crash adds nothing) and purged
when the run ends first (a cancel). Hosts own the stream (`runtime.nats.topology.ensure_schedules`): these
functions never create it, and say so when it is missing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from nats.js.errors import BadRequestError, NoStreamResponseError, NotFoundError

from runtime.nats.subjects import (
    FIRE_FILTERS,
    SCHEDULE_FILTER,
    SCHEDULES,
    fire_subject,
    schedule_subject,
    timer_subject,
    wake_subject,
)
from runtime.schedules.fires import (
    HDR_ROLLUP,
    HDR_SCHEDULE,
    HDR_SCHEDULE_TARGET,
    HDR_SCHEDULE_TZ,
    WakeUp,
)
from runtime.schedules.spec import Schedule, ScheduleError

T = TypeVar("T")
NO_STREAM = ("no host has created the SCHEDULES stream yet: start `sa host` or `sa up` (a host of this "
             "version makes it)")
# what the server says of a schedule it refuses (err_code -> what to fix)
_REFUSED = {10189: "the server refuses the schedule's pattern",
            10190: "the server refuses the schedule's target",
            10223: "the server does not know the schedule's time zone"}


class ScheduleExists(ScheduleError):
    """A schedule of that name exists and differs (replace it, or delete it first)."""


@dataclass(frozen=True)
class Listed:
    """A schedule as `list_schedules` shows it: the schedule, and how many of its fires wait for a host."""

    schedule: Schedule
    waiting: int


async def _call(what: str, op: Callable[[], Awaitable[T]]) -> T:
    """`op()`, its errors said in a schedule's terms: a missing stream, a pattern the server refuses."""
    try:
        return await op()
    except NoStreamResponseError:
        raise ScheduleError(NO_STREAM) from None
    except NotFoundError as e:
        if "stream" in str(e).lower():
            raise ScheduleError(NO_STREAM) from None
        raise
    except BadRequestError as e:
        reason = _REFUSED.get(e.err_code or 0)
        if reason is None:
            raise
        raise ScheduleError(f"{what}: {reason} ({e.description})") from None


async def get_schedule(js: Any, name: str) -> Schedule | None:
    """Schedule `name` as stored, or None (never added, deleted, or an `at` that fired)."""
    async def read() -> Any:
        try:
            return await js.get_last_msg(SCHEDULES, schedule_subject(name), direct=True)
        except NotFoundError as e:
            if "stream" in str(e).lower() and "message" not in str(e).lower():
                raise
            return None

    msg = await _call(f"schedule {name}", read)
    return Schedule.decode(msg.data) if msg is not None and msg.data else None


async def _publish(js: Any, schedule: Schedule) -> None:
    subject = schedule_subject(schedule.name)
    headers = {HDR_ROLLUP: "sub"}  # replaces what was there (a paused copy has no schedule headers)
    if not schedule.paused:
        headers |= {HDR_SCHEDULE: schedule.pattern, HDR_SCHEDULE_TARGET: fire_subject(schedule.name)}
        if schedule.tz:
            headers[HDR_SCHEDULE_TZ] = schedule.tz
    await _call(f"schedule {schedule.name} ({schedule.when})",
                lambda: js.publish(subject, schedule.encode(), headers=headers))


async def put_schedule(js: Any, schedule: Schedule, *, replace: bool = False) -> bool:
    """Store `schedule`; True if that changed anything. The same schedule again (paused or not, from
    anywhere) changes nothing: an interval keeps counting from when it was first stored, a paused one stays
    paused. Another schedule of that name is `ScheduleExists`, unless `replace`."""
    existing = await get_schedule(js, schedule.name)
    if existing is not None and existing.same_as(schedule):
        return False
    if existing is not None and not replace:
        raise ScheduleExists(f"schedule {schedule.name} exists ({existing.agent}, {existing.when}): "
                             "delete it first, or replace it")
    await _publish(js, schedule)
    return True


async def set_paused(js: Any, name: str, paused: bool) -> Schedule:
    """Pause (no fire until resumed) or resume schedule `name`; `LookupError` if there is none. Fires made
    before a pause still run. A resumed `every` counts its interval from the resume."""
    existing = await get_schedule(js, name)
    if existing is None:
        raise LookupError(f"no schedule {name!r} (see `sa schedule list`)")
    if existing.paused != paused:
        existing = msgspec.structs.replace(existing, paused=paused)
        await _publish(js, existing)
    return existing


async def delete_schedule(js: Any, name: str) -> bool:
    """Delete schedule `name` and its fires not yet taken; False if there was none."""
    existed = await get_schedule(js, name) is not None
    for subject in (schedule_subject(name), fire_subject(name)):
        await _purge(js, subject, f"schedule {name}")
    return existed


async def _purge(js: Any, subject: str, what: str) -> None:
    async def purge() -> Any:
        return await js.purge_stream(SCHEDULES, subject=subject)

    await _call(what, purge)


async def _subjects(js: Any, pattern: str) -> dict[str, int]:
    info = await _call("listing schedules", lambda: js.stream_info(SCHEDULES, subjects_filter=pattern))
    return dict(info.state.subjects or {})


async def list_schedules(js: Any) -> list[Listed]:
    """Every schedule stored (active and paused; an `at` that fired is gone), by name."""
    defs = await _subjects(js, SCHEDULE_FILTER)
    fires = await _subjects(js, FIRE_FILTERS[0])
    out: list[Listed] = []
    for subject in sorted(defs):
        name = subject.rsplit(".", 1)[1]
        schedule = await get_schedule(js, name)
        if schedule is not None:
            out.append(Listed(schedule, fires.get(fire_subject(name), 0)))
    return out


async def schedule_wake(js: Any, wake: WakeUp, due: float) -> None:
    """Ask the cluster to wake `wake`'s timer at `due` (idempotent: one Msg-Id per timer)."""
    await _call(f"timer {wake.call_id}", lambda: js.publish(
        timer_subject(wake.call_id), wake.encode(), headers=wake.headers(due, wake_subject(wake.call_id))))


async def cancel_wake(js: Any, call_id: str) -> None:
    """Forget the wake-up of the timer of `call_id`: its schedule, and its fire if it already fired."""
    for subject in (timer_subject(call_id), wake_subject(call_id)):
        await _purge(js, subject, f"timer {call_id}")


__all__ = ["NO_STREAM", "Listed", "ScheduleExists", "cancel_wake", "delete_schedule", "get_schedule",
           "list_schedules", "put_schedule", "schedule_wake", "set_paused"]
