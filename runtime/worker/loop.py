"""The worker's job loop: pull tool jobs from TOOLS, run each, publish its outcome, settle the message.

    worker = Worker(js, registry, concurrency=8)
    await worker.run(stop_event)      # `sa worker [--concurrency N] [--tools GLOB] [--bundle B]`

All workers bind the one durable pull consumer `workers` on the TOOLS stream (`runtime.nats.topology`),
so jobs spread over processes and machines. A worker heartbeats every job it holds
(`runtime.worker.attempts`), so a job a dead worker held is redelivered to another AckWait (3 s by
default) after its last heartbeat, however long the tool may run. Per job, in this order (each step's
failure mode in brackets):

1. decode the `ToolJob` [malformed: logged, copied to the DLQ stream, `term()`: never redelivered];
   the last delivery (`num_delivered >= MaxDeliver`) of a job that never produced an outcome is not
   run again: it is dead-lettered with a `crashed` outcome carrying the delivery count (`runtime.worker.dlq`),
   unless every earlier delivery was a hand-off (step 3): such a job never ran;
2. a job whose writes an earlier attempt already applied replays that attempt's recorded output
   (`ResultHandler.recorded`), so a crash between "writes applied" and "ack" never writes twice;
3. look up the exact tool version the job names [lacking: the delivery is handed over to a live worker
   that serves it (or, none taking it, nak'd for a while), else an `input` failure outcome naming the
   version, as the kernel reports a tool it does not know; acked: never a crash loop
   (`runtime.worker.handoff`)]; check the deadline [passed: a `timeout` failure without running];
4. `DataProvider.load_files` -> run the script in Monty under the job's `Limits` (the output model
   validates inside the run) -> `ResultHandler.handle` persists the writes [stale read: re-run on fresh
   data up to 5 times, then an `external` failure; malformed writes: an `output` failure]; a job still at
   it half a second after it began is announced on core NATS to whoever follows its run, and again every
   few seconds (`runtime.streaming.ScriptNotices`: no append, and nothing at all for a shorter job);
5. publish the `ToolOutcome` to RESULTS with Msg-Id `<run>/<call>` and wait for the ack (an output
   over the payload threshold goes to the object store first and the outcome carries its ref:
   `runtime.log.payloads`);
6. ack the job.

Steps 1, 5 and 6 are here (`Worker.handle`); steps 2 to 4 are `runtime.worker.execute`, which sees the
worker only through the `JobEnv` the worker builds once (it never imports this module). A crash anywhere
repeats from step 1 on redelivery; every step is idempotent, so the repetition costs time, never a
duplicate write or a second outcome. The outcome of a redelivery says which delivery it is and why the
earlier ones ended (`runtime.worker.attempts.explain`), and the host records that as a `tool.redelivered`
event.
NATS trouble after the run (publish or KV errors) naks the job with a delay, recording why, instead of
acking a job whose outcome nobody will see.

Beside the jobs, `Worker.run` keeps up what the worker follows and tells: the cancels of every run
(`runtime.worker.cancel`: a cancel stops the sandbox running a job of that run), the `SubrunWatch` of a
worker serving agent tools (`runtime.worker.subruns`: an agent tool's call is a child run, acked here
without an outcome), its `WorkerBeat` for `sa status` (`runtime.worker.stats`), and a `MaxDeliveriesWatch`
(one queue group across workers): a job whose last delivery was lost too stays stuck in TOOLS, and the
server's MaxDeliver advisory is the only sign. What a script's externals are bound to, and how their
answers are recorded exactly once, is `runtime.worker.externals`.

Concurrency: `concurrency` jobs run at once per process and at most as many more wait in a local
prefetch buffer (with heartbeats), so a busy worker holds a bounded number of jobs and leaves the rest
to idle workers; the Monty pool bounds CPU. Jobs arrive through one continuous pull (`runtime.nats.pull.
consume`, the hosts' loop): a request stays open for as many jobs as the buffer has room for, so a job
costs the worker no request of its own (a fetch per job cost a request and its "no more messages"
answer: 2 of the 6 messages a worker exchanged per job). An idle worker keeps its next sandbox session
checked out (`runtime.scripts.pool`). Deliveries other workers hand over (jobs of tool versions
they lack, `runtime.worker.handoff`) join the same buffer, at most `concurrency` of them at a time.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime.externals import ExternalsFactory, Secrets
from runtime.jobs import JobDecodeError, ToolJob, ToolOutcome
from runtime.log import RunLog
from runtime.log.payloads import Payloads
from runtime.logfields import log_context
from runtime.nats.connection import close, connect
from runtime.nats.jetstream import JetStream, jetstream_for
from runtime.nats.pull import Budget, ConsumerGone, consume
from runtime.nats.retry import backoff, retrying
from runtime.nats.subjects import (
    DEFAULT_TOOL_ACK_WAIT_S,
    DEFAULT_TOOL_MAX_DELIVER,
    DLQ,
    TOOLS,
    WORKERS_CONSUMER,
)
from runtime.nats.topology import attach_topology
from runtime.scripts import get_pool
from runtime.streaming import ScriptNotices
from runtime.tools.data import (
    DataProvider,
    JobContext,
    NullDataProvider,
    NullResultHandler,
    ResultHandler,
    WorkspaceDataProvider,
    WorkspaceResultHandler,
)
from runtime.worker import dlq
from runtime.worker.attempts import (
    JobHeartbeats,
    deliveries,
    handed_off,
    record_end,
    retry_delay,
    sync_ack_wait,
)
from runtime.worker.cancel import Cancels
from runtime.worker.execute import JobEnv, execute
from runtime.worker.externals import ExternalRecords
from runtime.worker.handoff import Fleet, HandOff, Offers, offer
from runtime.worker.registry import ToolRegistry
from runtime.worker.stats import Beat, WorkerStats, remove_beat
from runtime.worker.subruns import Delegated, open_watch

log = logging.getLogger("runtime.worker")

PULL_EXPIRES_S = 0.5  # a pull request's life: a stopping worker waits at most this for its deliveries
PUBLISH_PATIENCE_S = 30.0  # keep retrying an outcome's publish this long (heartbeats hold the job meanwhile)


_made = itertools.count(1)  # workers made in this process


def _default_name() -> str:
    """`host:pid`, and `host:pid-n` for the n-th worker of one process: a worker's name keys its beat and
    tells workers apart (`runtime.worker.handoff`), so two in one process (tests, demos) must not share it."""
    n = next(_made)
    return f"{socket.gethostname()}:{os.getpid()}" + (f"-{n}" if n > 1 else "")


class Worker:
    """One worker process's job loop (see the module docstring for the per-job protocol)."""

    def __init__(self, js: JetStreamContext, registry: ToolRegistry, *, concurrency: int = 8,
                 name: str | None = None, max_batch: int = 64,
                 data_provider: DataProvider | None = None, result_handler: ResultHandler | None = None,
                 payload_threshold: int | None = None,
                 ack_wait: float | None = DEFAULT_TOOL_ACK_WAIT_S,
                 on_outcome: Callable[[ToolOutcome], Any] | None = None,
                 externals: ExternalsFactory | None = None, secrets: Secrets | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be ≥ 1")
        self.js = js
        self.registry = registry
        self.concurrency = concurrency
        self.max_batch = max_batch
        self.name = name or _default_name()
        self.stats = WorkerStats()
        self.on_outcome = on_outcome  # each published outcome (metrics: `runtime.observe.metrics`)
        self._workspace_files = data_provider or WorkspaceDataProvider(js)
        self._workspace_writes = result_handler or WorkspaceResultHandler(js)
        self.ack_wait = ack_wait  # set on the shared consumer at start (None: keep the consumer's)
        self.held = JobHeartbeats(ack_wait or DEFAULT_TOOL_ACK_WAIT_S)  # jobs running or buffered
        self._max_deliver = DEFAULT_TOOL_MAX_DELIVER
        self.payloads = Payloads(js, threshold=payload_threshold)
        # nats-py keeps the connection on the context; the advisory watch needs core subscribe
        self._watch = dlq.MaxDeliveriesWatch(js._nc, js, worker=self.name)
        self.cancels = Cancels(self.name)  # runs cancelled lately; the jobs of each running here
        self.ready = anyio.Event()  # set once `run` has put its first beat and takes jobs
        self._intake: MemoryObjectSendStream[Msg] | None = None  # the local buffer, while taking jobs
        self._handed_in = anyio.Semaphore(concurrency)  # room for deliveries other workers hand over
        self._taken_over: set[int] = set()  # id() of the buffered or running ones
        # what a job may touch of this worker (`runtime.worker.execute`); the `externals` KV bucket is
        # opened when a script first needs it
        self.env = JobEnv(js=js, worker=self.name, registry=registry, fleet=Fleet(js, self.name),
                          payloads=self.payloads, io_for=self.io_for, cancels=self.cancels, stats=self.stats,
                          ack_wait=lambda: self.held.ack_wait, max_deliver=lambda: self._max_deliver,
                          records=ExternalRecords(js), externals=externals, secrets=secrets or Secrets(),
                          notices=ScriptNotices(js._nc, self.name))

    @property
    def running_runs(self) -> frozenset[str]:
        """The runs whose jobs this worker is running in the sandbox now."""
        return self.cancels.running_runs

    def io_for(self, job: ToolJob) -> tuple[DataProvider, ResultHandler]:
        """Where a job's files come from and its writes go: the workspace, or (a job without one) its
        bundle's static data and nowhere."""
        if job.workspace:
            return self._workspace_files, self._workspace_writes
        bundle = job.actor.partition(":")[0]  # a `bundle:instance` actor shares its bundle's static data
        return self.registry.providers.get(bundle, NullDataProvider()), NullResultHandler()

    # -- the loop --------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Serve jobs until `stop` is set; jobs already delivered finish (and are acked) before returning.

        `concurrency` runner tasks take jobs from a local buffer that one pull loop keeps topped up to
        `concurrency` more jobs: asking only when a slot frees would mean one round trip per job, which
        caps a worker near 1/RTT jobs/s whatever the concurrency. Buffered jobs get heartbeats too, so
        they are never redelivered while they wait.
        """
        # an idle worker keeps the next sandbox session ready; MCP sessions live until the worker stops
        async with get_pool().warm(), self.registry.mcp.running():
            await self._serve(stop or anyio.Event())

    async def _serve(self, stop: anyio.Event) -> None:
        topo = await attach_topology(self.js)
        ack_wait = topo.tool_ack_wait
        if self.ack_wait is not None:  # a consumer made with another AckWait (the former 30 s) gets ours
            wanted = self.ack_wait
            ack_wait = await retrying(lambda: sync_ack_wait(self.js, wanted), what="setting the tool AckWait",
                                      logger=log)
        self.held.set_ack_wait(ack_wait)
        self._max_deliver = topo.tool_max_deliver
        beat = Beat(self.js, self.name, self.concurrency, sorted(self.registry.tools),
                    [(v.name, v.digest, v.bundle) for v in self.registry.versions()], self.held, self.stats)
        await beat.put()  # before the first job: a worker handed one it lacks sees every taker (`handoff`)
        await self._watch.start()
        cancel_watch = await RunLog(self.js).watch_cancels(self.cancels.on_cancelled)
        # agent tools: the watch that answers a call when its child run ends (None: this worker has none)
        subruns = await open_watch(self.js, self.registry, worker=self.name, patience=PUBLISH_PATIENCE_S)
        room = Budget(2 * self.concurrency)  # running + buffered
        # and up to `concurrency` more that other workers hand over (`_accept`)
        send, receive = anyio.create_memory_object_stream[Msg](3 * self.concurrency)
        offers = Offers(self.js, self.registry, worker=self.name, accept=self._accept)
        self._intake = send
        await offers.open()
        self.ready.set()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.held.run)
                tg.start_soon(self.held.follow, self.js)
                tg.start_soon(beat.run)
                if subruns is not None:
                    tg.start_soon(subruns.run)
                async with anyio.create_task_group() as runners:
                    for _ in range(self.concurrency):
                        runners.start_soon(self._runner, receive.clone(), room)
                    receive.close()
                    async with send:
                        await self._pull(send, room, stop)
                        self._intake = None  # stopping: take no more handed-over deliveries
                        await offers.close()
                tg.cancel_scope.cancel()  # every runner has drained the buffer: stop the heartbeats
        finally:
            self._intake = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await offers.close()
            await self._watch.stop()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await cancel_watch.unsubscribe()
                except Exception as e:  # the connection is closing: nothing left to stop
                    log.debug("cancel watch unsubscribe: %s", e)
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self.registry.close_clients()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await remove_beat(self.js, self.name)

    async def _pull(self, send: MemoryObjectSendStream[Msg], room: Budget, stop: anyio.Event) -> None:
        """Keep the local buffer topped up from the ``workers`` consumer until `stop` is set; the jobs
        already on their way when it is set still come in (`consume(finish=True)`)."""
        async def take(msg: Msg) -> None:  # one unit of `room`, released by the runner that ran it
            self.held.hold(msg)
            send.send_nowait(msg)

        while not stop.is_set():
            try:
                await consume(self.js._nc, TOOLS, WORKERS_CONSUMER, take, stop=stop, batch=self.max_batch,
                              expires=PULL_EXPIRES_S, budget=room, finish=True)
            except ConsumerGone as e:  # a cluster lost it for a moment (the hosts make it again): retry
                await backoff("pulling tool jobs", e, delay=0.5, logger=log)

    def _accept(self, msg: Msg) -> bool:
        """Take a delivery another worker hands over (`runtime.worker.handoff`) into the local buffer, if
        this worker is taking jobs and has fewer than `concurrency` such deliveries already."""
        intake = self._intake
        if intake is None:
            return False
        try:
            self._handed_in.acquire_nowait()
        except anyio.WouldBlock:
            return False
        self.held.hold(msg)
        self._taken_over.add(id(msg))
        try:
            intake.send_nowait(msg)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._taken_over.discard(id(msg))
            self.held.settle(msg)
            self._handed_in.release()
            return False
        self.stats.handed_in += 1
        return True

    async def _runner(self, jobs: anyio.abc.ObjectReceiveStream[Msg], room: Budget) -> None:
        async with jobs:
            async for msg in jobs:
                try:
                    await self.handle(msg)
                except Exception:  # a bug here must not kill the loop; the job is redelivered after AckWait
                    log.exception("worker %s: unexpected error on %s", self.name, msg.subject)
                finally:
                    self.held.settle(msg)
                    get_pool().settle()  # the job's outcome is out: now ready the next sandbox session
                    if id(msg) in self._taken_over:  # handed over by another worker
                        self._taken_over.discard(id(msg))
                        self._handed_in.release()
                    else:
                        room.release()

    # -- one job ---------------------------------------------------------------------------------------

    async def handle(self, msg: Msg) -> None:
        """Process one delivered job message end to end (public for tests and custom loops)."""
        try:
            job = ToolJob.decode(msg.data)
        except JobDecodeError as e:
            await self._dead_letter(msg, str(e))
            return
        with log_context(run_id=job.run_id, agent=job.actor, call_id=job.call_id):
            await self._handle(msg, job)

    async def _handle(self, msg: Msg, job: ToolJob) -> None:
        attempt = deliveries(msg)
        if await self._last_after_crashes(job, attempt):
            await self._give_up(msg, job, attempt)
            return
        outcome = await execute(self.env, job, attempt)
        if isinstance(outcome, str):  # NATS trouble: retry later, later each time (MaxDeliver is finite)
            await self._give_back(msg, job, attempt, outcome)
            return
        if isinstance(outcome, HandOff):  # this worker lacks the tool version: another one has it
            await self._hand_off(msg, job, attempt, outcome)
            return
        if isinstance(outcome, Delegated):  # the child's end answers the call (`SubrunWatch`): done here
            log.info("worker %s: %s delegated to sub-run %s", self.name, job.msg_id, outcome.child_run)
            self.stats.delegated += 1
            await msg.ack()
            return
        await self._publish(msg, job, attempt, outcome)

    async def _publish(self, msg: Msg, job: ToolJob, attempt: int, outcome: ToolOutcome) -> None:
        """Publish the outcome (retrying NATS trouble for a while), then ack the job."""
        sending = outcome

        async def publish() -> None:  # a retry sends the outcome offloaded before: its payload is stored once
            nonlocal sending
            sending = await self.payloads.offload_outcome(sending)
            await self.js.publish(sending.subject, sending.encode(), headers=sending.headers())

        try:  # retry here, not by redelivery: a leader election must not use up the job's deliveries
            await retrying(publish, what=f"worker {self.name}: publishing the outcome of {job.msg_id}",
                           give_up=PUBLISH_PATIENCE_S, level=logging.INFO, logger=log)
        except Exception as e:
            log.warning("worker %s: cannot publish the outcome of %s (%s); will retry",
                        self.name, job.msg_id, e)
            await self._give_back(msg, job, attempt, f"its outcome could not be published ({e})")
            return
        self.stats.completed += 1
        self.stats.failed += outcome.result.error is not None
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        self.stats.cancelled += outcome.result.error is not None and outcome.result.error.kind == "cancelled"
        await msg.ack()

    async def _give_back(self, msg: Msg, job: ToolJob, attempt: int, reason: str) -> None:
        """Nak the job with a growing delay, recording why for the delivery that comes next."""
        self.stats.nacked += 1
        await record_end(self.js, job.msg_id, attempt, self.name, reason)
        await msg.nak(delay=retry_delay(attempt))

    async def _hand_off(self, msg: Msg, job: ToolJob, attempt: int, handoff: HandOff) -> None:
        """Hand the delivery to a worker that has the job's tool version; if none takes it, back to the
        stream (recorded as a hand-off), or at its last delivery its failure (`runtime.worker.handoff`)."""
        taker = await offer(self.js, msg, handoff.targets, worker=self.name) if msg.reply else None
        if taker is not None:  # its delivery now: nothing to settle here
            log.info("worker %s: handed %s to worker %s (%s)", self.name, job.msg_id, taker, handoff.reason)
            self.stats.handed_off += 1
            return
        if handoff.last is not None:
            log.warning("worker %s: %s: %s", self.name, job.msg_id, handoff.last.result.error)
            await self._publish(msg, job, attempt, handoff.last)
            return
        log.info("worker %s: no worker took %s; back to the stream for %g s (%s)", self.name, job.msg_id,
                 handoff.delay, handoff.reason)
        self.stats.handed_off += 1
        await record_end(self.js, job.msg_id, attempt, self.name, handoff.reason, handoff=True)
        await msg.nak(delay=handoff.delay)

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        log.error("worker %s: malformed job on %s: %s (moved to %s)", self.name, msg.subject, reason, DLQ)
        md = msg.metadata
        try:
            await dlq.copy_to_dlq(self.js, subject=msg.subject, data=msg.data, stream_seq=md.sequence.stream,
                                  deliveries=md.num_delivered, reason=reason, headers=msg.headers)
        except Exception as e:
            log.warning("cannot dead-letter %s: %s", msg.subject, e)
            await msg.nak(delay=1.0)
            return
        self.stats.dead_lettered += 1
        await msg.term()

    async def _last_after_crashes(self, job: ToolJob, attempt: int) -> bool:
        """The job's last delivery, after earlier ones that ended without an outcome, not all of them
        hand-offs (a job that was only handed off never ran: it is no suspect of killing workers)."""
        if not 1 < self._max_deliver <= attempt or await self._has_record(job):
            return False
        return not set(range(1, attempt)) <= await handed_off(self.js, job.msg_id)

    async def _has_record(self, job: ToolJob) -> bool:
        """An earlier delivery applied this job's writes (its outcome is known, only unpublished)."""
        try:
            return await self.io_for(job)[1].recorded(JobContext(job)) is not None
        except Exception:
            return False

    async def _give_up(self, msg: Msg, job: ToolJob, attempt: int) -> None:
        """The last delivery of a job whose earlier deliveries all ended without an outcome: dead-letter
        it and tell the run it crashed, instead of running it again (it may be what kills workers)."""
        reason = (f"each of the {attempt - 1} earlier deliveries ended without a result: the worker was "
                  f"killed, lost its NATS connection or stalled: it stopped heartbeating the job")
        try:
            await dlq.settle(self.js, subject=msg.subject, data=msg.data,
                             stream_seq=msg.metadata.sequence.stream, deliveries=attempt, reason=reason,
                             worker=self.name, headers=msg.headers)
        except Exception as e:  # the message stays stuck; the MaxDeliver advisory brings it back to a watch
            log.warning("worker %s: cannot dead-letter %s: %s", self.name, job.msg_id, e)
            await msg.nak(delay=1.0)
            return
        log.error("worker %s: %s delivered %d times without a result: dead-lettered, run %s told it crashed",
                  self.name, job.msg_id, attempt, job.run_id)
        self.stats.dead_lettered += 1
        self.stats.completed += 1
        self.stats.failed += 1
        await msg.term()


async def serve(servers: str | list[str] | None, registry: ToolRegistry, *, concurrency: int = 8,
                stop: anyio.Event | None = None, ensure: bool = True,
                on_ready: Callable[[Worker], Any] | None = None,
                ack_wait: float | None = DEFAULT_TOOL_ACK_WAIT_S,
                on_outcome: Callable[[ToolOutcome], Any] | None = None,
                externals: ExternalsFactory | None = None, secrets: Secrets | None = None) -> WorkerStats:
    """Connect, make sure the topology exists, run a worker until `stop`; return its counters."""
    nc = await connect(servers, name="sa-worker")
    try:
        js = jetstream_for(nc)
        stop = stop or anyio.Event()
        if ensure and not await _attached(js, stop):  # stopped while waiting for a host
            return WorkerStats()
        worker = Worker(js, registry, concurrency=concurrency, ack_wait=ack_wait, on_outcome=on_outcome,
                        externals=externals, secrets=secrets)
        if on_ready is not None:
            on_ready(worker)
        await worker.run(stop)
        return worker.stats
    finally:
        await close(nc)


async def _attached(js: JetStream, stop: anyio.Event) -> bool:
    """Wait for the topology (the hosts own it, `attach_topology(create=False)`), or for `stop`: a worker
    started before any host must still stop at once when told to. True once attached."""
    attached = False
    async with anyio.create_task_group() as tg:
        async def attach() -> None:
            nonlocal attached
            await attach_topology(js, create=False)
            attached = True
            tg.cancel_scope.cancel()

        async def stopped() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(attach)
        tg.start_soon(stopped)
    return attached
