"""A run asleep on a timer (or waiting for an answer): its wake-ups, scheduled in the cluster and deleted if
the run ends first.

The driver (`runtime.host.driver`) parks a run whose only pending work is timers (`kernel.sleeping_until`):
it schedules each timer's wake-up here (an ``@at`` message schedule on SCHEDULES, `runtime.schedules`), and
lets the run go; the host indexes it as ``sleeping until <T>``, and its ``active`` entry says when it wakes,
so a takeover leaves it alone until then (and folds it once due, should its wake-up have been lost: a host
folding a run past its instant fires the timer at once). At the instant the server republishes the
wake-up, a host turns it into a `Wake` command on the run's partition (`runtime.host.scheduler`), and the
host serving it folds the run back and records `timer.fired` (`runtime.host.routing`).

Crash-safe in every order: `timer.started` is durable before its wake-up is scheduled; the wake-up is
scheduled before the run's ``active`` entry says it sleeps (a host that dies between has the run
recovered, which schedules the wake-up again: one Msg-Id per timer); a folded-back run's entry says it is
awake before the wake is applied. A run that ends with a timer still pending (a cancel) has its wake-up
deleted.

A run waiting for a person's answer (`ask_human`, `runtime.driver.inputs`) is parked the same way, indexed as
``waiting for an answer``: its wake-up is at its question's timeout or the task's deadline, whichever is
first; with neither, its ``active`` entry says it wakes never (``inf``), and only the answer (or a cancel)
folds it back.
"""

from __future__ import annotations

import logging
from typing import Any

from runtime import kernel
from runtime.nats.retry import retrying
from runtime.schedules import ScheduleError, WakeUp, cancel_wake, schedule_wake

log = logging.getLogger("runtime.host")

RETRY_S = 0.25


async def schedule_wakes(js: Any, actor: str, run_id: str, timers: tuple[tuple[str, float], ...],
                         scheduled: set[str]) -> None:
    """Schedule the wake-up of each of `timers` ((call id, due)) not in `scheduled`, and add it there."""
    for call_id, due in timers:
        if call_id in scheduled:
            continue
        wake = WakeUp(actor, run_id, call_id)

        async def publish(wake: WakeUp = wake, due: float = due) -> None:
            await schedule_wake(js, wake, due)

        await retrying(publish, what=f"run {run_id}: scheduling the wake-up of {call_id}", delay=RETRY_S,
                       logger=log, fatal=ScheduleError)
        scheduled.add(call_id)


async def forget_wakes(js: Any, run_id: str, state: kernel.State) -> None:
    """Delete the wake-ups of the timers a run that ended never fired, and of its questions never answered."""
    turn = state.turn
    waited = [*turn.timers, *turn.questions] if turn is not None else []
    for call_id in [c for c in waited if turn is not None and c not in turn.results]:
        async def purge(call_id: str = call_id) -> None:
            await cancel_wake(js, call_id)

        await retrying(purge, what=f"run {run_id}: deleting the wake-up of {call_id}", delay=RETRY_S,
                       logger=log, give_up=30.0)


__all__ = ["forget_wakes", "schedule_wakes"]
