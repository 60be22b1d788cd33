"""What the inspector's pages read, through the fleet client (`runtime.client`) and nothing else.

    reads = Reads(client)
    await reads.runs(views.RunFilter.from_query(params), limit=100)   # the runs index
    await reads.run(run_id)                                           # a run's page
    await reads.event(run_id, seq)                                    # one event whole
    await reads.approvals(agent)                                      # calls waiting for a person
    await reads.export(run_id)                                        # the one-file HTML
    await reads.waterfall(run_id)                                     # its time, as the traces' spans
    await reads.conversation(run_id, turn)                            # what the model saw at a turn
    await reads.message(run_id, index)                                # one message whole
    await reads.pending()                                             # everything waiting, and what is stuck
    await reads.fleet()                                               # hosts, workers, queues, dead letters
    await reads.schedules()                                           # schedules and the runs they started
    await reads.agent(name)                                           # a bundle, its hosts, runs, failures
    await reads.regressions()                                         # saved sets and regression reports
    await reads.regression(report_id)                                 # one report, its runs side by side

Why a layer of its own: the routes (`runtime.ui.routes`) speak HTTP and nothing else, and these speak to
the fleet and nothing else, so each can be read, and changed, without the other. Going through `Client` and
`RunHandle` (never the log, the KV buckets or the control subjects directly) means a page sees a run exactly
as `sa` and a program do; the inspector adds nothing to a run's hot path.

The index's filters that look inside runs (tool, error kind, time, search, flags) use a digest of each
run's events (`views.digest`), cached per run and read again only while the run may still grow, so an index
of finished runs is read once. Events are read as stored (`RunHandle.stored`): a big payload is fetched
only when someone opens its event (`event`) or exports the run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.client import Client
from runtime.client.fork import fork_points
from runtime.nats.records import QUEUED, RunIndex
from runtime.nats.subjects import check_token
from runtime.ui import views
from runtime.ui.agent import Agents, NoAgent
from runtime.ui.bundles import Bundles
from runtime.ui.conversation import Conversations, NoConversation
from runtime.ui.export import NoSuchRun, export_run
from runtime.ui.fleet import Fleet
from runtime.ui.pending import Pending
from runtime.ui.schedules import ScheduleList
from runtime.ui.waterfall import waterfall

log = logging.getLogger("runtime.ui")

MAX_SCAN = 5000  # runs whose digests one index request may read when a filter looks inside runs
READ_CONCURRENCY = 8


class NotFound(LookupError):
    """No such run or event; the message says what to look at instead."""


class Reads:
    """The inspector's reads over one client, with the digest cache of the runs index."""

    def __init__(self, source: Client | JetStreamContext) -> None:
        self.client = Client.over(source)
        self.digests: dict[str, views.Digest] = {}
        self._reads = anyio.Semaphore(READ_CONCURRENCY)
        self.bundles = Bundles()
        self.conversations = Conversations(self.client, self.bundles)
        self._pending = Pending(self.client)
        self._fleet = Fleet(self.client)
        self._schedules = ScheduleList(self.client)
        self._agents = Agents(self.client, self.bundles, self)

    # -- the runs index --------------------------------------------------------------------------------

    async def _digest(self, run_id: str, entry: RunIndex) -> views.Digest:
        """The run's digest: cached once it ended (a host rewrites a run's index entry when it starts and
        when it ends, not at every event, so an unfinished run is read again each time)."""
        cached = self.digests.get(run_id)
        if cached is not None and cached.last_seq == entry.last_seq and entry.status in kernel.TERMINAL:
            return cached
        async with self._reads:
            history = await self.client.get(run_id, entry.actor or None).stored()
        d = views.digest(run_id, history.events, entry.last_seq)
        self.digests[run_id] = d
        return d

    async def _digests(self, rows: list[tuple[str, RunIndex]]) -> dict[str, views.Digest]:
        out: dict[str, views.Digest] = {}

        async def one(run_id: str, entry: RunIndex) -> None:
            try:
                out[run_id] = await self._digest(run_id, entry)
            except Exception as e:  # a run whose log cannot be read is listed without its digest
                log.warning("run %s: cannot read its events for the index (%s)", run_id, e)

        async with anyio.create_task_group() as tg:
            for run_id, entry in rows:
                tg.start_soon(one, run_id, entry)
        return out

    async def runs(self, flt: views.RunFilter, limit: int) -> dict[str, Any]:
        """The index rows matching `flt`, newest first (at most `limit`), and the filters' values. Every
        row shown carries its digest (so its flags), read for the rows shown even with no filter."""
        index = await self.client.index()
        for gone in [run_id for run_id in self.digests if run_id not in index]:  # purged since
            del self.digests[gone]
        ordered = sorted(index.items(), key=lambda kv: kv[1].updated, reverse=True)
        candidates = [(k, e) for k, e in ordered if flt.admits_entry(e)]
        scan = candidates[:MAX_SCAN] if flt.needs_events else candidates[:limit]
        digests = await self._digests(scan)
        rows = []
        for run_id, entry in scan:
            d = digests.get(run_id)
            if flt.needs_events and (d is None or not flt.admits(d)):
                continue
            rows.append(views.index_row(run_id, entry, d))
            if len(rows) >= limit:
                break
        return {"runs": rows, "total": len(index), "matched": len(rows),
                "scanned": len(scan), "truncated": flt.needs_events and len(candidates) > MAX_SCAN,
                "facets": views.facets(index.values(), self.digests.values())}

    # -- a run -----------------------------------------------------------------------------------------

    async def run(self, run_id: str) -> dict[str, Any]:
        """A run's page: its events as stored, totals, flags, fork tree, sub-runs and thread."""
        check_token(run_id, "run id")
        history = await self.client.get(run_id).stored()
        index = await self.client.index()
        if not history.events:
            entry = index.get(run_id)
            if entry is not None and entry.status == QUEUED:
                raise NotFound(f"run {run_id!r} is queued behind its agent's run: it has no events until it "
                               "starts")
            raise NotFound(f"no events for run {run_id!r}: pick a run from the index")
        view = views.run_view(run_id, history.actor, history.events, entry=index.get(run_id), index=index,
                              fork_points=fork_points(history.events))
        view["thread"] = await self.thread(history.actor, history.events[0], index)
        return view

    async def thread(self, actor: str, first: ev.Event, index: dict[str, RunIndex]) -> dict[str, Any] | None:
        """The thread a run (whose first event is `first`) belongs to, as its runs in order, or None."""
        if not isinstance(first, ev.RunStarted) or first.thread is None:
            return None
        record = await self.client.thread(actor, first.thread)
        runs = record.runs if record is not None else [first.run_id]
        return {"thread": first.thread, "runs": [
            {"run_id": r, "status": index[r].status if r in index else None} for r in runs]}

    async def event(self, run_id: str, seq: int) -> dict[str, Any]:
        """One event whole: a stub's big fields are fetched from the object store (digest-checked)."""
        check_token(run_id, "run id")
        handle = self.client.get(run_id)
        history = await handle.stored()
        match = [e for e in history.events if e.seq == seq]
        if not match:
            raise NotFound(f"run {run_id!r} has no event {seq} (it has {len(history.events)})")
        return views.event_view(await handle.whole(match[0]), views.start_of(history.events))

    async def approvals(self, agent: str | None = None) -> list[dict[str, Any]]:
        """Every call waiting for a person across runs (of `agent`), oldest first, as `sa approvals
        --json` shows them."""
        now = time.time()
        return [p.to_json(now) for p in await self.client.approvals(agent or None)]

    async def waterfall(self, run_id: str) -> dict[str, Any]:
        """The run's spans on one time axis (`runtime.ui.waterfall`), open ones drawn up to now."""
        check_token(run_id, "run id")
        history = await self.client.get(run_id).stored()
        index = await self.client.index()
        if not history.events:
            entry = index.get(run_id)
            if entry is not None and entry.status == QUEUED:
                raise NotFound(f"run {run_id!r} is queued behind its agent's run: it has no events until it "
                               "starts")
            raise NotFound(f"no events for run {run_id!r}: pick a run from the index")
        entry = index.get(run_id)
        return {"run_id": run_id, "actor": history.actor, "status": entry.status if entry else None,
                "flags": views.flag_views(views.flags(history.events)),
                **waterfall(history.events, now=time.time())}

    async def conversation(self, run_id: str, turn: int | None) -> dict[str, Any]:
        """What the model saw at `turn` (None: the whole conversation), `runtime.ui.conversation`."""
        try:
            return await self.conversations.read(run_id, turn)
        except NoConversation as e:
            raise NotFound(str(e)) from None

    async def message(self, run_id: str, index: int) -> dict[str, Any]:
        """Message `index` of the run's conversation whole (a big payload fetched from the object store)."""
        try:
            return await self.conversations.message(run_id, index)
        except NoConversation as e:
            raise NotFound(str(e)) from None

    # -- the team's pages --------------------------------------------------------------------------------

    async def pending(self) -> dict[str, Any]:
        """Calls waiting for a person, tool jobs in flight, unfinished runs, and what is stuck and why."""
        return await self._pending.read()

    async def fleet(self) -> dict[str, Any]:
        """Hosts, partitions, workers, queue depths and dead letters (`sa status` and `sa dlq`)."""
        return await self._fleet.read()

    async def schedules(self) -> dict[str, Any]:
        """Every schedule (`sa schedule list`) with the runs its fires started."""
        return await self._schedules.read()

    async def regressions(self) -> dict[str, Any]:
        """The saved regression sets and the reports kept in the fleet, newest first
        (`Client.regressions`)."""
        return await self.client.regressions()

    async def regression(self, report_id: str) -> dict[str, Any]:
        """One saved regression report, rows included: each source run beside its regression run."""
        from runtime.regress.saved import NoReport

        try:
            return await self.client.regression_report(report_id)
        except NoReport as e:
            raise NotFound(str(e)) from None

    async def agent(self, name: str) -> dict[str, Any]:
        """An agent's bundle, the hosts serving it, its runs and its failure kinds over time."""
        try:
            return await self._agents.read(name)
        except NoAgent as e:
            raise NotFound(str(e)) from None

    async def export(self, run_id: str) -> str:
        """The run as one self-contained HTML file (`runtime.ui.export`)."""
        try:
            return await export_run(self.client, run_id)
        except NoSuchRun as e:
            raise NotFound(str(e)) from None


__all__ = ["MAX_SCAN", "NotFound", "Reads"]
