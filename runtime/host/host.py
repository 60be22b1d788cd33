"""The agent host: bundles become agents, tasks become runs, runs are driven to their end across crashes.

How a task flows
----------------
1. A publisher puts a task on ``agents.<agent>.tasks`` (format: `runtime.host.commands`); TASKS stores it
   as ``tasks.<p>.<agent>``. The host consumes every partition it serves through ONE durable consumer per
   partition (plus one per partition on RESULTS), whatever the number of agents: 10,000 agents cost 2N
   consumers, never 10,000 (nats-server caps a stream at 1,000).
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

Recovery
--------
On start, before consuming anything, the host reads the ``runs`` index, and for every ``running`` run of a
partition it serves folds the run's events (`replay.read_run`) and queues it first in its actor's mailbox.
`RunDriver` then re-issues only what `kernel.decide` says is pending: an answered model call is never made
again, a job already answered is never re-published, a job still out is re-published with the same Msg-Id
(deduplicated by TOOLS; the workers' ``applied`` markers make its writes exactly-once beyond the window).

Bad input (DESIGN rule 8)
-------------------------
A message that is not a command (`commands.BadCommand`): logged with the reason and terminated — never
redelivered, never stopping the host. A task for an agent no loaded bundle defines: a run is still
created, with ``run.started`` then ``run.failed`` (reason ``unknown_agent``, naming the agents served), so
the publisher following the run id sees why; the task is acked.
"""

from __future__ import annotations

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
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError

from runtime import bus, kernel
from runtime import events as ev
from runtime.host.agent import AgentRuntime
from runtime.host.commands import BadCommand, decode, run_id_for, split_actor
from runtime.host.driver import Inbound, RunDriver, Superseded, _ack
from runtime.host.pull import consume
from runtime.jobs import JobDecodeError, ToolOutcome
from runtime.replay import read_run

log = logging.getLogger("runtime.host")

TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class HostConfig:
    partitions: Iterable[int] | None = None  # the partitions to serve (None: all; leases come next)
    task_ack_wait: float = 30.0  # a dead host's un-started tasks are redelivered after this
    pull_batch: int = 256
    pull_expires: float = 5.0
    recovery_concurrency: int = 16


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


@dataclass
class _Task:
    task: ev.Task
    msg: Msg | None
    run_id: str
    partition: int
    stream_seq: int
    cancel: Inbound | None = None


@dataclass
class _Resume:
    driver: RunDriver


@dataclass
class _Actor:
    key: str
    mailbox: deque[_Task | _Resume] = field(default_factory=deque)
    running: bool = False


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
        self.actors: dict[str, _Actor] = {}
        self.drivers: dict[str, RunDriver] = {}  # run id -> the driver of a run this host owns
        self.waiting: dict[str, _Task] = {}  # run id -> a task still in a mailbox
        self.partitions: list[int] = []
        self.ready = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._runs_kv: Any = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Recover, then serve until `stop` is set. Runs in flight are left to the next start's recovery."""
        stop = stop or anyio.Event()
        total = await bus.read_partitions(self.js)
        wanted = self.config.partitions
        self.partitions = sorted(set(wanted)) if wanted is not None else list(range(total))
        bad = [p for p in self.partitions if not 0 <= p < total]
        if bad:
            raise ValueError(f"partitions {bad} do not exist (the stream has {total})")
        self._runs_kv = await bus.runs_kv(self.js)
        names: list[tuple[str, str]] = []
        for p in self.partitions:
            names.append(await bus.ensure_partition_consumers(self.js, p, ack_wait=self.config.task_ack_wait))
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._recover()
            for (tasks, results) in names:
                tg.start_soon(self._consume, bus.TASKS, tasks, self._on_task, stop)
                tg.start_soon(self._consume, bus.RESULTS, results, self._on_result, stop)
            self.ready.set()
            await stop.wait()
            tg.cancel_scope.cancel()

    async def _consume(self, stream: str, consumer: str, handler: Any, stop: anyio.Event) -> None:
        await consume(self.nc, stream, consumer, handler, stop=stop, batch=self.config.pull_batch,
                      expires=self.config.pull_expires)

    # -- recovery ----------------------------------------------------------------------------------------

    async def _recover(self) -> None:
        entries: list[tuple[str, bus.RunIndex]] = []
        watcher = await self._runs_kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:
                    break
                if entry.value and entry.operation is None:
                    try:
                        entries.append((entry.key, bus.RunIndex.decode(entry.value)))
                    except Exception as e:
                        log.error("runs index entry %s is unreadable: %s", entry.key, e)
        finally:
            await watcher.stop()
        served = set(self.partitions)
        todo = [(k, ix) for k, ix in entries if ix.status not in TERMINAL and ix.partition in served]
        limiter = anyio.CapacityLimiter(self.config.recovery_concurrency)
        resumed: list[RunDriver] = []

        async def one(run_id: str, ix: bus.RunIndex) -> None:
            async with limiter:
                driver = await self._fold_existing(run_id, ix.agent, ix.partition)
            if driver is not None:
                resumed.append(driver)

        async with anyio.create_task_group() as tg:
            for run_id, ix in todo:
                tg.start_soon(one, run_id, ix)
        for driver in resumed:
            self.drivers[driver.run_id] = driver
            self._enqueue(driver.actor, _Resume(driver), front=True)
        self.stats.runs_recovered += len(resumed)
        if todo:
            log.info("recovered %d unfinished run(s) of %d indexed", len(resumed), len(todo))

    async def _fold_existing(self, run_id: str, actor: str, partition: int) -> RunDriver | None:
        """A driver for an existing run from its log, or None if it is over (the index is then fixed)."""
        agent = self.agents.get(split_actor(actor)[0])
        if agent is None:
            log.error("run %s belongs to %s, which no loaded bundle defines: not resumed", run_id, actor)
            return None
        runlog = await read_run(self.js, run_id, actor)
        try:
            state = kernel.fold(agent.config, runlog.events)
        except kernel.EvolveError as e:
            log.error("run %s cannot be folded (%s): not resumed", run_id, e)
            return None
        driver = RunDriver(self.js, agent, actor, run_id, partition, state=state, last_seq=runlog.last_seq,
                           on_event=self.on_event)
        if runlog.events and isinstance(runlog.events[0], ev.RunStarted):
            driver.task_id = runlog.events[0].task_id
        if state.done:
            await self._index(driver)
            return None
        return driver

    # -- consuming ---------------------------------------------------------------------------------------

    async def _on_task(self, msg: Msg) -> None:
        try:
            subject_agent = bus.agent_of_task_subject(msg.subject)
            addressed = decode(subject_agent, msg.data)
        except (BadCommand, ValueError) as e:
            self.stats.rejected += 1
            log.error("rejected a message on %s: %s", msg.subject, e)
            await _term(msg)
            return
        cmd = addressed.command
        md = msg.metadata
        if isinstance(cmd, ev.Task):
            self.stats.tasks += 1
            partition = int(msg.subject.split(".")[1])
            run_id = run_id_for(addressed.agent, cmd.task_id, stream_seq=md.sequence.stream)
            self._enqueue(addressed.agent, _Task(cmd, msg, run_id, partition, md.sequence.stream))
            return
        assert isinstance(cmd, ev.Cancel | ev.Approve | ev.Deny)
        driver = self.drivers.get(cmd.run_id)
        if driver is not None:
            driver.deliver(Inbound(cmd, msg))
            return
        waiting = self.waiting.get(cmd.run_id)
        if waiting is not None and isinstance(cmd, ev.Cancel):
            if waiting.cancel is not None and waiting.cancel.msg is not None:
                await _ack(waiting.cancel.msg)
            waiting.cancel = Inbound(cmd, msg)  # applied right after the run starts
            return
        ix = await self._index_entry(cmd.run_id)
        if ix is not None and ix.status in TERMINAL:
            log.info("%s for run %s ignored: the run already %s", cmd.__struct_config__.tag, cmd.run_id,
                     ix.status)
            await _ack(msg)
            return
        self.stats.rejected += 1
        log.error("%s for unknown run %s (published on %s): dropped", cmd.__struct_config__.tag, cmd.run_id,
                  msg.subject)
        await _term(msg)

    async def _on_result(self, msg: Msg) -> None:
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
        if ix is not None and ix.status in TERMINAL:
            await _ack(msg)  # a late or duplicate outcome of a finished run
            return
        if msg.metadata.num_delivered >= 20:
            log.error("outcome of %s for run %s that no host drives: dropped", outcome.call_id,
                      outcome.run_id)
            await _term(msg)
            return
        await msg.nak(delay=1.0)  # the run is starting or being resumed elsewhere: try again soon

    # -- actors ------------------------------------------------------------------------------------------

    def _enqueue(self, key: str, item: _Task | _Resume, *, front: bool = False) -> None:
        actor = self.actors.get(key)
        if actor is None:
            actor = self.actors[key] = _Actor(key)
        if isinstance(item, _Task):
            for queued in actor.mailbox:  # a redelivery of a task already waiting: keep its place
                if isinstance(queued, _Task) and queued.stream_seq == item.stream_seq:
                    queued.msg = item.msg
                    return
            self.waiting[item.run_id] = item
        if front:
            actor.mailbox.appendleft(item)
        else:
            actor.mailbox.append(item)
        if not actor.running:
            actor.running = True
            assert self._tg is not None
            self._tg.start_soon(self._actor_loop, actor)

    async def _actor_loop(self, actor: _Actor) -> None:
        try:
            while actor.mailbox:
                item = actor.mailbox.popleft()
                try:
                    if isinstance(item, _Task):
                        await self._start(actor.key, item)
                    else:
                        await self._drive(item.driver)
                except Superseded as e:
                    self.stats.superseded += 1
                    log.warning("%s: %s; this host stops driving it", actor.key, e)
                except Exception:
                    log.exception("%s: unexpected error; the run is resumed at the next host start",
                                  actor.key)
        finally:
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
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), agent=actor, input=task.input,
                                task_id=task.task_id, instance=split_actor(actor)[1], timeout_s=timeout,
                                metadata=dict(task.metadata), bundle_digest=agent.bundle.digest)
        seq = await _create(self.js, actor, item.run_id, started)
        if seq is not None:
            self.stats.runs_started += 1
            if self.on_event is not None:
                self.on_event(started)
            driver = RunDriver(self.js, agent, actor, item.run_id, item.partition,
                               state=kernel.evolve(kernel.initial(agent.config), started), last_seq=seq,
                               on_event=self.on_event)
        else:  # this task already became a run (redelivered after a crash, or re-sent): resume or finish it
            existing = await self._fold_existing(item.run_id, actor, item.partition)
            if existing is None:
                if item.msg is not None:
                    await _ack(item.msg)
                if item.cancel is not None and item.cancel.msg is not None:
                    await _ack(item.cancel.msg)
                return
            driver = existing
            self.stats.runs_resumed += 1
        driver.task_id = task.task_id
        await self._index(driver)
        if item.msg is not None:
            await _ack(item.msg)
        if item.cancel is not None:
            driver.deliver(item.cancel)
        await self._drive(driver)

    async def _drive(self, driver: RunDriver) -> None:
        self.drivers[driver.run_id] = driver
        try:
            state = await driver.run()
        finally:
            self.drivers.pop(driver.run_id, None)
        self.stats.runs_ended[state.status] = self.stats.runs_ended.get(state.status, 0) + 1
        await self._index(driver)

    async def _unknown_agent(self, actor: str, item: _Task) -> None:
        served = ", ".join(sorted(self.agents)) or "none"
        log.error("task for unknown agent %s (run %s): this host serves %s", actor, item.run_id, served)
        started = ev.RunStarted(run_id=item.run_id, seq=0, ts=time.time(), agent=actor, input=item.task.input,
                                task_id=item.task.task_id)
        seq = await _create(self.js, actor, item.run_id, started)
        if seq is not None:
            failed = ev.RunFailed(run_id=item.run_id, seq=1, ts=time.time(), agent=actor,
                                  reason="unknown_agent",
                                  detail=f"no bundle defines agent {split_actor(actor)[0]!r}; "
                                         f"agents served: {served}")
            from runtime.host.driver import append_event

            seq = await append_event(self.js, actor, item.run_id, seq, failed)
            for e in (started, failed):
                if self.on_event is not None:
                    self.on_event(e)
            await self._put_index(item.run_id, bus.RunIndex(agent=actor, status="failed",
                                                            partition=item.partition, last_seq=seq,
                                                            updated=time.time(), task_id=item.task.task_id))
        self.stats.runs_ended["failed"] = self.stats.runs_ended.get("failed", 0) + 1
        if item.msg is not None:
            await _ack(item.msg)

    # -- the runs index ----------------------------------------------------------------------------------

    async def _index(self, driver: RunDriver) -> None:
        state = driver.state
        await self._put_index(driver.run_id, bus.RunIndex(
            agent=driver.actor, status=state.status if state.status != "new" else "running",
            partition=driver.partition, last_seq=driver.last_seq, updated=time.time(), task_id=driver.task_id,
            bundle=str(driver.agent.bundle.path)))

    async def _put_index(self, run_id: str, entry: bus.RunIndex) -> None:
        while True:
            try:
                await self._runs_kv.put(run_id, entry.encode())
                return
            except Exception as e:
                log.warning("runs index update of %s failed (%s); retrying", run_id, e)
                await anyio.sleep(0.25)

    async def _index_entry(self, run_id: str) -> bus.RunIndex | None:
        try:
            entry = await self._runs_kv.get(run_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        return bus.RunIndex.decode(entry.value) if entry.value else None


async def _create(js: JetStreamContext, actor: str, run_id: str, started: ev.RunStarted) -> int | None:
    """Append `run.started` only if the run has no event yet; its stream sequence, or None if it exists."""
    headers = bus.occ_headers(actor, run_id, 0, f"{run_id}/0")
    while True:
        try:
            ack = await js.publish(bus.event_subject(actor, run_id, "run.started"), ev.encode(started),
                                   headers=headers)
        except BadRequestError as e:
            if e.err_code == bus.ERR_WRONG_LAST_SEQUENCE:
                return None
            raise
        except Exception as e:
            log.warning("run %s: appending run.started failed (%s); retrying", run_id, e)
            await anyio.sleep(0.25)
            continue
        return None if ack.duplicate else ack.seq


async def _term(msg: Msg) -> None:
    try:
        await msg.term()
    except Exception as e:
        log.debug("term failed: %s", e)


__all__ = ["Host", "HostConfig", "HostStats"]
