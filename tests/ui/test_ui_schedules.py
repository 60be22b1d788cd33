"""The inspector's schedules page and the sleeping runs on its pending page: which runs a schedule's fires
started (found by task id, exactly, although names may hold `-`), a timer a run sleeps on listed with when
it wakes (and flagged once overdue, never as an idle run); then the page's read over real HTTP on a real
nats-server whose schedule fires a real host's runs, linked from the schedule and found by the index's
search.

Evidence is order and content, never elapsed time: which runs exist, what the page lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from host_helpers import hosts, write_bundle
from ui_helpers import serving

from runtime import events as ev
from runtime.client import Client
from runtime.host.leases import LeaseConfig
from runtime.nats.records import RunIndex
from runtime.nats.topology import ensure_topology
from runtime.schedules import Listed, fired_by, make_schedule
from runtime.testing import ScriptedModelServer
from runtime.timers import iso
from runtime.types import ToolCall
from runtime.ui import pending
from runtime.ui.app import create_app
from runtime.ui.schedules import RUNS_SHOWN, schedule_view

T0 = 1_900_000_000.0


def test_a_fires_task_id_names_its_schedule_exactly():
    assert fired_by("tick", "schedule-tick-2030-01-01T08:00:00Z") == "2030-01-01T08:00:00Z"
    assert fired_by("tick", "schedule-tick-before-2030-01-01T08:05:00Z") == "before-2030-01-01T08:05:00Z"
    assert fired_by("tick", "schedule-tick-seq-42") == "seq-42"
    # `tick` does not claim the fires of `tick-b`, nor tasks that only look alike
    assert fired_by("tick", "schedule-tick-b-2030-01-01T08:00:00Z") is None
    assert fired_by("tick-b", "schedule-tick-b-2030-01-01T08:00:00Z") == "2030-01-01T08:00:00Z"
    assert fired_by("tick", "schedule-tick-") is None and fired_by("tick", "t-1") is None
    assert fired_by("tick", None) is None


def test_a_schedules_view_lists_its_runs_newest_first_and_counts_how_they_ended():
    tick = make_schedule("tick", "calc", "compute: 1 + 1", every="30s")
    index: dict[str, RunIndex] = {}
    for i in range(RUNS_SHOWN + 2):  # more runs than the page lists
        key = iso(T0 + 30 * i)
        index[f"r{i}"] = RunIndex(status="failed" if i == 3 else "completed", actor="calc", partition=0,
                                  updated=T0 + 30 * i + 1, task_id=f"schedule-tick-{key}")
    index["other-schedule"] = RunIndex(status="completed", actor="calc", partition=0, updated=T0,
                                       task_id=f"schedule-tick-b-{iso(T0)}")
    index["by-hand"] = RunIndex(status="completed", actor="calc", partition=0, updated=T0, task_id="t-1")
    index["other-actor"] = RunIndex(status="completed", actor="calc:x", partition=0, updated=T0,
                                    task_id=f"schedule-tick-{iso(T0)}")
    view = schedule_view(Listed(tick, waiting=2), index)
    assert view["runs_total"] == RUNS_SHOWN + 2
    assert view["statuses"] == {"completed": RUNS_SHOWN + 1, "failed": 1}
    assert [r["run_id"] for r in view["runs"]] == [f"r{i}" for i in range(RUNS_SHOWN + 1, 1, -1)]
    assert view["last_fire"] == iso(T0 + 30 * (RUNS_SHOWN + 1)) == view["runs"][0]["fire"]
    assert (view["when"], view["waiting"], view["paused"], view["actor"]) == ("every 30s", 2, False, "calc")


def _sleeping_run(due: float) -> list[ev.Event]:
    call = ToolCall("r1/1.0", "sleep", {"seconds": due - T0})
    timed: list[ev.Event] = [
        ev.RunStarted(run_id="r1", input="nap"),
        ev.ModelRequested(run_id="r1", request_id="r1/1", turn=1),
        ev.ModelResponded(run_id="r1", request_id="r1/1", turn=1, calls=(call,)),
        ev.TimerStarted(run_id="r1", call_id=call.id, tool="sleep", due=due),
    ]
    return [ev.stamp(e, seq=i, ts=T0, actor="napper") for i, e in enumerate(timed)]


def test_a_sleeping_run_waits_for_its_timer_and_is_flagged_only_once_overdue():
    due = T0 + 3600
    events = _sleeping_run(due)
    [wait] = pending.waiting_on(events)
    assert (wait["what"], wait["until"], wait["tool"]) == ("timer", due, "sleep")
    assert iso(due) in wait["detail"]
    run = {"run_id": "r1", "waiting_on": [wait], "idle_s": 3000.0}
    # an hour asleep with nothing in flight is not an idle run: it waits for its timer
    assert pending.stuck([], [run], {}, now=T0 + 3000, workers=1) == []
    [late] = pending.stuck([], [run], {}, now=due + pending.SLOW_S + 1, workers=1)
    assert late["kind"] == "timer-overdue" and "has not fired" in late["why"]
    fired = ev.stamp(ev.TimerFired(run_id="r1", call_id="r1/1.0", by="schedule"), seq=4, ts=due,
                     actor="napper")
    assert pending.waiting_on([*events, fired]) == []


def answer(body: dict[str, Any]) -> str:
    return "done"


async def _until(check: Any, timeout: float = 30.0) -> Any:
    import anyio

    with anyio.fail_after(timeout):
        while not (value := await check()):
            await anyio.sleep(0.05)
    return value


@pytest.mark.anyio
async def test_the_schedules_page_links_each_schedule_to_the_runs_it_started(nc, js, tmp_path: Path):
    await ensure_topology(js, partitions=2)
    client, url = Client(nc), nc.connected_url.geturl()
    app_client = Client(nc)
    with ScriptedModelServer(responder=answer) as server:
        bundle = write_bundle(tmp_path, "calc", tools=(), terminal=None)  # runs end on text
        async with hosts(url, [bundle], server, 1, lease=LeaseConfig(ttl=2.0, renew=0.5)), \
                serving(create_app(client=app_client)) as base, \
                httpx.AsyncClient(base_url=base, timeout=30) as http:
            empty = (await http.get("/api/schedules")).json()
            assert empty["schedules"] == [] and empty["unreadable"] is None
            await client.schedules.add("tick", "calc", "tick tock", every="1s")
            await client.schedules.add("tick-b", "calc", "other", every="1h")  # fires later: no run yet

            async def two_runs() -> Any:
                seen = (await http.get("/api/schedules")).json()
                tick = next(s for s in seen["schedules"] if s["name"] == "tick")
                done = tick["statuses"].get("completed", 0) >= 2
                return seen if done else None

            seen = await _until(two_runs)
            await client.schedules.pause("tick")
            assert [s["name"] for s in seen["schedules"]] == ["tick", "tick-b"]
            tick, other = seen["schedules"]
            assert (tick["when"], tick["actor"], tick["input"]) == ("every 1s", "calc", "tick tock")
            assert other["runs"] == [] and other["runs_total"] == 0  # `tick`'s runs are not `tick-b`'s
            for run in tick["runs"]:
                info = await client.run_info(run["run_id"])
                assert info is not None and info.task_id == f"schedule-tick-{run['fire']}"
            assert (await http.get("/api/schedules")).json()["schedules"][0]["paused"] is True

            # the index's search finds a schedule's runs by their task id's prefix (the page's "all runs")
            found = (await http.get("/api/runs", params={"q": "schedule-tick-"})).json()
            ids = {r["run_id"] for r in found["runs"]}
            assert {r["run_id"] for r in tick["runs"]} <= ids
            page = await http.get("/schedules")
            assert page.status_code == 200 and "/static/schedules.js" in page.text
