"""The cluster's clock: schedules that start runs, and the wake-ups of runs that sleep.

Both are JetStream message schedules (nats-server 2.12+, ADR-51) on the SCHEDULES stream, so time is kept
by the cluster, not by any host: a schedule fires while every host is down (its fires wait in the stream),
and a sleeping run's wake-up survives the restart of every host.

- `spec`   — `Schedule` and `make_schedule`: what a schedule starts, when (cron, every, at), `catch_up`
- `fires`  — what the server does with them (probed), a fire's identity and task id, whether a late fire
             runs (`skip_reason`), a timer's `WakeUp`
- `store`  — the SCHEDULES stream: put, get, list, pause / resume, delete; schedule and cancel a wake-up

The hosts turn fires into tasks and wake-ups into wake commands (`runtime.host.scheduler`); `sa schedule`
and `Client.schedules` manage schedules (`runtime.client.schedules`).
"""

from runtime.schedules.fires import Fire, WakeUp, fire_of, fired_by, skip_reason
from runtime.schedules.spec import (
    CATCH_UP,
    DEFAULT_CATCH_UP,
    DEFAULT_GRACE_S,
    Schedule,
    ScheduleError,
    make_schedule,
)
from runtime.schedules.store import (
    Listed,
    ScheduleExists,
    cancel_wake,
    delete_schedule,
    get_schedule,
    list_schedules,
    put_schedule,
    schedule_wake,
    set_paused,
)

__all__ = ["CATCH_UP", "DEFAULT_CATCH_UP", "DEFAULT_GRACE_S", "Fire", "Listed", "Schedule", "ScheduleError",
           "ScheduleExists", "WakeUp", "cancel_wake", "delete_schedule", "fire_of", "fired_by",
           "get_schedule", "list_schedules", "make_schedule", "put_schedule", "schedule_wake", "set_paused",
           "skip_reason"]
