"""The schedules page: every schedule the cluster keeps, and the runs its fires started.

    await ScheduleList(client).read()

A schedule is read as `sa schedule list` reads it (`Client.schedules`); its runs are found in the runs
index by their task id, which a fire derives from the schedule's name and its tick
(`runtime.schedules.fired_by`), so linking a schedule to its runs reads no event. Each schedule shows how
its runs ended (counts by status) and its newest `RUNS_SHOWN` runs, newest first, each with the tick that
started it; a run whose fire is still waiting for a host is counted in `waiting`, not yet a run.

A fleet whose SCHEDULES stream does not exist yet, or a user the server does not let read it, gets an
empty list and the sentence saying why, and the rest of the inspector answers as before.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from runtime.client import Client
from runtime.nats.connection import explain_refusal
from runtime.nats.records import RunIndex
from runtime.schedules import Listed, ScheduleError, fired_by

RUNS_SHOWN = 10  # a schedule's newest runs the page lists
INPUT_SHOWN = 300  # characters of a schedule's input the page gets


def schedule_view(listed: Listed, index: dict[str, RunIndex]) -> dict[str, Any]:
    """One schedule for the page: what it starts and when, and the runs its fires started (from `index`,
    the runs index by run id)."""
    s = listed.schedule
    runs: list[dict[str, Any]] = [{"run_id": run_id, "status": e.status, "updated": e.updated, "fire": key}
                                  for run_id, e in index.items()
                                  if e.actor == s.actor and (key := fired_by(s.name, e.task_id)) is not None]
    runs.sort(key=lambda r: float(r["updated"]), reverse=True)
    statuses = Counter(r["status"] for r in runs)
    return {"name": s.name, "agent": s.agent, "actor": s.actor, "when": s.when, "pattern": s.pattern,
            "tz": s.tz, "paused": s.paused, "catch_up": s.catch_up, "grace_s": s.grace_s,
            "origin": s.origin, "thread": s.thread, "input": s.input[:INPUT_SHOWN],
            "input_cut": len(s.input) > INPUT_SHOWN, "waiting": listed.waiting, "runs_total": len(runs),
            "statuses": dict(statuses), "runs": runs[:RUNS_SHOWN],
            "last_fire": runs[0]["fire"] if runs else None}


class ScheduleList:
    """The schedules page's read over one client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def read(self) -> dict[str, Any]:
        now = time.time()
        try:
            listed = await self.client.schedules.list()
        except ScheduleError as e:  # no SCHEDULES stream yet: say how to get one
            return {"now": now, "schedules": [], "unreadable": str(e)}
        except Exception as e:
            why = explain_refusal(e)
            if why is None:
                raise
            return {"now": now, "schedules": [], "unreadable": f"the schedules cannot be read: {why}"}
        index = await self.client.index() if listed else {}
        views = [schedule_view(one, index) for one in sorted(listed, key=lambda s: s.schedule.name)]
        return {"now": now, "schedules": views, "unreadable": None}


__all__ = ["RUNS_SHOWN", "ScheduleList", "schedule_view"]
