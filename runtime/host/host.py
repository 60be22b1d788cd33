"""The agent host: bundles become agents, tasks become runs, runs are driven to their end across crashes.

How a task flows
----------------
1. A publisher puts a task on ``agents.<agent>.tasks`` (format: `runtime.commands`); TASKS stores it
   as ``tasks.<p>.<agent>...<bundle>`` (`runtime.nats.subjects`). What a host serves is slots: a slot is one
   partition of one bundle it loaded. It consumes each slot through ONE durable consumer (plus one on
   RESULTS) that takes only that bundle's subjects, whatever the number of agents (instances): 10,000
   instances cost 2N consumers per bundle, never 10,000. Which slots: for each bundle, a fair share of its
   partitions among the live hosts serving that bundle, held by expiring leases (`runtime.host.leases`), or
   a fixed list of partitions (`HostConfig.partitions`). So hosts serving different bundles share a cluster
   and never take each other's tasks; a task for an agent no live host serves waits in TASKS
   (`runtime.host.unserved`).
2. The task goes into its actor's mailbox. An actor is ``<bundle>`` or ``<bundle>:<instance>``; it exists
   only while it has work (an idle agent is a dict entry nobody created), runs one task at a time in
   arrival order, and runs concurrently with every other actor.
3. Its turn: the run id is derived from the task (`commands.run_id_for`), ``run.started`` is appended
   (expected last sequence 0: only the first start lands), the ``runs`` KV index says ``running``, and
   THEN the task message is acked. `RunDriver` drives the kernel: model calls here, tool calls as jobs on
   TOOLS, outcomes back from RESULTS as ``tool.*`` events (each carrying its script run), until the run
   ends; the index then says how it ended.

Ack points, and why
-------------------
* Task: acked once ``run.started`` is in the log and the run is indexed — not when the run ends. From then
  on the log owns the task: a host that dies mid-run is recovered from the index and the log, so holding
  the task message for minutes (and heartbeating it) would buy nothing. A host that dies *before* the
  append never acked: the task is redelivered after AckWait and runs as if new. A host that dies between
  the append and the ack gets the task again: the derived run id finds the existing run, which is resumed
  (or, if it ended, the task is simply acked). Tasks waiting in a mailbox stay un-acked, so a crash loses
  none of them; a redelivery of one already waiting replaces it in place (same stream sequence), keeping
  the order.
* RESULTS: acked after the outcome's events are appended (or found to change nothing).
* Commands (cancel/approve/deny): acked after their event is appended; a command for a run that does not
  exist is logged and terminated.

Slots, takeover and recovery
----------------------------
A host serves a slot from the moment it takes it (at start, or when it wins its lease) until it gives it up
(released to a new host, lease expired, or fenced because renewals failed): `runtime.host.partitions` says
what taking and losing one involves, and `runtime.host.recovery` how a taken slot's unfinished runs are
folded from their log and driven on. Exactly one host drives a run: the one serving its slot (its bundle's
share of its partition); a stale one that still appends is stopped by the log's expected-sequence check
(`Superseded`).

Back-pressure
-------------
`HostConfig.max_runs` bounds what a host holds in memory: runs it drives plus tasks waiting in mailboxes.
Each task message takes one unit of a `runtime.nats.pull.Budget` shared by every slot's task consumer; a
pull request never asks for more than the budget's free room, so at the bound the host stops pulling and
a flood of tasks waits in the TASKS stream (on disk, acked to its publishers) instead of in
the host; the task consumers' MaxAckPending is the same bound, on the server side. Runs recovered at a
takeover take units without waiting (they are already started), so pulls pause until they end.

Bad input
---------
A message that is not a command (`commands.BadCommand`): logged with the reason and terminated — never
redelivered, never stopping the host. A task for an agent no live host serves waits in TASKS for one; once
none has served it for `HostConfig.unserved_after`, the sweeping host (`runtime.host.unserved`) creates
its run with ``run.started`` then ``run.failed`` (reason ``unknown_agent``, naming the agents served), so
the publisher following the run id sees why, and acks the task. A task whose actor names no bundle this
host loaded although its slot's consumer delivered it (an actor such as ``:x``) fails the same way here.

Where each part lives
---------------------
`Host` (here) assembles the parts and does what a turn is: start a task's run (`_start`), drive a run
(`_drive`), fail a task for an unknown agent (`_unknown_agent`). The parts, each given only what it needs:

- `runtime.host.config`      `HostConfig`, `HostStats`
- `runtime.host.partitions`  `Partitions`: taking and losing a slot, its consumers; `Guarded` messages
- `runtime.host.routing`     `Router`: a task-subject message to its actor or run, an outcome to its driver
- `runtime.host.actors`      `Actors`: mailboxes, one task at a time per actor, the runs held (`drivers`)
- `runtime.host.recovery`    `Recovery`: folding existing runs at a takeover or after a lost append race
- `runtime.host.runs_index`  `RunsIndex`: the ``runs`` index and the ``active`` bucket
- `runtime.host.driver`      `host_driver`: the one run driver (`runtime.driver`) with the fleet's ports
- `runtime.host.unserved`    `Unserved`: tasks of agents no live host serves, failed after a wait
- `runtime.host.scheduler`   `Scheduler`: the cluster's clock turned into tasks (schedules' fires) and wake
                             commands (sleeping runs' timers); a bundle's `schedules:` stored at start
- `runtime.host.sleep`       a run asleep on a timer: its wake-ups scheduled, or deleted if it ends first
- `runtime.host.starters`    `StarterDesk`: a run's starter (a publisher) follows and cancels it, by its key
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError

from runtime import events as ev
from runtime import kernel
from runtime.commands import split_actor
from runtime.host.actors import Actor, Actors, Task, slot_of
from runtime.host.config import DEFAULT_MAX_RUNS, HostConfig, HostStats
from runtime.host.driver import Inbound, RunDriver, ack_quietly, host_driver, run_log_for, standing
from runtime.host.endpoint import Endpoints
from runtime.host.leases import Leases, Slot, new_host_id
from runtime.host.partitions import Partitions
from runtime.host.recovery import Recovery
from runtime.host.routing import Router
from runtime.host.runs_index import RunsIndex
from runtime.host.scheduler import Scheduler, ensure_bundle_schedules
from runtime.host.served import AgentRuntime
from runtime.host.starters import StarterDesk
from runtime.host.summary import summarise
from runtime.host.unserved import Unserved
from runtime.log import RunLog
from runtime.log.payloads import PayloadError
from runtime.log.threads import Conversations, Threads, conversation
from runtime.logfields import log_context
from runtime.nats.durability import REQUIRE_SYNC_ENV, SyncReport, UnsyncedStorage, storage_sync
from runtime.nats.jetstream import jetstream_for
from runtime.nats.kv import fleet_kv
from runtime.nats.pull import Budget
from runtime.nats.records import HostBeat, RunIndex
from runtime.nats.retry import retrying
from runtime.nats.subjects import HOSTS_BUCKET, LEASES_BUCKET, TRACEPARENT, TRACESTATE
from runtime.nats.topology import attach_topology, ensure_schedules, ensure_transforms
from runtime.streaming import StreamPublisher

log = logging.getLogger("runtime.host")
storage_log = log.getChild("storage")  # the start-up line on syncing (`sa up` folds it into its own)

OPEN_RETRY_S = 0.5


class Host:
    """Serves the agents of `agents` (bundle name -> `AgentRuntime`) from NATS until stopped."""

    def __init__(self, nc: NATS, agents: dict[str, AgentRuntime], *, config: HostConfig | None = None,
                 on_event: Callable[[ev.Event], Any] | None = None) -> None:
        self.nc = nc
        self.js: JetStreamContext = jetstream_for(nc)
        self.agents = agents
        self.config = config or HostConfig()
        self.on_event = on_event
        self.stats = HostStats()
        self.id = self.config.host_id or new_host_id()
        self.budget = Budget(self.config.max_runs)  # what a flood of tasks cannot push past
        self.leases: Leases | None = None
        self.total_partitions = 0
        self.started = time.time()
        self.ready = anyio.Event()
        self.storage = SyncReport(())  # what the servers said of their syncing, at start
        self._tg: anyio.abc.TaskGroup | None = None
        self.log: RunLog = run_log_for(self.js)
        self.log.writer = self.id  # every event this host appends names it (`Sa-Writer`)
        self.index = RunsIndex(self.js)
        self.threads = Threads(self.js)
        self.conversations = Conversations()  # what the runs this host drove ended with (threads go on)
        self._actors = Actors(budget=self.budget, stats=self.stats, serves=self.serves, spawn=self._spawn,
                              start=self._start, drive=self._drive, refold=self._refold)
        self.recovery = Recovery(self.js, self.log, agents, self._actors, self.index, self.config, self.stats,
                                 serves=self.serves, on_event=on_event, conversations=self.conversations,
                                 host_id=self.id, holds=self.holds, lease_of=self._lease_of)
        self.router = Router(self.js, self._actors, self.index, self.budget, self.stats, serves=self.serves,
                             total_partitions=lambda: self.total_partitions, resume=self.recovery.resume,
                             admit=self._admit, refuse=self._refuse, unpark=self.recovery.unpark)
        self._served = Partitions(nc, self.js, self.config, self.budget, self.stats, self.id,
                                  spawn=self._spawn, recover=self.recovery.recover,
                                  on_task=self.router.on_task, on_result=self.router.on_result,
                                  drop=self._actors.drop, busy=self._actors.busy)

    @property
    def slots(self) -> list[Slot]:
        """The slots this host serves now: (bundle, partition)."""
        return sorted(self._served.parts)

    @property
    def partitions(self) -> list[int]:
        """The partitions this host serves now, of any of its bundles."""
        return sorted({p for _, p in self._served.parts})

    def serves(self, slot: Slot) -> bool:
        return self._served.serves(slot)

    def holds(self, actor: str, p: int) -> bool:
        """Whether this host may act for actor `actor`'s runs of partition `p` now: it serves the slot and,
        serving by lease, holds that lease by a renewal recent on its monotonic clock (`Leases.valid`)."""
        slot = slot_of(actor, p)
        return self.serves(slot) and (self.leases is None or self.leases.valid(slot))

    def _lease_of(self, slot: Slot) -> int:
        return self.leases.revision(slot) if self.leases is not None else 0

    @property
    def actors(self) -> dict[str, Actor]:
        """Actor key -> the actor, while it has work."""
        return self._actors.by_key

    @property
    def drivers(self) -> dict[str, RunDriver]:
        """Run id -> the driver of a run this host owns (driven now, or queued to resume)."""
        return self._actors.drivers

    @property
    def waiting(self) -> dict[str, Task]:
        """Run id -> a task still in a mailbox."""
        return self._actors.waiting

    def beat(self) -> HostBeat:
        """This host's entry in the `hosts` bucket."""
        return HostBeat(name=self.id, started=self.started, ttl=self.config.lease.ttl,
                        partitions=self.partitions, runs=len(self.drivers), queued=len(self.waiting),
                        max_runs=self.budget.limit, agents=sorted(self.agents),
                        descriptions={name: a.bundle.spec.description for name, a in self.agents.items()
                                      if a.bundle.spec.description})

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Serve until `stop` is set: the partitions of `config.partitions` of every bundle, or for each
        bundle a fair share of its partitions held by lease (`runtime.host.leases`). Runs in flight are left
        to the next owner's takeover."""
        stop = stop or anyio.Event()
        await self._check_storage()
        topology = await attach_topology(self.js)
        await retrying(lambda: ensure_transforms(self.js), what="updating the streams' subject transforms",
                       delay=OPEN_RETRY_S, logger=log)  # streams made by an older version
        await retrying(lambda: ensure_schedules(self.js), what="creating the SCHEDULES stream",
                       delay=OPEN_RETRY_S, logger=log, fatal=BadRequestError)  # the same
        await retrying(lambda: ensure_bundle_schedules(self.js, self.agents), what="storing the bundles' "
                       "schedules", delay=OPEN_RETRY_S, logger=log, fatal=BadRequestError)
        total = self.total_partitions = topology.partitions
        self.budget.expected_sharers = total * max(1, len(self.agents))  # a fair share per slot it may serve
        self._served.replicas = topology.replicas  # a WorkQueue stream's consumers must match its replicas
        # started during a leader election: wait for NATS rather than fail
        await retrying(self._open_buckets, what=f"host {self.id}: opening its buckets", delay=OPEN_RETRY_S,
                       logger=log)
        endpoints = Endpoints(self.nc, self.js, lease_s=self.config.permit_lease, replicas=topology.replicas)
        await endpoints.attach(self.agents.values())  # the bundles' `endpoint:` shares and daily budgets
        from runtime.host.regressions import RegressionChild  # not at import: it is its child's entry point

        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(endpoints.run)
            tg.start_soon(RegressionChild(self.config, self.id, self.nc, self.agents, endpoints.gates).run)
            tg.start_soon(Scheduler(self.nc, self.js, self.stats).run, stop)
            tg.start_soon(StarterDesk(self.nc, self.js, self.log).run, stop)  # runs' starters' asks
            tg.start_soon(self.recovery.watch_orphans, self._recovered_slots, stop)
            if self.config.partitions is not None:
                wanted = sorted(set(self.config.partitions))
                bad = [p for p in wanted if not 0 <= p < total]
                if bad:
                    raise ValueError(f"partitions {bad} do not exist (the stream has {total})")
                for bundle in sorted(self.agents):
                    for p in wanted:
                        await self._served.gain((bundle, p), fresh=False)
            else:
                self.leases = Leases(self.js, self.id, total, bundles=sorted(self.agents),
                                     on_gain=self._served.gain, on_loss=self._served.lose, beat=self.beat,
                                     config=self.config.lease)
                tg.start_soon(self.leases.run, stop)
                if self.config.unserved_after is not None:
                    unserved = Unserved(self.js, self.id, after=self.config.unserved_after,
                                        refuse=self._refuse, stats=self.stats)
                    tg.start_soon(unserved.run, stop)
                await self.leases.settled.wait()
            for part in list(self._served.parts.values()):
                await _first(part.ready, part.done)
            self.ready.set()
            await stop.wait()
            with anyio.move_on_after(15):
                while self.leases is not None and self._served.parts:  # the lease loop hands them back
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    async def _check_storage(self) -> None:
        """Say in one line whether JetStream syncs each write before acknowledging it; refuse to serve
        if it does not (or cannot be told to) and `HostConfig.require_sync` is set."""
        servers = [s.geturl() for s in getattr(self.nc, "servers", None) or []]
        self.storage = await storage_sync(servers, self.config.monitor)
        line = f"host {self.id}: {self.storage.summary()}"
        if self.storage.synced:
            storage_log.info("%s", line)
            return
        if self.config.require_sync:
            raise UnsyncedStorage(f"{line}; refusing to serve ({REQUIRE_SYNC_ENV} is set)")
        storage_log.warning("%s", line)

    def _recovered_slots(self) -> list[Slot]:
        """The slots served now whose takeover's recovery is over (orphans are looked for in these)."""
        return [slot for slot, part in self._served.parts.items() if part.ready.is_set()]

    async def _open_buckets(self) -> None:
        await self.index.open()
        await self.threads.open()
        for bucket in (LEASES_BUCKET, HOSTS_BUCKET):  # an older version's streams lack them
            await fleet_kv(self.js, bucket)

    # -- a turn: what an actor does with the item in hand -----------------------------------------------

    async def _start(self, actor: str, item: Task) -> None:
        self.waiting.pop(item.run_id, None)
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None:
            await self._unknown_agent(actor, item)
            return
        task = item.task
        try:  # an input too big for one message was stored apart (`events.Task.input_ref`)
            text = await self.log.payloads.resolve(task.input_ref or task.input)
        except PayloadError as e:
            await self._refuse(actor, item, "bad_task", f"the task's input could not be read: {e}")
            return
        timeout = task.timeout_s if task.timeout_s is not None else agent.bundle.deadline_s
        conv: kernel.Conversation | None = None
        summary: tuple[str | None, int] = (None, 0)
        exists = task.thread is not None and await self.log.last(item.run_id, actor) is not None
        if task.thread is not None and not exists:  # a new run of a thread: where the conversation is
            conv = await self._conversation(actor, agent, task.thread)
            if conv is not None:
                summary = await summarise(agent, conv)
        elif item.continues is not None and await self.log.last(item.run_id, actor) is None:
            conv = await conversation(self.log, agent.config, item.continues, cache=self.conversations)
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), actor=actor, input=text,
                                task_id=task.task_id, instance=split_actor(actor)[1], timeout_s=timeout,
                                metadata=_with_trace_context(task.metadata, item.msg),
                                bundle_digest=agent.bundle.digest, thread=task.thread,
                                previous_run=conv.run_id if conv else None,
                                previous_seq=conv.seq if conv else None,
                                summary=summary[0], summarised=summary[1],
                                priority=agent.bundle.priority if task.priority is None else task.priority)
        seq = None if exists else await self.log.create(started)
        if seq is not None:
            self.index.fresh(item.run_id, item.partition)
            self.stats.runs_started += 1
            if self.on_event is not None:
                self.on_event(started)
            driver = host_driver(self.js, agent, actor, item.run_id, item.partition,
                               state=kernel.evolve(kernel.initial(agent.config, conv), started), last_seq=seq,
                               on_event=self.on_event, log=self.log, holds=self.holds)
            driver.thread = task.thread
            driver.priority = started.priority if started.priority is not None else driver.priority
        else:  # this task already became a run (redelivered after a crash, or re-sent): resume or finish it
            existing = await self.recovery.fold_existing(item.run_id, actor, item.partition)
            if existing is None:
                if item.msg is not None:
                    await ack_quietly(item.msg)
                if item.cancel is not None and item.cancel.msg is not None:
                    await ack_quietly(item.cancel.msg)
                return
            driver = existing
            self.stats.runs_resumed += 1
        if task.thread is not None:  # before the ack: a crash before it finds the run again, and adds it
            await self.threads.add(actor, task.thread, item.run_id)
        driver.task_id = task.task_id
        await self.index.record(standing(driver))
        if item.msg is not None:
            await ack_quietly(item.msg)
        if item.cancel is not None:
            driver.deliver(item.cancel)
        await self._drive(driver)

    async def _conversation(self, actor: str, agent: AgentRuntime, thread: str) -> kernel.Conversation | None:
        """What the thread's latest run ended with (None: the thread is new): remembered if this host drove
        it, else folded from the logs."""
        previous = await self.threads.latest(actor, thread)
        if previous is None:
            return None
        return await conversation(self.log, agent.config, previous, cache=self.conversations)

    async def _drive(self, driver: RunDriver) -> None:
        self.drivers[driver.run_id] = driver
        driver.on_status = lambda d: self.index.record(standing(d))
        if driver.agent.bundle.spec.conversation.stream:
            driver.streamer = StreamPublisher(self.nc, driver.actor, driver.run_id)
        try:
            with log_context(run_id=driver.run_id, agent=driver.actor):
                state = await self._run_awake(driver)
        finally:
            if self.drivers.get(driver.run_id) is driver:
                del self.drivers[driver.run_id]
        if driver.parked:  # asleep on a timer, indexed as such: nothing of it stays here
            self.stats.runs_parked += 1
            return
        self.stats.runs_ended[state.status] = self.stats.runs_ended.get(state.status, 0) + 1
        if driver.thread is not None or state.status == "cancelled":
            self.conversations.remember(state)  # the thread's next run starts from it, without a read
        await self.index.record(standing(driver))

    async def _run_awake(self, driver: RunDriver) -> kernel.State:
        """Drive until the run ends or sleeps (`runtime.host.sleep`). A run folded back from its sleep for a
        command is indexed as awake before it applies it; a run that went to sleep is indexed as asleep (its
        wake-up scheduled) and let go, unless something arrived for it meanwhile: then it goes on here."""
        while True:
            if driver.parked:
                driver.parked = False
                await self.index.record(standing(driver))
            state = await driver.run()
            if not driver.parked:
                return state
            await self.index.record(standing(driver))
            if not driver.inbox:  # checked with no await before the driver is let go: a later message
                return state      # finds no driver and folds the run back (`Router`)

    async def _refold(self, run_id: str, actor: str, p: int) -> None:
        await self.recovery.refold(run_id, actor, p)

    async def _unknown_agent(self, actor: str, item: Task) -> None:
        served = ", ".join(sorted(self.agents)) or "none"
        log.error("task for unknown agent %s (run %s): this host serves %s", actor, item.run_id, served)
        await self._refuse(actor, item, "unknown_agent",
                           f"no bundle defines agent {split_actor(actor)[0]!r}; agents served: {served}")

    async def _refuse(self, actor: str, item: Task, reason: str, detail: str) -> None:
        """Record a run for `item` that fails at once (`run.started`, `run.failed` with `reason`), so the
        publisher following its run id sees why; index it and ack the task."""
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), actor=actor, input=item.task.input,
                                task_id=item.task.task_id, thread=item.task.thread)
        seq = await self.log.create(started)
        if seq is not None:
            self.index.fresh(item.run_id, item.partition)
            failed = ev.RunFailed(run_id=item.run_id, seq=1, ts=time.time(), actor=actor, reason=reason,
                                  detail=detail)
            seq = await self.log.append(failed, expect=seq)
            for e in (started, failed):
                if self.on_event is not None:
                    self.on_event(e)
            await self.index.put(item.run_id, RunIndex(actor=actor, status="failed", partition=item.partition,
                                                       last_seq=seq, seq=failed.seq, updated=time.time(),
                                                       task_id=item.task.task_id))
        self.stats.runs_ended["failed"] = self.stats.runs_ended.get("failed", 0) + 1
        if item.msg is not None:
            await ack_quietly(item.msg)

    # -- double-texting: a task for an actor (or thread) that already has one ---------------------------

    async def _admit(self, actor: str, item: Task) -> bool:
        """Whether `item` goes into its actor's mailbox, by its bundle's `double_texting` when a run of the
        same thread (of the same actor, for a task without a thread) is active or queued: `enqueue` waits
        behind it; `reject` fails the new task at once, saying why; `interrupt` cancels the active run
        (the driver's real cancel: its tool jobs stop) and queues the new task, which then continues the
        thread from the cancelled run's conversation."""
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None or item.run_id in self.waiting or item.run_id in self.drivers:
            return True  # unknown agent (failed when its turn comes), or a redelivery of a task it holds
        mode = agent.bundle.spec.conversation.double_texting
        if mode == "enqueue":
            return True
        thread = item.task.thread
        active = [d for d in self.drivers.values() if d.actor == actor and not d.state.done
                  and (thread is None or d.thread == thread)]
        mailbox = self.actors[actor].mailbox if actor in self.actors else ()
        queued = [t for t in mailbox if isinstance(t, Task) and t.run_id != item.run_id
                  and (thread is None or t.task.thread == thread)]
        if not active and not queued:
            return True
        where = f"thread {thread!r} of {actor}" if thread is not None else actor
        if mode == "reject":
            busy = ", ".join(sorted({d.run_id for d in active} | {t.run_id for t in queued}))
            log.info("task %s for %s rejected: run %s is active (double_texting: reject)", item.run_id,
                     where, busy)
            self.stats.tasks_rejected_busy += 1
            await self._refuse(actor, item, "double_texting",
                               f"{where} is busy with run {busy}, and its bundle's "
                               "conversation.double_texting is reject: send the task again once that run has "
                               "ended, or cancel it")
            return False
        if thread is None and active:
            item.continues = active[0].run_id  # not in a thread: the new run still goes on from it
        for driver in active:
            log.info("run %s of %s interrupted by task %s (double_texting: interrupt)", driver.run_id, where,
                     item.run_id)
            driver.deliver(Inbound(ev.Cancel(run_id=driver.run_id, by="double_texting",
                                             reason=f"interrupted by a newer task (run {item.run_id})")))
        return True

def _with_trace_context(metadata: dict[str, Any], msg: Any) -> dict[str, Any]:
    """The task's metadata, plus the W3C trace context its publisher sent as NATS headers (`traceparent`,
    `tracestate`) unless the metadata has its own: recorded in `run.started`, it makes the run's trace a
    child of the publisher's span (`runtime.observe.traces`)."""
    out = dict(metadata)
    headers = getattr(msg, "headers", None) if msg is not None else None
    for key in (TRACEPARENT, TRACESTATE):
        if headers and isinstance(headers.get(key), str) and key not in out:
            out[key] = headers[key]
    return out


async def _first(*events: anyio.Event) -> None:
    """Wait until one of `events` is set."""
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


__all__ = ["DEFAULT_MAX_RUNS", "Host", "HostConfig", "HostStats"]
