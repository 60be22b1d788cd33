"""Everything waiting, on one page: what is stuck, and why.

    await Pending(client).read()   # approvals, tool jobs in flight, unfinished runs, and the stuck ones

Four sources, each read through the client as `sa` reads it:

* calls waiting for a person (`Client.approvals`, what `sa approvals` lists), decided from the page, and
  questions runs ask a person (`Client.questions`, what `sa questions` lists), answered from the page;
* tool jobs not done yet (`Client.tool_work`: the TOOLS work queue, whether each was delivered, and why
  its earlier deliveries ended where a worker recorded it), next to the workers that serve the tool and
  their heartbeats' ages (`Client.status`); a job's worker is not known while it runs (a worker says
  which job it ran only with the outcome), so the page names the workers that may hold it (every worker
  takes every job: one whose tool it lacks is answered as an unknown tool, so only a fleet with no worker
  at all leaves a job waiting for ever);
* runs not finished (the runs index), each with what it waits for, read from its events (`waiting_on`):
  the model, a tool call, a person, a timer (a sleeping run, and when it wakes), or nothing recorded for
  a while;
* tasks waiting for an agent no live host serves (`Client.status`'s `unserved_agents`).

`stuck` picks out of these what needs a person's eyes, each with a sentence saying why: a job given back
or delivered again, a job while no worker runs at all, a run waiting longer than `SLOW_S`
for the model or a tool, a timer that has not fired `SLOW_S` after it was due, a run with no event for
that long and nothing in flight (a sleeping run waits for its timer, not for its host), tasks no host takes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio

from runtime import events as ev
from runtime import kernel
from runtime.client import Client
from runtime.client.work import QueuedJob, ToolWork
from runtime.nats.connection import explain_refusal
from runtime.nats.records import RunIndex
from runtime.timers import iso
from runtime.ui import views

SLOW_S = 60.0  # a wait longer than this is listed as stuck
REFUSED_RETRY_S = 60.0  # how long a refused read of TOOLS is not tried again (each try waits for a timeout)
MAX_RUNS = 200  # unfinished runs whose events one read looks at (the most recently updated)
READ_CONCURRENCY = 8


def _short(call_id: str) -> str:
    return call_id.rsplit("/", 1)[-1]


def waiting_on(events: Sequence[ev.Event]) -> list[dict[str, Any]]:
    """What an unfinished run waits for, from its events: each open model request, tool call, approval,
    question and timer with when it began (a timer also says when it is due); a run waiting for nothing in
    flight waits for its host to act."""
    requests: dict[str, ev.ModelRequested] = {}
    calls: dict[str, ev.ToolCalled] = {}
    asked: dict[str, ev.ApprovalRequested] = {}
    questions: dict[str, ev.QuestionAsked] = {}
    timers: dict[str, ev.TimerStarted] = {}
    for e in events:
        if isinstance(e, ev.ModelRequested):
            requests[e.request_id] = e
        elif isinstance(e, ev.ModelResponded | ev.ModelFailed):
            requests.pop(e.request_id, None)
        elif isinstance(e, ev.ToolCalled):
            calls[e.call.id] = e
        elif isinstance(e, ev.QuestionAsked):
            questions[e.call_id] = e
        elif isinstance(e, ev.QuestionAnswered):
            questions.pop(e.call_id, None)
        elif isinstance(e, ev.ApprovalRequested):
            asked[e.call.id] = e
        elif isinstance(e, ev.TimerStarted):
            timers[e.call_id] = e
        elif isinstance(e, ev.ToolCompleted | ev.ToolFailed):  # a call's end ends all it waited for
            for open_ in (calls, asked, questions, timers):
                open_.pop(e.call_id, None)
        elif isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied):
            asked.pop(e.call_id, None)
        elif isinstance(e, ev.TimerFired):
            timers.pop(e.call_id, None)
    out = (_open_requests(requests) + _open_calls(calls) + _open_approvals(asked) + _open_questions(questions)
           + _open_timers(timers))
    return sorted(out, key=lambda w: w["since"])


def _open_requests(requests: dict[str, ev.ModelRequested]) -> list[dict[str, Any]]:
    return [{"what": "model", "since": r.ts, "seq": r.seq,
             "detail": f"turn {r.turn}" + (f", attempt {r.attempt + 1}" if r.attempt else "")}
            for r in requests.values()]


def _open_calls(calls: dict[str, ev.ToolCalled]) -> list[dict[str, Any]]:
    return [{"what": "tool", "since": c.ts, "seq": c.seq, "call": _short(c.call.id), "call_id": c.call.id,
             "tool": c.call.name, "detail": f"{c.call.name} (call {_short(c.call.id)})"}
            for c in calls.values()]


def _open_approvals(asked: dict[str, ev.ApprovalRequested]) -> list[dict[str, Any]]:
    return [{"what": "approval", "since": a.ts, "seq": a.seq, "call": _short(a.call.id), "tool": a.call.name,
             "detail": f"{a.call.name} (call {_short(a.call.id)})" + (f", role {a.role}" if a.role else "")}
            for a in asked.values()]


def _open_questions(questions: dict[str, ev.QuestionAsked]) -> list[dict[str, Any]]:
    return [{"what": "question", "since": q.ts, "seq": q.seq, "call": _short(q.call_id),
             "detail": f"an answer (call {_short(q.call_id)})"} for q in questions.values()]


def _open_timers(timers: dict[str, ev.TimerStarted]) -> list[dict[str, Any]]:
    return [{"what": "timer", "since": t.ts, "seq": t.seq, "call": _short(t.call_id), "tool": t.tool,
             "until": t.due, "detail": f"{t.tool} until {iso(t.due)} (call {_short(t.call_id)})"}
            for t in timers.values()]


def job_view(q: QueuedJob, now: float, workers: list[dict[str, Any]]) -> dict[str, Any]:
    """One tool job for the page: its run and call, how long it has been in the queue, its deliveries, the
    last recorded failure, and the live workers serving its tool (with their heartbeats' ages)."""
    job = q.job
    tool = job.tool if job is not None else q.subject.removeprefix("tools.")
    serving = [{"name": w["name"], "beat_age_s": w["beat_age_s"], "running": w["running"]}
               for w in workers if tool in w["tools"]]
    failures = [{"delivery": n, "why": why} for n, why in sorted(q.given_back.items())]
    return {"seq": q.seq, "tool": tool, "run_id": job.run_id if job else None,
            "actor": job.actor if job else None,
            "call": _short(job.call_id) if job else None, "state": "held" if q.delivered else "waiting",
            "published": q.published, "age_s": round(now - q.published, 1) if q.published else None,
            "deliveries": q.deliveries, "given_back": failures,
            "last_failure": failures[-1]["why"] if failures else None,
            "deadline": job.deadline if job else None, "workers": serving, "readable": job is not None}


def stuck(jobs: list[dict[str, Any]], runs: list[dict[str, Any]], unserved: dict[str, int], now: float,
          workers: int) -> list[dict[str, Any]]:
    """What needs a person's eyes, each with why (see the module docstring); `workers` is how many live
    workers there are (any worker takes every job: one for a tool it lacks is answered `unknown tool`)."""
    out: list[dict[str, Any]] = []
    for j in jobs:
        where = {"run_id": j["run_id"], "tool": j["tool"], "job": j["seq"]}
        if j["given_back"]:
            out.append({**where, "kind": "job-given-back",
                        "why": f"{j['tool']} job was given back {len(j['given_back'])} time(s), last: "
                               f"{j['last_failure']}"})
        if not workers:
            out.append({**where, "kind": "job-no-worker",
                        "why": f"no worker is running: the {j['tool']} job waits for one (start `sa worker` "
                               "with the bundle that has the tool)"})
        elif j["state"] == "waiting" and (j["age_s"] or 0) > SLOW_S:
            out.append({**where, "kind": "job-waiting",
                        "why": f"{j['tool']} job waits {j['age_s']:.0f} s for a worker: the workers "
                               "serving it are busy (see their jobs in flight)"})
    for r in runs:
        for w in r["waiting_on"]:
            age = now - w["since"]
            if w["what"] == "timer":
                if now - w["until"] > SLOW_S:
                    out.append({"run_id": r["run_id"], "kind": "timer-overdue",
                                "why": f"{w['detail']} was due {now - w['until']:.0f} s ago and has not "
                                       "fired: no live host serves the agent, or its wake-up was lost (the "
                                       "next host to take the run's partition wakes it)"})
            elif w["what"] not in ("approval", "question") and age > SLOW_S:
                out.append({"run_id": r["run_id"], "kind": f"slow-{w['what']}",
                            "why": f"waits {age:.0f} s for "
                                   f"{'the model' if w['what'] == 'model' else w['detail']}"})
        if not r["waiting_on"] and r["idle_s"] is not None and r["idle_s"] > SLOW_S:
            out.append({"run_id": r["run_id"], "kind": "run-idle",
                        "why": f"no event for {r['idle_s']:.0f} s and nothing in flight: is its host alive "
                               "(see the fleet)?"})
    for agent, waiting in sorted(unserved.items()):
        out.append({"agent": agent, "kind": "agent-unserved",
                    "why": f"{waiting} task(s) for {agent} wait: no live host serves it"})
    return out


class Pending:
    """The pending page's read over one client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._reads = anyio.Semaphore(READ_CONCURRENCY)
        self._refused: tuple[float, str] | None = None  # (until when, why) TOOLS is not read again

    async def tool_work(self, now: float) -> tuple[ToolWork, str | None]:
        """The jobs in TOOLS, or none and why: the operator role may not read TOOLS' messages (a worker's
        queue), so its inspector lists no job and says so, and the rest of the page still answers."""
        if self._refused is not None and now < self._refused[0]:
            return ToolWork([], False, None), self._refused[1]
        try:
            return await self.client.tool_work(), None
        except Exception as e:
            why = explain_refusal(e) or f"{type(e).__name__}: {e}"
            self._refused = (now + REFUSED_RETRY_S, f"the tool jobs cannot be read: {why}")
            return ToolWork([], False, None), self._refused[1]

    async def _run(self, run_id: str, entry: RunIndex, now: float) -> dict[str, Any]:
        async with self._reads:
            events = (await self.client.get(run_id, entry.actor or None).stored()).events
        last = events[-1].ts if events else None
        return {"run_id": run_id, "actor": entry.actor, "status": entry.status, "updated": entry.updated,
                "started": events[0].ts if events else None, "last_event": last,
                "idle_s": round(now - last, 1) if last else None, "waiting_on": waiting_on(events),
                "flags": views.flag_views(views.flags(events))}

    async def runs(self, now: float) -> tuple[list[dict[str, Any]], int]:
        index = await self.client.index()
        open_ = sorted(((k, e) for k, e in index.items() if e.status not in kernel.TERMINAL),
                       key=lambda kv: kv[1].updated, reverse=True)
        out: list[dict[str, Any]] = []

        async def one(run_id: str, entry: RunIndex) -> None:
            out.append(await self._run(run_id, entry, now))

        async with anyio.create_task_group() as tg:
            for run_id, entry in open_[:MAX_RUNS]:
                tg.start_soon(one, run_id, entry)
        return sorted(out, key=lambda r: r["started"] or 0), len(open_)

    async def read(self) -> dict[str, Any]:
        now = time.time()
        status = await self.client.status()
        work, unreadable = await self.tool_work(now)
        jobs = [job_view(q, now, status["workers"]) for q in work.jobs]
        runs, total = await self.runs(now)
        approvals = [p.to_json(now) for p in await self.client.approvals()]
        questions = [q.to_json(now) for q in await self.client.questions()]
        unserved = status.get("unserved_agents") or {}
        sleeping = sum(1 for r in runs if any(w["what"] == "timer" for w in r["waiting_on"]))
        return {"now": now, "approvals": approvals, "questions": questions, "sleeping": sleeping,
                "tool_jobs": jobs,
                "tool_jobs_truncated": work.truncated,
                "tool_jobs_unreadable": unreadable,
                "ack_wait": work.ack_wait, "runs": runs, "runs_total": total,
                "runs_truncated": total > MAX_RUNS,
                "workers": status["workers"], "dead_letters": status["queues"]["dlq"],
                "unserved_agents": unserved,
                "stuck": stuck(jobs, runs, unserved, now, len(status["workers"]))}


__all__ = ["MAX_RUNS", "SLOW_S", "Pending", "job_view", "stuck", "waiting_on"]
