"""The agent host: bundles become agents, tasks become runs, runs are driven to their end across crashes.

How a task flows
----------------
1. A publisher puts a task on ``agents.<agent>.tasks`` (format: `runtime.host.commands`); TASKS stores it
   as ``tasks.<p>.<agent>``. The host consumes every partition it serves through ONE durable consumer per
   partition (plus one per partition on RESULTS), whatever the number of agents: 10,000 agents cost 2N
   consumers, never 10,000 (nats-server caps a stream at 1,000). Which partitions: a fair share of them,
   held by expiring leases (`runtime.host.leases`), or a fixed list (`HostConfig.partitions`).
2. The task goes into its actor's mailbox. An actor is ``<bundle>`` or ``<bundle>:<instance>``; it exists
   only while it has work (an idle agent is a dict entry nobody created), runs one task at a time in
   arrival order, and runs concurrently with every other actor.
3. Its turn: the run id is derived from the task (`commands.run_id_for`), ``run.started`` is appended
   (expected last sequence 0: only the first start lands), the ``runs`` KV index says ``running``, and
   THEN the task message is acked. `RunDriver` drives the kernel: model calls here, tool calls as jobs on
   TOOLS, outcomes back from RESULTS as ``script.*``/``tool.*`` events, until the run ends; the index then
   says how it ended.

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

Partitions, takeover and recovery
---------------------------------
Serving a partition (`_gain`, at start or when a lease is won): recreate its two consumers (so whatever a
previous owner held un-acked is delivered again now, not after AckWait), then, before consuming anything,
read the partition's unfinished runs from the ``active`` bucket (keys ``p<N>.<run>``: a takeover scans its
partition only, not the whole ``runs`` index), fold each run's events (`log.RunLog.read`) and queue it
first in its actor's mailbox. `RunDriver` then re-issues only what `kernel.decide` says is pending: an
answered model call is never made again, a job already answered is never re-published, a job still out is
re-published with the same Msg-Id (deduplicated by TOOLS; the workers' ``applied`` markers make its writes
exactly-once beyond the window).

Losing a partition (`_lose`: released to a new host, lease expired, or fenced because renewals failed):
its consumers stop, its queued tasks are dropped un-acked, the drivers and actors working on it are
cancelled, and every message of it is wrapped (`_Guarded`) so no ack for it leaves this host any more;
the next owner gets all of it again. Exactly one host drives a run: the one serving its partition; a stale
one that still appends is stopped by the expected-sequence check (`Superseded`), and if the winner of
such a race is a host that still serves the partition, it re-folds the run and goes on (`_refold`).

Back-pressure
-------------
`HostConfig.max_runs` bounds what a host holds in memory: runs it drives plus tasks waiting in mailboxes.
Each task message takes one unit of a `pull.Budget` shared by every partition's task consumer; a pull
request never asks for more than the budget's free room, so at the bound the host stops pulling and a
flood of tasks waits in the TASKS stream (on disk, acked to its publishers) instead of in the host; the
task consumers' MaxAckPending is the same bound, on the server side. Runs recovered at a takeover take
units without waiting (they are already started), so pulls pause until they end.

Bad input (DESIGN rule 8)
-------------------------
A message that is not a command (`commands.BadCommand`): logged with the reason and terminated — never
redelivered, never stopping the host. A task for an agent no loaded bundle defines: a run is still
created, with ``run.started`` then ``run.failed`` (reason ``unknown_agent``, naming the agents served), so
the publisher following the run id sees why; the task is acked.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from runtime import events as ev
from runtime import kernel
from runtime import nats as bus
from runtime.host.agent import AgentRuntime
from runtime.host.commands import BadCommand, decode, run_id_for, split_actor
from runtime.host.driver import Inbound, RunDriver, ack_quietly, run_log_for
from runtime.host.leases import LeaseConfig, Leases, new_host_id
from runtime.jobs import JobDecodeError, ToolOutcome
from runtime.log import RunLog, Superseded
from runtime.nats.pull import Budget, consume

log = logging.getLogger("runtime.host")

DEFAULT_MAX_RUNS = 4096
SUPERSEDED_RETRY_S = 1.0  # after losing an append race in a partition it still owns, re-fold this late
HANDOVER_WAIT_S = 5.0  # how long `_lose` waits for a partition's work to stop before handing it over


@dataclass
class HostConfig:
    partitions: Iterable[int] | None = None  # serve exactly these (no leases); None: take a share by lease
    task_ack_wait: float = 30.0  # a dead host's un-started tasks are redelivered after this (or at takeover)
    pull_batch: int = 256
    pull_expires: float = 5.0
    recovery_concurrency: int = 16
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    max_runs: int = DEFAULT_MAX_RUNS  # back-pressure: runs driven + tasks waiting in mailboxes, at most
    host_id: str | None = None  # default: `<hostname>-<pid>-<random>`


@dataclass
class HostStats:
    """Counters for tests, benchmarks and logs."""

    tasks: int = 0
    runs_started: int = 0
    runs_resumed: int = 0
    runs_recovered: int = 0
    runs_ended: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # malformed messages terminated
    outcomes: int = 0
    superseded: int = 0
    handed_over: int = 0  # runs or tasks dropped because their partition went to another host
    gained: int = 0  # partitions taken (at start or over)
    lost: int = 0  # partitions given up (released, expired or fenced)


@dataclass
class _Task:
    task: ev.Task
    msg: Any  # a `_Guarded` task message (None for tests that enqueue by hand)
    run_id: str
    partition: int
    stream_seq: int
    cancel: Inbound | None = None


@dataclass
class _Resume:
    driver: RunDriver


def _partition(item: _Task | _Resume) -> int:
    return item.partition if isinstance(item, _Task) else item.driver.partition


@dataclass
class _Actor:
    key: str
    mailbox: deque[_Task | _Resume] = field(default_factory=deque)
    running: bool = False
    current: tuple[int, anyio.CancelScope] | None = None  # the partition of the item in hand, its scope


@dataclass
class _Part:
    """One partition this host serves: its consumers run in `scope` until `_lose` cancels it."""

    p: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop: anyio.Event = field(default_factory=anyio.Event)
    ready: anyio.Event = field(default_factory=anyio.Event)  # recovered and consuming
    done: anyio.Event = field(default_factory=anyio.Event)  # its serving task has exited


class _Guarded:
    """A message whose acknowledgements go through only while this host serves its partition.

    Drivers and actors ack when their work is done; once the partition has gone to another host, an ack
    from here could acknowledge a message whose effect the new owner never saw, so it is dropped and the
    message is redelivered to the owner (who finds its effect already in the log, or does the work)."""

    __slots__ = ("host", "msg", "partition")

    def __init__(self, msg: Msg, host: Host, partition: int) -> None:
        self.msg, self.host, self.partition = msg, host, partition

    async def ack(self) -> None:
        if self.host.serves(self.partition):
            await self.msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        if self.host.serves(self.partition):
            await self.msg.nak(delay=delay)

    async def term(self) -> None:
        if self.host.serves(self.partition):
            await self.msg.term()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.msg, name)


class Host:
    """Serves the agents of `agents` (bundle name -> `AgentRuntime`) from NATS until stopped."""

    def __init__(self, nc: NATS, agents: dict[str, AgentRuntime], *, config: HostConfig | None = None,
                 on_event: Callable[[ev.Event], Any] | None = None) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.agents = agents
        self.config = config or HostConfig()
        self.on_event = on_event
        self.stats = HostStats()
        self.id = self.config.host_id or new_host_id()
        self.actors: dict[str, _Actor] = {}
        self.drivers: dict[str, RunDriver] = {}  # run id -> the driver of a run this host owns
        self.waiting: dict[str, _Task] = {}  # run id -> a task still in a mailbox
        self.budget = Budget(self.config.max_runs)  # what a flood of tasks cannot push past
        self.leases: Leases | None = None
        self.total_partitions = 0
        self.replicas = 1
        self.started = time.time()
        self.ready = anyio.Event()
        self._parts: dict[int, _Part] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.log: RunLog = run_log_for(self.js)
        self._runs_kv: Any = None
        self._active_kv: Any = None

    @property
    def partitions(self) -> list[int]:
        """The partitions this host serves now."""
        return sorted(self._parts)

    def serves(self, partition: int) -> bool:
        return partition in self._parts

    def beat(self) -> bus.HostBeat:
        """This host's entry in the `hosts` bucket."""
        return bus.HostBeat(name=self.id, started=self.started, ttl=self.config.lease.ttl,
                            partitions=self.partitions, runs=len(self.drivers), queued=len(self.waiting),
                            max_runs=self.budget.limit, agents=sorted(self.agents))

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Serve until `stop` is set: the partitions of `config.partitions`, or a fair share of all of them
        held by lease (`runtime.host.leases`). Runs in flight are left to the next owner's takeover."""
        stop = stop or anyio.Event()
        topology = await bus.attach_topology(self.js)
        total = self.total_partitions = topology.partitions
        self.replicas = topology.replicas  # a WorkQueue stream's consumers must match its replicas
        while True:  # started during a leader election: wait for NATS rather than fail
            try:
                self._runs_kv = await bus.runs_kv(self.js)
                self._active_kv = await bus.fleet_kv(self.js, bus.ACTIVE_BUCKET)
                for bucket in (bus.LEASES_BUCKET, bus.HOSTS_BUCKET):  # an older version's streams lack them
                    await bus.fleet_kv(self.js, bucket)
                break
            except Exception as e:
                log.warning("host %s: NATS not ready (%s: %s); retrying", self.id, type(e).__name__, e)
                await anyio.sleep(0.5)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self.config.partitions is not None:
                wanted = sorted(set(self.config.partitions))
                bad = [p for p in wanted if not 0 <= p < total]
                if bad:
                    raise ValueError(f"partitions {bad} do not exist (the stream has {total})")
                for p in wanted:
                    await self._gain(p, fresh=False)
            else:
                self.leases = Leases(self.js, self.id, total, on_gain=self._gain, on_loss=self._lose,
                                     beat=self.beat, config=self.config.lease)
                tg.start_soon(self.leases.run, stop)
                await self.leases.settled.wait()
            for part in list(self._parts.values()):
                await _first(part.ready, part.done)
            self.ready.set()
            await stop.wait()
            with anyio.move_on_after(15):
                while self.leases is not None and self._parts:  # the lease loop hands them back on `stop`
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    # -- partitions --------------------------------------------------------------------------------------

    async def _gain(self, p: int, *, fresh: bool = True) -> None:
        """Start serving `p`: (re)create its consumers, recover its unfinished runs, consume.

        `fresh` recreates the consumers so whatever the previous owner held un-acked comes again now."""
        if p in self._parts:
            return
        part = self._parts[p] = _Part(p)
        self.stats.gained += 1
        assert self._tg is not None
        self._tg.start_soon(self._serve_partition, part, fresh)

    async def _serve_partition(self, part: _Part, fresh: bool) -> None:
        p = part.p
        try:
            with part.scope:
                while not part.stop.is_set():
                    try:  # NATS trouble anywhere here: keep trying while we hold the partition
                        tasks, results = await bus.ensure_partition_consumers(
                            self.js, p, ack_wait=self.config.task_ack_wait, fresh=fresh,
                            max_ack_pending=self.config.max_runs, replicas=self.replicas)
                        fresh = False
                        if not part.ready.is_set():
                            await self._recover(p)
                            part.ready.set()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._consume, bus.TASKS, tasks,
                                          functools.partial(self._on_task, p), part.stop, self.budget)
                            tg.start_soon(self._consume, bus.RESULTS, results,
                                          functools.partial(self._on_result, p), part.stop, None)
                    except Exception as e:
                        log.warning("partition %d: %s: %s; retrying", p, type(e).__name__, e)
                        await anyio.sleep(0.5)
        finally:
            part.done.set()

    async def _lose(self, p: int, why: str) -> None:
        """Stop serving `p` now: no more pulls, acks or appends for it from this host. Its queued tasks are
        dropped un-acked and its drivers cancelled; the next owner recovers them from the log."""
        part = self._parts.pop(p, None)
        if part is None:
            return
        self.stats.lost += 1
        part.stop.set()
        part.scope.cancel()
        dropped = 0
        for actor in list(self.actors.values()):
            kept: deque[_Task | _Resume] = deque()
            for item in actor.mailbox:
                if _partition(item) == p:
                    self._forget(item)
                    dropped += 1
                else:
                    kept.append(item)
            actor.mailbox = kept
            if actor.current is not None and actor.current[0] == p:
                actor.current[1].cancel()
        with anyio.move_on_after(HANDOVER_WAIT_S):
            await part.done.wait()
            while any(a.current is not None and a.current[0] == p for a in self.actors.values()):
                await anyio.sleep(0.01)
        self.stats.handed_over += dropped
        log.info("host %s: stopped serving partition %d (%s); %d queued item(s) left to its next owner",
                 self.id, p, why, dropped)

    def _forget(self, item: _Task | _Resume) -> None:
        """An item leaves this host without being worked on."""
        if isinstance(item, _Task):
            self.waiting.pop(item.run_id, None)
        else:
            self.drivers.pop(item.driver.run_id, None)
        self.budget.release()

    async def _consume(self, stream: str, consumer: str, handler: Any, stop: anyio.Event,
                       budget: Budget | None) -> None:
        await consume(self.nc, stream, consumer, handler, stop=stop, batch=self.config.pull_batch,
                      expires=self.config.pull_expires, budget=budget)

    # -- recovery ----------------------------------------------------------------------------------------

    async def _recover(self, p: int) -> None:
        """Fold every unfinished run of partition `p` (the `active` bucket's `p<N>.*` keys) and queue it
        first in its actor's mailbox: the single-host recovery, per partition, at every takeover."""
        while True:
            try:
                entries = await bus.kv_entries(self._active_kv, bus.active_filter(p))
                break
            except Exception as e:
                log.warning("partition %d: reading its unfinished runs failed (%s); retrying", p, e)
                await anyio.sleep(0.5)
        todo = [(key.split(".", 1)[1], entry.value.decode()) for key, entry in entries.items()]
        todo = [(run_id, actor) for run_id, actor in todo if run_id not in self.drivers]
        limiter = anyio.CapacityLimiter(self.config.recovery_concurrency)
        resumed: list[RunDriver] = []

        async def one(run_id: str, actor: str) -> None:
            async with limiter:
                while True:
                    try:
                        driver = await self._fold_existing(run_id, actor, p)
                        break
                    except Exception as e:
                        log.warning("run %s: folding it failed (%s); retrying", run_id, e)
                        await anyio.sleep(0.5)
            if driver is not None:
                resumed.append(driver)

        async with anyio.create_task_group() as tg:
            for run_id, actor in todo:
                tg.start_soon(one, run_id, actor)
        for driver in resumed:
            self.drivers[driver.run_id] = driver
            self.budget.take()
            self._enqueue(driver.actor, _Resume(driver), front=True)
        self.stats.runs_recovered += len(resumed)
        if todo:
            log.info("partition %d: recovered %d unfinished run(s)", p, len(resumed))

    async def _fold_existing(self, run_id: str, actor: str, partition: int) -> RunDriver | None:
        """A driver for an existing run from its log, or None if it is over (the index is then fixed)."""
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None:
            log.error("run %s belongs to %s, which no loaded bundle defines: not resumed", run_id, actor)
            return None
        history = await self.log.read(run_id, actor)
        try:
            state = kernel.fold(agent.config, history.events)
        except kernel.EvolveError as e:
            log.error("run %s cannot be folded (%s): not resumed", run_id, e)
            return None
        driver = RunDriver(self.js, agent, actor, run_id, partition, state=state, last_seq=history.last_seq,
                           on_event=self.on_event, log=self.log)
        if history.events and isinstance(history.events[0], ev.RunStarted):
            driver.task_id = history.events[0].task_id
        if state.done:
            await self._index(driver)
            return None
        return driver

    async def _refold(self, run_id: str, actor: str, p: int) -> None:
        """Resume a run after losing an append race in a partition this host still serves: the other
        writer was a stale owner that stops at its next renewal, so fold what it wrote and go on."""
        await anyio.sleep(SUPERSEDED_RETRY_S)
        if not self.serves(p) or run_id in self.drivers:
            return
        try:
            driver = await self._fold_existing(run_id, actor, p)
        except Exception as e:
            log.error("run %s: re-folding after a lost append race failed (%s); it resumes at the next "
                      "takeover of partition %d", run_id, e, p)
            return
        if driver is not None and self.serves(p) and run_id not in self.drivers:
            self.drivers[run_id] = driver
            self.budget.take()
            self._enqueue(actor, _Resume(driver), front=True)

    # -- consuming ---------------------------------------------------------------------------------------

    async def _on_task(self, p: int, raw: Msg) -> None:
        """A message of partition `p`'s task consumer; it carries one unit of `self.budget`."""
        kept = False
        try:
            kept = await self._route_command(p, _Guarded(raw, self, p))
        finally:
            if not kept:
                self.budget.release()

    async def _route_command(self, p: int, msg: _Guarded) -> bool:
        """Route one task-subject message; True if it now waits in a mailbox (keeping its budget unit)."""
        try:
            subject_agent = bus.agent_of_task_subject(msg.subject)
            addressed = decode(subject_agent, msg.data)
        except (BadCommand, ValueError) as e:
            self.stats.rejected += 1
            log.error("rejected a message on %s: %s", msg.subject, e)
            await _term(msg)
            return False
        cmd = addressed.command
        md = msg.metadata
        if isinstance(cmd, ev.Task):
            self.stats.tasks += 1
            run_id = run_id_for(addressed.agent, cmd.task_id, stream_seq=md.sequence.stream)
            return self._enqueue(addressed.agent, _Task(cmd, msg, run_id, p, md.sequence.stream))
        assert isinstance(cmd, ev.Cancel | ev.Approve | ev.Deny)
        driver = self.drivers.get(cmd.run_id)
        if driver is not None:
            driver.deliver(Inbound(cmd, msg))
            return False
        waiting = self.waiting.get(cmd.run_id)
        if waiting is not None and isinstance(cmd, ev.Cancel):
            if waiting.cancel is not None and waiting.cancel.msg is not None:
                await ack_quietly(waiting.cancel.msg)
            waiting.cancel = Inbound(cmd, msg)  # applied right after the run starts
            return False
        ix = await self._index_entry(cmd.run_id)
        if ix is not None and ix.status in kernel.TERMINAL:
            log.info("%s for run %s ignored: the run already %s", cmd.__struct_config__.tag, cmd.run_id,
                     ix.status)
            await ack_quietly(msg)
            return False
        if ix is not None and ix.partition != p and await self._forward(cmd, ix, msg):
            return False
        self.stats.rejected += 1
        log.error("%s for unknown run %s (published on %s): dropped", cmd.__struct_config__.tag, cmd.run_id,
                  msg.subject)
        await _term(msg)
        return False

    async def _forward(self, cmd: ev.Command, ix: bus.RunIndex, msg: _Guarded) -> bool:
        """A command published on another subject than its run's task (say the bundle's, for a run of
        `bundle:instance`) lands in another partition: republish it where the run's host reads."""
        for agent in (ix.agent, split_actor(ix.agent)[0]):
            if bus.partition_of(agent, self.total_partitions) == ix.partition:
                await self.js.publish(bus.task_subject(agent), ev.encode_command(cmd))
                await ack_quietly(msg)
                log.info("%s for run %s forwarded to partition %d", cmd.__struct_config__.tag, cmd.run_id,
                         ix.partition)
                return True
        return False

    async def _on_result(self, p: int, raw: Msg) -> None:
        msg = _Guarded(raw, self, p)
        try:
            outcome = ToolOutcome.decode(msg.data)
        except JobDecodeError as e:
            self.stats.rejected += 1
            log.error("rejected a message on %s: %s", msg.subject, e)
            await _term(msg)
            return
        self.stats.outcomes += 1
        driver = self.drivers.get(outcome.run_id)
        if driver is not None:
            driver.deliver(Inbound(outcome, msg))
            return
        ix = await self._index_entry(outcome.run_id)
        if ix is not None and ix.status in kernel.TERMINAL:
            await ack_quietly(msg)  # a late or duplicate outcome of a finished run
            return
        if msg.metadata.num_delivered >= 20:
            log.error("outcome of %s for run %s that no host drives: dropped", outcome.call_id,
                      outcome.run_id)
            await _term(msg)
            return
        await msg.nak(delay=1.0)  # the run is starting or being resumed: try again soon

    # -- actors ------------------------------------------------------------------------------------------

    def _enqueue(self, key: str, item: _Task | _Resume, *, front: bool = False) -> bool:
        """Queue `item` for actor `key`; False if it was a redelivery of a task already waiting (which
        keeps its place, now with the newer message)."""
        actor = self.actors.get(key)
        if actor is None:
            actor = self.actors[key] = _Actor(key)
        if isinstance(item, _Task):
            for queued in actor.mailbox:  # a redelivery of a task already waiting: keep its place
                if isinstance(queued, _Task) and queued.stream_seq == item.stream_seq:
                    queued.msg = item.msg
                    return False
            self.waiting[item.run_id] = item
        if front:
            actor.mailbox.appendleft(item)
        else:
            actor.mailbox.append(item)
        if not actor.running:
            actor.running = True
            assert self._tg is not None
            self._tg.start_soon(self._actor_loop, actor)
        return True

    async def _actor_loop(self, actor: _Actor) -> None:
        try:
            while actor.mailbox:
                item = actor.mailbox.popleft()
                p = _partition(item)
                if not self.serves(p):  # its partition went while it waited
                    self._forget(item)
                    continue
                with anyio.CancelScope() as scope:
                    actor.current = (p, scope)
                    try:
                        if isinstance(item, _Task):
                            await self._start(actor.key, item)
                        else:
                            await self._drive(item.driver)
                    except Superseded as e:
                        self.stats.superseded += 1
                        log.warning("%s: %s; this host stops driving it", actor.key, e)
                        run_id = item.run_id if isinstance(item, _Task) else item.driver.run_id
                        if self.serves(p):
                            assert self._tg is not None
                            self._tg.start_soon(self._refold, run_id, actor.key, p)
                    except Exception:
                        log.exception("%s: unexpected error; the run is resumed at the next takeover of "
                                      "partition %d", actor.key, p)
                actor.current = None
                if scope.cancelled_caught:
                    self.stats.handed_over += 1
                if isinstance(item, _Task):
                    self.waiting.pop(item.run_id, None)
                self.budget.release()
        finally:
            actor.current = None
            actor.running = False
            if not actor.mailbox:
                self.actors.pop(actor.key, None)

    async def _start(self, actor: str, item: _Task) -> None:
        self.waiting.pop(item.run_id, None)
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None:
            await self._unknown_agent(actor, item)
            return
        task = item.task
        timeout = task.timeout_s if task.timeout_s is not None else agent.bundle.deadline_s
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), actor=actor, input=task.input,
                                task_id=task.task_id, instance=split_actor(actor)[1], timeout_s=timeout,
                                metadata=dict(task.metadata), bundle_digest=agent.bundle.digest)
        seq = await self.log.create(started)
        if seq is not None:
            self.stats.runs_started += 1
            if self.on_event is not None:
                self.on_event(started)
            driver = RunDriver(self.js, agent, actor, item.run_id, item.partition,
                               state=kernel.evolve(kernel.initial(agent.config), started), last_seq=seq,
                               on_event=self.on_event, log=self.log)
        else:  # this task already became a run (redelivered after a crash, or re-sent): resume or finish it
            existing = await self._fold_existing(item.run_id, actor, item.partition)
            if existing is None:
                if item.msg is not None:
                    await ack_quietly(item.msg)
                if item.cancel is not None and item.cancel.msg is not None:
                    await ack_quietly(item.cancel.msg)
                return
            driver = existing
            self.stats.runs_resumed += 1
        driver.task_id = task.task_id
        await self._index(driver)
        if item.msg is not None:
            await ack_quietly(item.msg)
        if item.cancel is not None:
            driver.deliver(item.cancel)
        await self._drive(driver)

    async def _drive(self, driver: RunDriver) -> None:
        self.drivers[driver.run_id] = driver
        try:
            state = await driver.run()
        finally:
            if self.drivers.get(driver.run_id) is driver:
                del self.drivers[driver.run_id]
        self.stats.runs_ended[state.status] = self.stats.runs_ended.get(state.status, 0) + 1
        await self._index(driver)

    async def _unknown_agent(self, actor: str, item: _Task) -> None:
        served = ", ".join(sorted(self.agents)) or "none"
        log.error("task for unknown agent %s (run %s): this host serves %s", actor, item.run_id, served)
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), actor=actor, input=item.task.input,
                                task_id=item.task.task_id)
        seq = await self.log.create(started)
        if seq is not None:
            failed = ev.RunFailed(run_id=item.run_id, seq=1, ts=time.time(), actor=actor,
                                  reason="unknown_agent",
                                  detail=f"no bundle defines agent {split_actor(actor)[0]!r}; "
                                         f"agents served: {served}")
            seq = await self.log.append(failed, expect=seq)
            for e in (started, failed):
                if self.on_event is not None:
                    self.on_event(e)
            await self._put_index(item.run_id, bus.RunIndex(agent=actor, status="failed",
                                                            partition=item.partition, last_seq=seq,
                                                            updated=time.time(), task_id=item.task.task_id))
        self.stats.runs_ended["failed"] = self.stats.runs_ended.get("failed", 0) + 1
        if item.msg is not None:
            await ack_quietly(item.msg)

    # -- the runs index ----------------------------------------------------------------------------------

    async def _index(self, driver: RunDriver) -> None:
        """The `runs` entry of the run, and its `active` key: set while it runs, purged once it ended."""
        state = driver.state
        status = state.status if state.status != "new" else "running"
        await self._put_index(driver.run_id, bus.RunIndex(
            agent=driver.actor, status=status, partition=driver.partition, last_seq=driver.last_seq,
            updated=time.time(), task_id=driver.task_id, bundle=str(driver.agent.bundle.path)))
        key = bus.active_key(driver.partition, driver.run_id)
        if status in kernel.TERMINAL:
            await _retrying(f"clearing the active entry of {driver.run_id}",
                            lambda: self._active_kv.purge(key, msg_ttl=bus.ACTIVE_PURGE_TTL_S))
        else:
            await _retrying(f"the active entry of {driver.run_id}",
                            lambda: self._active_kv.put(key, driver.actor.encode()))

    async def _put_index(self, run_id: str, entry: bus.RunIndex) -> None:
        await _retrying(f"runs index update of {run_id}", lambda: self._runs_kv.put(run_id, entry.encode()))

    async def _index_entry(self, run_id: str) -> bus.RunIndex | None:
        try:
            entry = await self._runs_kv.get(run_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        return bus.RunIndex.decode(entry.value) if entry.value else None


async def _retrying(what: str, op: Callable[[], Any]) -> None:
    """Run a KV write until it succeeds (NATS may be electing a leader): the index must not be skipped."""
    while True:
        try:
            await op()
            return
        except Exception as e:
            log.warning("%s failed (%s); retrying", what, e)
            await anyio.sleep(0.25)


async def _first(*events: anyio.Event) -> None:
    """Wait until one of `events` is set."""
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


async def _term(msg: Any) -> None:
    try:
        await msg.term()
    except Exception as e:
        log.debug("term failed: %s", e)


__all__ = ["Host", "HostConfig", "HostStats"]
