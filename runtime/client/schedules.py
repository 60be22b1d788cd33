"""Schedules from an outside process: `client.schedules.add / list / get / pause / resume / delete`.

    await client.schedules.add("digest", "reporter", "Summarise yesterday.", cron="0 0 8 * * *",
                               tz="Europe/Paris")
    await client.schedules.add("poll", "watcher", "Check the queue.", every="30s", catch_up="none")
    for listed in await client.schedules.list(): print(listed.schedule.when, listed.waiting)
    await client.schedules.pause("poll"); await client.schedules.resume("poll")
    await client.schedules.delete("poll")

A schedule is kept by the cluster (the SCHEDULES stream, `runtime.schedules`): each of its instants makes
a fire, which a host turns into a task for the schedule's agent with a task id derived from the schedule
and the fire, so each fire is one run. This is what `sa schedule` does.
"""

from __future__ import annotations

from typing import Any

from runtime.client.control import operator
from runtime.schedules import (
    DEFAULT_CATCH_UP,
    DEFAULT_GRACE_S,
    Listed,
    Schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    make_schedule,
    put_schedule,
    set_paused,
)


class Schedules:
    """The fleet's schedules (see the module docstring). Errors: `runtime.schedules.ScheduleError` (what to
    fix; `ScheduleExists` for a name taken by another schedule), `LookupError` for a name that has none."""

    def __init__(self, js: Any) -> None:
        self.js = js

    async def add(self, name: str, agent: str, input: str, *, cron: str | None = None,
                  every: str | int | None = None, at: str | None = None, tz: str | None = None,
                  instance: str | None = None, thread: str | None = None, catch_up: str = DEFAULT_CATCH_UP,
                  grace: float = DEFAULT_GRACE_S, replace: bool = False, paused: bool = False) -> Schedule:
        """Store a schedule (exactly one of `cron`, `every`, `at`) and return it as stored; adding the same
        schedule again changes nothing."""
        schedule = make_schedule(name, agent, input, cron=cron, every=every, at=at, tz=tz, instance=instance,
                                 thread=thread, catch_up=catch_up, grace_s=grace, paused=paused,
                                 origin=f"added by {operator()}")
        await put_schedule(self.js, schedule, replace=replace)
        return await get_schedule(self.js, name) or schedule

    async def list(self) -> list[Listed]:
        """Every schedule (active and paused), by name, with how many of its fires wait for a host."""
        return await list_schedules(self.js)

    async def get(self, name: str) -> Schedule | None:
        return await get_schedule(self.js, name)

    async def pause(self, name: str) -> Schedule:
        """No fire until resumed (fires already made still run)."""
        return await set_paused(self.js, name, True)

    async def resume(self, name: str) -> Schedule:
        return await set_paused(self.js, name, False)

    async def delete(self, name: str) -> bool:
        """Delete the schedule and its fires not yet taken; False if there was none."""
        return await delete_schedule(self.js, name)


__all__ = ["Schedules"]
