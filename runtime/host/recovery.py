"""Recovery: runs a host did not start itself, folded back from their log and driven on.

At every takeover of a slot (`recover`: a partition of a bundle), before consuming anything: read the
partition's unfinished runs from the ``active`` bucket (`runtime.host.runs_index`), keep those of the slot's
bundle (the partition's runs of other bundles are their own hosts') but those asleep on a timer not due yet
(the cluster's wake-up folds them at their instant; one whose instant passed is folded, and wakes at once,
whatever became of its wake-up), fold each run's events
(`log.RunLog.read`; a run in a thread with the conversation it continues, `runtime.log.threads.fold_run`)
and queue it first in its actor's mailbox. `RunDriver` then re-issues only what `kernel.decide` says is
pending: an answered model call is never made again, a job already answered is never re-published, a job
still out is re-published with the same Msg-Id (deduplicated by TOOLS; the workers' ``applied`` markers make
its writes exactly-once beyond the window).

Exactly one host drives a run: the one serving its slot. A stale one that still appends is stopped by
the expected-sequence check (`Superseded`); if the winner of such a race is a host that still serves the
slot, it re-folds the run and goes on (`refold`).

Orphans: a takeover's listing can still miss a run, and a run can lose its driver with nothing left in
flight to bring it back. Seen on machines of their own, the EVENTS leader cut off for 8 s: a host's driver
was re-sending its run's job while TOOLS had no leader; a fence stopped it, the job was never stored, and
when the host took the slot again a moment later its recovery did not fold the run (the ``active`` stream
was itself between leaders then). No outcome would ever come for it, so no later message folded it back
(the outcome path of `runtime.host.routing`), and the run waited for ever at its ``tool.called``. So a host
also looks for orphans every `HostConfig.orphan_check` seconds (`watch_orphans`): a run whose ``active``
entry names a slot this host serves (awake, or due to wake), that no driver and no mailbox here holds,
and that was so at the look before too with the same entry, is folded back and driven. Two looks in a row,
because a run is briefly in neither while its task starts or its recovery folds it. One listing per
partition served, not per slot: the cost does not grow with the bundles a host serves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.commands import split_actor
from runtime.host.actors import Actors, slot_of
from runtime.host.config import HostConfig, HostStats
from runtime.host.driver import RunDriver, host_driver, standing
from runtime.host.leases import Slot
from runtime.host.runs_index import RunsIndex
from runtime.host.served import AgentRuntime
from runtime.log import RunLog
from runtime.log.threads import Conversations, fold_run
from runtime.nats.kv import kv_entries
from runtime.nats.records import parse_active
from runtime.nats.retry import retrying
from runtime.nats.subjects import active_filter

log = logging.getLogger("runtime.host")

RECOVER_RETRY_S = 0.5
ORPHANS_KEPT = 10_000  # at most this many runs remembered from one look for orphans to the next
SUPERSEDED_RETRY_S = 1.0  # after losing an append race in a partition it still owns, re-fold this late


class Recovery:
    """Folds existing runs into drivers and hands them to `actors` (`Actors.resume`)."""

    def __init__(self, js: JetStreamContext, run_log: RunLog, agents: dict[str, AgentRuntime],
                 actors: Actors, index: RunsIndex, config: HostConfig, stats: HostStats, *,
                 serves: Callable[[Slot], bool], on_event: Callable[[ev.Event], Any] | None,
                 conversations: Conversations | None = None, host_id: str = "",
                 holds: Callable[[str, int], bool] | None = None,
                 lease_of: Callable[[Slot], int] | None = None) -> None:
        self.js, self.log, self.agents, self.actors, self.index = js, run_log, agents, actors, index
        self.config, self.stats, self.serves, self.on_event = config, stats, serves, on_event
        self.conversations = conversations
        self.host_id, self.holds, self.lease_of = host_id, holds, lease_of

    async def recover(self, slot: Slot) -> None:
        """Fold every unfinished run of `slot` (the `active` bucket's `p<N>.*` keys whose actor is of the
        slot's bundle) and queue it first in its actor's mailbox: the single-host recovery, per slot, at
        every takeover."""
        bundle, p = slot
        found = await retrying(lambda: self._unfinished(p), delay=RECOVER_RETRY_S, logger=log,
                               what=f"partition {p}: reading its unfinished runs")
        now = time.time()
        todo = [(run_id, actor) for run_id, actor, until, _ in found
                if slot_of(actor, p) == slot and self._to_drive(run_id, until, now)]
        limiter = anyio.CapacityLimiter(self.config.recovery_concurrency)
        resumed: list[RunDriver] = []

        async def one(run_id: str, actor: str) -> None:
            async with limiter:
                driver = await retrying(lambda: self.fold_existing(run_id, actor, p, fence=True),
                                        what=f"run {run_id}: folding it", delay=RECOVER_RETRY_S, logger=log)
            if driver is not None:
                resumed.append(driver)

        async with anyio.create_task_group() as tg:
            for run_id, actor in todo:
                tg.start_soon(one, run_id, actor)
        resumed = [d for d in resumed if d.run_id not in self.actors.drivers]  # refolded meanwhile
        for driver in resumed:
            self.actors.resume(driver)
        self.stats.runs_recovered += len(resumed)
        if todo:
            log.info("partition %d of %s: recovered %d unfinished run(s)", p, bundle, len(resumed))

    async def watch_orphans(self, slots: Callable[[], Iterable[Slot]], stop: anyio.Event) -> None:
        """Every `HostConfig.orphan_check` seconds until `stop`, adopt the orphans of `slots()` (the slots
        served and recovered now; see the module docstring)."""
        every = self.config.orphan_check
        if every is None:
            return
        seen: dict[str, int] = {}
        while not stop.is_set():
            with anyio.move_on_after(every):
                await stop.wait()
            if stop.is_set():
                return
            try:
                seen = await self.adopt_orphans(set(slots()), seen)
            except Exception as e:  # NATS away: the next look
                log.info("looking for runs no driver holds failed (%s: %s); again in %g s", type(e).__name__,
                         e, every)

    async def adopt_orphans(self, slots: set[Slot], seen: dict[str, int]) -> dict[str, int]:
        """Fold back and drive the runs of `slots` no driver or mailbox here holds that `seen` (the last
        look's answer) already had, with the same ``active`` revision; returns this look's answer."""
        unheld: dict[str, int] = {}
        now = time.time()
        for p in sorted({p for _, p in slots}):
            for run_id, actor, until, revision in await self._unfinished(p):
                slot = slot_of(actor, p)
                if slot not in slots or not self._to_drive(run_id, until, now) \
                        or run_id in self.actors.waiting:
                    continue
                if seen.get(run_id) != revision:
                    if len(unheld) < ORPHANS_KEPT:
                        unheld[run_id] = revision
                    continue
                driver = await self.fold_existing(run_id, actor, p, fence=True)
                if driver is None or not self._hand_over(driver, slot):
                    continue  # it was over (its index is fixed now), or taken up meanwhile
                log.warning("run %s: unfinished in partition %d of %s, which this host serves, but nothing "
                            "drove it for %g s or more; folded back from its log", run_id, p, slot[0],
                            self.config.orphan_check)
                self.stats.runs_adopted += 1
        return unheld

    async def _unfinished(self, p: int) -> list[tuple[str, str, float | None, int]]:
        """Partition `p`'s unfinished runs, as its ``active`` keys list them (checked against the stream
        leader): (run id, actor, when it wakes or None, the entry's revision)."""
        entries = await kv_entries(self.index.active, active_filter(p), complete=True)
        return [(key.split(".", 1)[1], *parse_active(entry.value), entry.revision)
                for key, entry in entries.items()]

    def _to_drive(self, run_id: str, until: float | None, now: float) -> bool:
        """Whether an unfinished run is this host's to fold: no driver here holds it, and it is awake or due
        to wake (a run asleep is left in its log until it wakes)."""
        return run_id not in self.actors.drivers and (until is None or until <= now)

    def _hand_over(self, driver: RunDriver, slot: Slot) -> bool:
        """Queue a run folded from its log to be driven here, unless its slot went meanwhile or a driver
        here took the run up first; whether it was queued."""
        if not self.serves(slot) or driver.run_id in self.actors.drivers:
            return False
        self.actors.resume(driver)
        return True

    async def fold_existing(self, run_id: str, actor: str, partition: int, *,
                            fence: bool = False) -> RunDriver | None:
        """A driver for an existing run from its log, or None if it is over (the index is then fixed).

        With `fence` (a takeover, an orphan, a run refolded after a lost race, a run folded back for a
        command or an outcome: another host may have driven it until now), the run is fenced before it is
        driven: `run.taken` is appended expecting the last event this host read, so whichever host drove it
        before is refused by the log at its next append, whether or not this host has done a step yet.
        `Superseded` if that host appended in between (the caller folds again), or if this host cannot
        show it holds the run's slot (`Ports.may_act`): a host that lost its lease fences nobody."""
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None:
            log.error("run %s belongs to %s, which no loaded bundle defines: not resumed", run_id, actor)
            return None
        history = await self.log.read(run_id, actor)
        try:  # a run in a thread folds with the conversation it continues, read from the earlier runs' logs
            state = await fold_run(self.log, agent.config, history.events, cache=self.conversations)
        except (kernel.EvolveError, LookupError) as e:
            log.error("run %s cannot be folded (%s): not resumed", run_id, e)
            return None
        driver = host_driver(self.js, agent, actor, run_id, partition, state=state, last_seq=history.last_seq,
                           on_event=self.on_event, log=self.log, holds=self.holds)
        started = history.events[0] if history.events else None
        if isinstance(started, ev.RunStarted):
            driver.task_id = started.task_id
            driver.thread = started.thread
            driver.priority = started.priority if started.priority is not None else agent.bundle.priority
            if isinstance(started, ev.RunForked):
                driver.forked = (started.source_run, started.source_seq)
            if not state.done and not self._may_resume(run_id, started, agent):
                await driver.end("bundle_changed", _changed(started, agent))
        if driver.state.done:
            await self.index.record(standing(driver))
            return None
        if fence:
            slot = slot_of(actor, partition)
            await driver.append(ev.RunTaken(run_id=run_id, host=self.host_id,
                                            lease=self.lease_of(slot) if self.lease_of is not None else 0))
            await driver.flush()
        return driver

    @staticmethod
    def _may_resume(run_id: str, started: ev.RunStarted, agent: AgentRuntime) -> bool:
        """A run goes on with the bundle it started with; on another version only if the bundle says
        `resume: latest` (its tools, prompt or limits may have changed under it)."""
        if not started.bundle_digest or started.bundle_digest == agent.bundle.digest:
            return True
        if agent.bundle.spec.resume == "latest":
            log.warning("run %s started with bundle %s %s; it goes on with %s (resume: latest)", run_id,
                        agent.bundle.name, started.bundle_digest, agent.bundle.digest)
            return True
        return False

    async def resume(self, run_id: str, actor: str, p: int) -> bool:
        """Drive the existing run `run_id` of partition `p` now (an `events.Resume` command: a fork written
        by a client); False if it has no events. A run already driven here, or over, is left as it is."""
        if run_id in self.actors.drivers:
            return True
        if await self.log.last(run_id, actor) is None:
            return False
        driver = await self.fold_existing(run_id, actor, p)
        if driver is not None and self._hand_over(driver, slot_of(actor, p)):
            self.stats.runs_resumed += 1
        return True

    async def unpark(self, run_id: str, actor: str, p: int) -> RunDriver | None:
        """The driver of run `run_id` of partition `p` for a command that found none (a run asleep on a
        timer, `runtime.host.sleep`): folded from its log and queued first in its actor's mailbox, marked
        `parked` so the host puts it back in ``active`` before it applies anything. None if the run is
        over (its index is then fixed) or not this host's to drive.

        Fenced like a takeover (`run.taken` first): the command or outcome can reach this host before a
        takeover's recovery fenced the run, and another host (one paused past its lease, or with a slow
        clock) may still hold a driver of it; unfenced, that driver's next append would be stored, since
        this one had written nothing yet. `Superseded` if this host may no longer act for the run's slot,
        or another writer appended while it was folded: the caller hands the message back."""
        driver = self.actors.drivers.get(run_id)
        if driver is not None:
            return driver
        driver = await self.fold_existing(run_id, actor, p, fence=True)
        if driver is None:
            return self.actors.drivers.get(run_id)
        driver.parked = True  # set before it is queued: the host indexes it awake before applying anything
        if not self._hand_over(driver, slot_of(actor, p)):
            return self.actors.drivers.get(run_id)
        self.stats.runs_resumed += 1
        return driver

    async def refold(self, run_id: str, actor: str, p: int) -> None:
        """Resume a run after losing an append race in a partition this host still serves (the other
        writer was a stale owner that stops at its next renewal, so fold what it wrote and go on), or after
        its driver was stopped by a fence while the slot was served again (the takeover's recovery may
        have skipped it, still held then)."""
        await anyio.sleep(SUPERSEDED_RETRY_S)
        slot = slot_of(actor, p)
        if not self.serves(slot) or run_id in self.actors.drivers:
            return
        try:
            if await self.log.last(run_id, actor) is None:
                return  # a task stopped before its run started: its redelivery starts it
            driver = await self.fold_existing(run_id, actor, p, fence=True)
        except Exception as e:
            log.error("run %s: folding it back failed (%s); it resumes at the next "
                      "takeover of partition %d of %s", run_id, e, p, slot[0])
            return
        if driver is not None:
            self._hand_over(driver, slot)


def _changed(started: ev.RunStarted, agent: AgentRuntime) -> str:
    return (f"the run started with version {started.bundle_digest} of bundle {agent.bundle.name}; this host "
            f"has version {agent.bundle.digest} ({agent.bundle.path}), and the bundle resumes runs only on "
            "their own version (resume: same-version): send the task again to run it on this version, or "
            "set `resume: latest` in the bundle to let runs go on after a change")


__all__ = ["ORPHANS_KEPT", "SUPERSEDED_RETRY_S", "Recovery"]
