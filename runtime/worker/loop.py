"""Tool workers: run the sandboxed tool jobs of every agent, on any machine that reaches NATS.

    worker = Worker(js, registry, concurrency=8)
    await worker.run(stop_event)      # `sa worker [--concurrency N] [--tools GLOB] [--bundle B]`

All workers bind the one durable pull consumer `workers` on the TOOLS stream (`runtime.nats.topology`),
so jobs spread over processes and machines. A worker heartbeats every job it holds (`runtime.attempts`),
so a job a dead worker held is redelivered to another AckWait (3 s by default) after its last heartbeat,
however long the tool may run. Per job, in this order (each step's failure mode in brackets):

1. decode the `ToolJob` [malformed: logged, copied to the DLQ stream, `term()`: never redelivered];
   the last delivery (`num_delivered >= MaxDeliver`) of a job that never produced an outcome is not
   run again: it is dead-lettered with a `crashed` outcome carrying the delivery count (`runtime.dlq`);
2. a job whose writes an earlier attempt already applied replays that attempt's recorded output
   (`ResultHandler.recorded`), so a crash between "writes applied" and "ack" never writes twice;
3. look up the tool [unknown: an `input` failure outcome, as the kernel reports a tool it does not know;
   acked: never a crash loop]; check the deadline [passed: a `timeout` failure without running];
4. `DataProvider.load_files` -> run the script in Monty under the job's `Limits` (the output model
   validates inside the run) -> `ResultHandler.handle` persists the writes [stale read: re-run on fresh
   data up to 5 times, then an `external` failure; malformed writes: an `output` failure];
5. publish the `ToolOutcome` to RESULTS with Msg-Id `<run>/<call>` and wait for the ack (an output
   over the payload threshold goes to the object store first and the outcome carries its ref:
   `runtime.payloads`);
6. ack the job.

A crash anywhere repeats from step 1 on redelivery; every step is idempotent, so the repetition costs
time, never a duplicate write or a second outcome. The outcome of a redelivery says which delivery it is
and why the earlier ones ended (`runtime.attempts.explain`), and the host records that as a
`tool.redelivered` event. NATS trouble after the run (publish or KV errors) naks the job with a delay,
recording why, instead of acking a job whose outcome nobody will see.

Cancel reaches the sandbox: a worker follows every `run.cancelled` appended (`RunLog.watch_cancels`). A job
of that run it is running is stopped at once (the sandbox run is cancelled, which kills its Monty process;
the pool starts a fresh one), a job of it that arrives later is not run, and either way the outcome is a
`cancelled` failure, published and acked as usual, and the worker takes its next job. The host records
that outcome after `run.cancelled` (it waits briefly for it), so the log shows the tool really stopped.

Each worker also runs a `MaxDeliveriesWatch` (one queue group across workers): a job whose last
delivery was lost too stays stuck in TOOLS, and the server's MaxDeliver advisory is the only sign.

Externals: a script's `@external` functions come from the bundle's grants (built-ins), the bundle's
`externals:` factory or the worker's (`sa worker --externals package.module:factory`), built per job with
an `ExecutionContext` (`runtime.externals.provide`). Each answered external call is recorded in the
`externals` KV bucket before the script goes on, so a redelivered job replays answered calls instead of
making them again (`runtime.externals.record` states the guarantee). Secret values a tool was granted are
scrubbed from its outcome. Python tools of a bundle (`- python: module:function`) run here too, under their
own timeout, concurrency limit and retry policy (`runtime.tools.hosted`), and so do a bundle's agent tools
(`- agent: name`): the call starts a child run of that agent and its job is acked; the child's end answers
the call, through the `SubrunWatch` every worker serving agent tools runs (`runtime.subruns`).

Concurrency: `concurrency` jobs run at once per process and at most as many more wait in a local
prefetch buffer (with heartbeats), so a busy worker holds a bounded number of jobs and leaves the rest
to idle workers; the Monty pool bounds CPU.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime import dlq
from runtime import events as ev
from runtime.attempts import JobHeartbeats, deliveries, explain, record_end, retry_delay, sync_ack_wait
from runtime.externals import ExecutionContext, ExternalsFactory, Grants, Secrets
from runtime.externals.builtins import redact_value
from runtime.externals.provide import Provided, ToolSetup, provide
from runtime.externals.record import externals_kv
from runtime.jobs import JobDecodeError, ToolJob, ToolOutcome
from runtime.log import RunLog
from runtime.nats.connection import close, connect
from runtime.nats.kv import fleet_kv, put_kv
from runtime.nats.pull import fetch_batch
from runtime.nats.records import WorkerBeat
from runtime.nats.retry import retrying
from runtime.nats.subjects import (
    DEFAULT_TOOL_ACK_WAIT_S,
    DEFAULT_TOOL_MAX_DELIVER,
    DLQ,
    TOOLS,
    WORKERS_BUCKET,
    WORKERS_CONSUMER,
)
from runtime.nats.topology import attach_topology
from runtime.observe.logs import log_context
from runtime.payloads import PayloadError, Payloads
from runtime.scripts import Limits, LimitsError
from runtime.subruns import SubrunWatch, start_child
from runtime.tools import ScriptTool, ToolContext, discover_tools
from runtime.tools.agent_tool import AgentTool
from runtime.tools.data import (
    DataProvider,
    JobContext,
    NullDataProvider,
    NullResultHandler,
    ResultHandler,
    StaticDataProvider,
    WorkspaceConflict,
    WorkspaceDataProvider,
    WorkspaceResultHandler,
    WriteError,
)
from runtime.tools.hosted import HostedPythonTool
from runtime.types import ScriptNote, ToolError, ToolResult

log = logging.getLogger("runtime.worker")

CONFLICT_RETRIES = 5  # each conflict means another job's write landed: progress is guaranteed
COALESCE_S = 0.002  # how long a busy worker waits to fetch several jobs in one round trip
PUBLISH_PATIENCE_S = 30.0  # keep retrying an outcome's publish this long (heartbeats hold the job meanwhile)
BEAT_S = 5.0  # a `WorkerBeat` in the `workers` bucket this often (for `sa status`), living 3x as long
CANCELLED_KEPT = 4096  # recently cancelled runs remembered, so their queued jobs are not run


# ---------------------------------------------------------------------------------------------------------
# the tools a worker can run
# ---------------------------------------------------------------------------------------------------------


class ToolRegistry:
    """Tools by name, from bundles and .pym globs: each a `ScriptTool` carrying its own limits and output
    model (set by its bundle). `by_digest` indexes the same tools by script content hash: a script is
    loaded (parsed, checked, transformed) once per process, when the worker starts."""

    def __init__(self) -> None:
        self.tools: dict[str, ScriptTool | HostedPythonTool | AgentTool] = {}
        self.by_digest: dict[str, ScriptTool | HostedPythonTool | AgentTool] = {}
        self.providers: dict[str, DataProvider] = {}  # agent (bundle name) -> its static data provider
        self.setups: dict[str, ToolSetup] = {}  # tool -> its bundle's grants, factory and model
        self._clients: dict[str, Any] = {}  # bundle name -> its model client, made on first ask_llm

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def get(self, name: str) -> ScriptTool | HostedPythonTool | AgentTool | None:
        return self.tools.get(name)

    def add(self, tool: ScriptTool | HostedPythonTool | AgentTool) -> None:
        old = self.tools.get(tool.name)
        if old is not None and old.content_hash != tool.content_hash:
            log.warning("tool %s from %s replaces the one from %s", tool.name, tool.path, old.path)
        self.tools[tool.name] = tool
        self.by_digest[tool.content_hash] = tool

    async def close_clients(self) -> None:
        """Close the model clients `ask_llm` made (the next call makes a new one)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except Exception as e:  # closing is best effort: the process may be ending anyway
                log.debug("closing a model client: %s", e)

    def add_globs(self, patterns: Iterable[str]) -> list[str]:
        """Every `.pym` matching the globs (files and folders work too), with default limits; a script
        that cannot be a tool is an error (a worker must not start half-equipped)."""
        patterns = list(patterns)
        if not patterns:
            return []
        found, failures = discover_tools(patterns)
        if failures:
            raise ValueError("cannot load tools:\n" + "\n".join(str(f) for f in failures))
        for t in found:
            self.add(t)
        return [t.name for t in found]

    def add_bundle(self, path: str | Path) -> list[str]:
        """Every tool of a bundle with its resolved limits and output model; its static data, if any."""
        from runtime.bundle import load_bundle

        bundle = load_bundle(path)

        def model() -> Any:  # the bundle's model client, shared by its tools' ask_llm calls
            client = self._clients.get(bundle.name)
            if client is None:
                from runtime.agent import model_client

                client = self._clients[bundle.name] = model_client(bundle)
            return client

        for t in bundle.tools.values():
            self.add(t)
            self.setups[t.name] = ToolSetup(bundle=bundle.name, grants=bundle.grants.get(t.name) or Grants(),
                                            factory=bundle.factory, model=model,
                                            sampling=dict(bundle.spec.model.sampling))
        dp = bundle.data_provider
        if dp.kind == "static":
            self.providers[bundle.name] = StaticDataProvider(dp.files, folder=dp.folder)
        return list(bundle.tools)


# ---------------------------------------------------------------------------------------------------------
# the worker
# ---------------------------------------------------------------------------------------------------------


@dataclass
class WorkerStats:
    """Counters for tests, benchmarks and `sa status` (per process)."""

    completed: int = 0  # outcomes published (ok or failed)
    failed: int = 0  # of which the tool failed
    replayed: int = 0  # redeliveries answered from the recorded output
    dead_lettered: int = 0
    nacked: int = 0
    writes: int = 0
    cancelled: int = 0  # jobs stopped (or not started) because their run was cancelled
    delegated: int = 0  # agent-tool calls handed to a sub-run


@dataclass(frozen=True)
class Delegated:
    """A job whose call became a child run: acked without an outcome (the child's end brings it)."""

    child_run: str


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
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
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
        self._running: dict[str, set[anyio.CancelScope]] = {}  # run id -> the scopes of its jobs here
        self._cancelled: OrderedDict[str, str] = OrderedDict()  # run id -> why, the most recent ones
        self.externals = externals  # the worker's own factory (`--externals`); a bundle's comes first
        self.secrets = secrets or Secrets()
        self._records: Any = None  # the `externals` KV bucket, opened when a script first needs it

    # -- cancels ---------------------------------------------------------------------------------------

    @property
    def running_runs(self) -> frozenset[str]:
        """The runs whose jobs this worker is running in the sandbox now."""
        return frozenset(self._running)

    def _on_cancelled(self, event: ev.RunCancelled) -> None:
        """A run was cancelled: stop its jobs running here, and do not start the ones still to come."""
        why = f"the run was cancelled{' by ' + event.by if event.by else ''}"
        why += f": {event.reason}" if event.reason else ""
        self._cancelled[event.run_id] = why
        self._cancelled.move_to_end(event.run_id)
        while len(self._cancelled) > CANCELLED_KEPT:
            self._cancelled.popitem(last=False)
        for scope in self._running.get(event.run_id, ()):
            log.info("worker %s: stopping a job of run %s (%s)", self.name, event.run_id, why)
            scope.cancel()

    @contextmanager
    def _stoppable(self, run_id: str) -> Iterator[anyio.CancelScope]:
        """A scope a cancel of `run_id` cancels (which stops the sandbox run inside it)."""
        with anyio.CancelScope() as scope:
            self._running.setdefault(run_id, set()).add(scope)
            try:
                yield scope
            finally:
                scopes = self._running.get(run_id)
                if scopes is not None:
                    scopes.discard(scope)
                    if not scopes:
                        del self._running[run_id]

    # -- the loop --------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event | None = None) -> None:
        """Serve jobs until `stop` is set; jobs already fetched finish (and are acked) before returning.

        `concurrency` runner tasks take jobs from a local buffer that one fetch loop keeps topped up to
        `concurrency` more jobs: fetching only when a slot frees would mean one fetch round trip per
        job, which caps a worker near 1/RTT jobs/s whatever the concurrency. Buffered jobs get
        heartbeats too, so they are never redelivered while they wait.
        """
        stop = stop or anyio.Event()
        topo = await attach_topology(self.js)
        ack_wait = topo.tool_ack_wait
        if self.ack_wait is not None:  # a consumer made with another AckWait (the former 30 s) gets ours
            wanted = self.ack_wait
            ack_wait = await retrying(lambda: sync_ack_wait(self.js, wanted), what="setting the tool AckWait",
                                      logger=log)
        self.held.set_ack_wait(ack_wait)
        self._max_deliver = topo.tool_max_deliver
        psub = await self.js.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
        await self._watch.start()
        cancels = await RunLog(self.js).watch_cancels(self._on_cancelled)
        subruns = None  # agent tools: the watch that answers a call when its child run ends
        if any(isinstance(t, AgentTool) for t in self.registry.tools.values()):
            subruns = SubrunWatch(self.js, worker=self.name)
            await retrying(subruns.open, what="opening the sub-run watch", give_up=PUBLISH_PATIENCE_S,
                           logger=log)
        room = anyio.Semaphore(2 * self.concurrency)  # running + buffered
        send, receive = anyio.create_memory_object_stream[Msg](2 * self.concurrency)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.held.run)
                tg.start_soon(self.held.follow, self.js)
                tg.start_soon(self._beat)
                if subruns is not None:
                    tg.start_soon(subruns.run)
                async with anyio.create_task_group() as runners:
                    for _ in range(self.concurrency):
                        runners.start_soon(self._runner, receive.clone(), room)
                    receive.close()
                    async with send:
                        while not stop.is_set():
                            await room.acquire()
                            taken = 1
                            while taken < self.max_batch and room.value > 0:
                                room.acquire_nowait()
                                taken += 1
                            # runners still have buffered jobs: wait briefly for more free slots, so a
                            # busy worker fetches a few jobs per round trip instead of one at a time
                            want = min(self.max_batch, max(1, self.concurrency // 4))
                            while taken < want and send.statistics().current_buffer_used > 0:
                                with anyio.move_on_after(COALESCE_S):
                                    await room.acquire()
                                    taken += 1
                                    continue
                                break
                            msgs = [] if stop.is_set() else await fetch_batch(psub, taken, timeout=0.5)
                            for _ in range(taken - len(msgs)):
                                room.release()
                            for m in msgs:
                                self.held.hold(m)
                                send.send_nowait(m)
                tg.cancel_scope.cancel()  # every runner has drained the buffer: stop the heartbeats
        finally:
            await self._watch.stop()
            await psub.unsubscribe()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await cancels.unsubscribe()
                except Exception as e:  # the connection is closing: nothing left to stop
                    log.debug("cancel watch unsubscribe: %s", e)
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self.registry.close_clients()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await (await fleet_kv(self.js, WORKERS_BUCKET)).delete(self._beat_key)
                except Exception as e:  # it expires by itself
                    log.debug("removing the worker heartbeat failed: %s", e)

    @property
    def _beat_key(self) -> str:
        return "".join(c if c.isalnum() or c in "-_" else "-" for c in self.name)

    async def _beat(self) -> None:
        """Tell `sa status` this worker lives, what it holds and what it has done (best effort)."""
        started = time.time()
        tools = sorted(self.registry.tools)
        try:
            await fleet_kv(self.js, WORKERS_BUCKET)  # streams made by an older version lack it
        except Exception as e:
            log.debug("workers bucket: %s", e)
        while True:
            beat = WorkerBeat(name=self.name, started=started, concurrency=self.concurrency,
                                  running=len(self.held), completed=self.stats.completed,
                                  failed=self.stats.failed, tools=tools)
            try:
                await put_kv(self.js, WORKERS_BUCKET, self._beat_key, beat.encode(), ttl=3 * BEAT_S,
                                 timeout=BEAT_S)
            except Exception as e:
                log.debug("worker heartbeat failed: %s", e)
            await anyio.sleep(BEAT_S)

    async def _runner(self, jobs: anyio.abc.ObjectReceiveStream[Msg], room: anyio.Semaphore) -> None:
        async with jobs:
            async for msg in jobs:
                try:
                    await self.handle(msg)
                except Exception:  # a bug here must not kill the loop; the job is redelivered after AckWait
                    log.exception("worker %s: unexpected error on %s", self.name, msg.subject)
                finally:
                    self.held.settle(msg)
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
        if 1 < self._max_deliver <= attempt and not await self._has_record(job):
            await self._give_up(msg, job, attempt)
            return
        outcome = await self._execute(job, attempt)
        if isinstance(outcome, str):  # NATS trouble: retry later, later each time (MaxDeliver is finite)
            await self._give_back(msg, job, attempt, outcome)
            return
        if isinstance(outcome, Delegated):  # the child's end answers the call (`SubrunWatch`): done here
            log.info("worker %s: %s delegated to sub-run %s", self.name, job.msg_id, outcome.child_run)
            self.stats.delegated += 1
            await msg.ack()
            return
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

    async def _has_record(self, job: ToolJob) -> bool:
        """An earlier delivery applied this job's writes (its outcome is known, only unpublished)."""
        try:
            return await self._io(job)[1].recorded(JobContext(job)) is not None
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

    def _io(self, job: ToolJob) -> tuple[DataProvider, ResultHandler]:
        if job.workspace:
            return self._workspace_files, self._workspace_writes
        bundle = job.actor.partition(":")[0]  # a `bundle:instance` actor shares its bundle's static data
        return self.registry.providers.get(bundle, NullDataProvider()), NullResultHandler()

    async def _execute(self, job: ToolJob, attempt: int) -> ToolOutcome | Delegated | str:
        """The job's outcome, or why NATS trouble means it should be retried later."""
        fields: dict[str, Any] = {"worker": self.name, "attempt": attempt, "started": time.time(),
                                  "earlier": await explain(self.js, job.msg_id, attempt, self.held.ack_wait)}
        if job.arguments_ref is not None:  # arguments too big for the job message: in the object store
            try:
                arguments = await self.payloads.resolve(job.arguments_ref)
            except PayloadError as e:
                return ToolOutcome.for_job(job, ToolResult.failure("input", str(e)), **fields)
            except Exception as e:
                log.warning("worker %s: cannot read the arguments of %s: %s", self.name, job.msg_id, e)
                return f"its arguments could not be read ({e})"
            job = msgspec.structs.replace(job, arguments=arguments, arguments_ref=None)
        provider, handler = self._io(job)
        ctx = JobContext(job)
        try:
            if attempt > 1 and (prior := await handler.recorded(ctx)) is not None:
                self.stats.replayed += 1
                return ToolOutcome.for_job(job, ToolResult(output=prior.output), writes=prior.writes,
                                           **fields)
        except Exception as e:
            log.warning("worker %s: cannot read the applied marker of %s: %s", self.name, job.msg_id, e)
            return f"its applied-writes marker could not be read ({e})"

        tool = self.registry.get(job.tool)
        if tool is None:  # `input`, as the kernel says of a tool it does not know
            known = ", ".join(sorted(self.registry.tools)) or "none"
            return ToolOutcome.for_job(job, ToolResult.failure(
                "input", f"no tool named {job.tool!r} is loaded on worker {self.name} (it has: {known})",
                detail="unknown_tool"), **fields)
        if job.tool_digest and tool.content_hash != job.tool_digest:
            log.warning("tool %s: the host expects version %s, this worker has %s",
                        tool.name, job.tool_digest, tool.content_hash)
        try:  # the job's limits dict, validated once per distinct value (Limits keeps the one cache)
            limits = Limits.resolve(job.limits) if job.limits else None  # None: the tool's own
        except LimitsError as e:
            return ToolOutcome.for_job(job, ToolResult.failure("limit", f"invalid limits in the job: {e}"),
                                       **fields)
        if isinstance(tool, AgentTool):  # a sub-run: started (or found); its end answers the call
            if job.run_id in self._cancelled:
                return self._cancelled_outcome(job, [], fields)
            try:
                started = await start_child(self.js, tool, job)
            except Exception as e:
                log.warning("worker %s: cannot start the sub-run of %s: %s", self.name, job.msg_id, e)
                return f"its sub-run could not be started ({e})"
            if isinstance(started, ToolResult):
                return ToolOutcome.for_job(job, started, **fields)
            return Delegated(started)
        last_conflict = ""
        for _ in range(CONFLICT_RETRIES):
            if job.deadline is not None:
                left = job.deadline - time.time()
                if left <= 0:
                    return ToolOutcome.for_job(job, ToolResult.failure(
                        "timeout", "the call's deadline passed before a worker could run it"), **fields)
                budget = tool.limits.merge(limits).effective().max_duration
                if budget and left < budget:
                    limits = (limits or Limits()).merge(Limits(max_duration=left))
            ctx = JobContext(job)
            try:
                files = await provider.load_files(job.tool, job.arguments, ctx)
            except Exception as e:
                log.warning("worker %s: cannot load files for %s: %s", self.name, job.msg_id, e)
                return f"its data files could not be loaded ({e})"
            notes: list[ScriptNote] = []  # shipped in the outcome as the sandbox made them
            if job.run_id in self._cancelled:
                return self._cancelled_outcome(job, notes, fields)
            execution = ExecutionContext.of(
                agent=job.actor.partition(":")[0], actor=job.actor, run_id=job.run_id, call_id=job.call_id,
                tool=job.tool, attempt=attempt, deadline=job.deadline, workspace=job.workspace,
                environ=getattr(tool, "environ", None), metadata=await self._task_metadata(job, tool))
            provided = await self._provide(tool, execution, notes)
            if isinstance(provided, ToolResult):
                return ToolOutcome.for_job(job, provided, **fields)
            assert not isinstance(tool, AgentTool)
            with self._stoppable(job.run_id) as scope:
                result = await tool.execute(job.arguments, ToolContext(
                    run_id=job.run_id, agent=job.actor, call_id=job.call_id, files=files, limits=limits,
                    on_event=notes.append, externals=provided.externals or None, execution=execution))
            if scope.cancelled_caught:
                return self._cancelled_outcome(job, notes, fields)
            if provided.recorder is not None and provided.recorder.replayed:
                log.info("worker %s: %s replayed %d recorded external call(s), made %d", self.name,
                         job.msg_id, provided.recorder.replayed, provided.recorder.made)
            if provided.secrets:
                result, notes = _scrubbed(result, notes, provided.secrets)
            if result.error is not None:
                return ToolOutcome.for_job(job, result, notes=tuple(notes), **fields)
            try:
                await handler.handle(job.tool, result.output, ctx)
            except WriteError as e:
                failed = ToolResult.failure("output", str(e), duration_ms=result.duration_ms)
                return ToolOutcome.for_job(job, failed, notes=tuple(notes), **fields)
            except WorkspaceConflict as e:
                log.info("worker %s: %s; re-running on fresh data", self.name, e)
                last_conflict = str(e)
                await anyio.sleep(random.uniform(0.0, 0.02))  # de-synchronise writers racing in lock-step
                continue
            except Exception as e:
                log.warning("worker %s: cannot persist writes of %s: %s", self.name, job.msg_id, e)
                return f"its workspace writes could not be persisted ({e})"
            self.stats.writes += ctx.writes_applied
            return ToolOutcome.for_job(job, result, notes=tuple(notes), writes=ctx.writes_applied, **fields)
        return ToolOutcome.for_job(job, ToolResult.failure(
            "external", f"{last_conflict} (gave up after {CONFLICT_RETRIES} attempts)", detail="conflict"),
            **fields)


    async def _task_metadata(self, job: ToolJob, tool: ScriptTool | HostedPythonTool | AgentTool,
                             ) -> dict[str, Any]:
        """The task's metadata for an `ExecutionContext`, read from the run's `run.started` only for a tool
        that can see it (a script with externals, a Python tool): other jobs pay no read."""
        if isinstance(tool, AgentTool) or (isinstance(tool, ScriptTool) and not tool.script.externals):
            return {}
        try:
            started = await RunLog(self.js).started(job.run_id, job.actor)
        except Exception as e:  # the context lacks the metadata; the call itself can still run
            log.debug("worker %s: cannot read run.started of %s: %s", self.name, job.run_id, e)
            return {}
        return dict(started.metadata) if started is not None else {}

    async def _provide(self, tool: ScriptTool | HostedPythonTool | AgentTool, execution: ExecutionContext,
                       notes: list[ScriptNote]) -> Provided | ToolResult:
        """The job's externals (those its script declares), or the `external` failure naming what is
        missing."""
        if not isinstance(tool, ScriptTool):
            return Provided({})

        async def kv() -> Any:
            if self._records is None:
                self._records = await externals_kv(self.js)
            return self._records

        def printed(text: str) -> None:
            notes.append(ScriptNote(kind="printed", ts=time.time(), text=text, stream="external",
                                    script=tool.name, call_id=execution.call_id))

        provided = await provide(tool.script, tool.name, self.registry.setups.get(tool.name), self.externals,
                                 execution, kv, self.secrets, printed)
        return ToolResult(error=provided) if isinstance(provided, ToolError) else provided

    def _cancelled_outcome(self, job: ToolJob, notes: list[ScriptNote],
                           fields: dict[str, Any]) -> ToolOutcome:
        """A job of a cancelled run: `cancelled`, and a `failed` note closing the sandbox run it stopped."""
        why = self._cancelled.get(job.run_id, "the run was cancelled")
        stopped = "stopped while it ran" if notes else "not started"
        failure = ToolResult.failure("cancelled", f"{job.tool} {stopped}: {why}")
        if notes:
            ran = round((time.time() - notes[0].ts) * 1000, 3)
            notes.append(ScriptNote(kind="failed", ts=time.time(), error=failure.error, duration_ms=ran,
                                    script=notes[0].script, call_id=notes[0].call_id))
        return ToolOutcome.for_job(job, failure, notes=tuple(notes), **fields)


def _scrubbed(result: ToolResult, notes: list[ScriptNote],
              secrets: list[str]) -> tuple[ToolResult, list[ScriptNote]]:
    """The result and notes with every granted secret's value replaced: nothing the worker sends back
    (and so nothing in the run's events) carries a secret, even one a script printed or returned."""
    error = result.error
    if error is not None:
        error = msgspec.structs.replace(error, message=redact_value(error.message, secrets))
    clean = ToolResult(output=redact_value(result.output, secrets), error=error,
                       duration_ms=result.duration_ms)
    out = []
    for n in notes:
        err = n.error
        if err is not None:
            err = msgspec.structs.replace(err, message=redact_value(err.message, secrets))
        out.append(msgspec.structs.replace(n, text=redact_value(n.text, secrets), error=err))
    return clean, out


def build_registry(*, bundles: Iterable[str | Path] = (), tool_globs: Iterable[str] = ()) -> ToolRegistry:
    """The registry `sa worker` serves: every bundle's tools, then every glob's scripts."""
    reg = ToolRegistry()
    for b in bundles:
        reg.add_bundle(b)
    reg.add_globs(tool_globs)
    return reg


async def serve(servers: str | list[str] | None, registry: ToolRegistry, *, concurrency: int = 8,
                stop: anyio.Event | None = None, ensure: bool = True,
                on_ready: Callable[[Worker], Any] | None = None,
                ack_wait: float | None = DEFAULT_TOOL_ACK_WAIT_S,
                on_outcome: Callable[[ToolOutcome], Any] | None = None,
                externals: ExternalsFactory | None = None, secrets: Secrets | None = None) -> WorkerStats:
    """Connect, make sure the topology exists, run a worker until `stop`; return its counters."""
    nc = await connect(servers, name="sa-worker")
    try:
        js = nc.jetstream()
        if ensure:
            await attach_topology(js)
        worker = Worker(js, registry, concurrency=concurrency, ack_wait=ack_wait, on_outcome=on_outcome,
                        externals=externals, secrets=secrets)
        if on_ready is not None:
            on_ready(worker)
        await worker.run(stop)
        return worker.stats
    finally:
        await close(nc)


__all__ = ["ToolRegistry", "Worker", "WorkerStats", "build_registry", "serve"]
