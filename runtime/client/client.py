"""The one way an outside process uses the fleet: connect, give an agent a task, hold its run.

    async with await Client.connect("nats://localhost:4222") as client:
        handle = await client.start("planner", "summarise the inbox", thread="inbox")
        print(await handle.result(timeout=120))
        print(await client.run("calc", "17 * 23 + 4"))          # start + result

For a Temporal user: `Client.connect` is `Client.connect`, `start` is `start_workflow` (idempotent by task id
as a workflow id is), `RunHandle.result` / `cancel` / `fetch_history` are `result` / `cancel` / `replay`,
signals to a waiting workflow are `approve` / `deny`, and `fork` has no equivalent there (a reset re-runs
activities; a fork never re-calls the model for what it keeps).

Why one client: `sa` and `sa ui` are thin faces over it, so a script, a test and the CLI reach a run by the
same code, and what the CLI can do a program can do. The client owns its connection (`close`, or use it
as a context manager) unless it was given one (`Client(nc)`), and it writes nothing but tasks and the
commands hosts apply: every answer comes from the log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from runtime import events as ev
from runtime.client.control import Control, Pending, Question
from runtime.client.handle import RunHandle
from runtime.client.schedules import Schedules
from runtime.client.submit import submit
from runtime.log import RunLog
from runtime.nats.connection import close, connect
from runtime.nats.credentials import Credentials
from runtime.nats.jetstream import JetStream, jetstream_for
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import RunIndex

if TYPE_CHECKING:
    from runtime.bundle import Bundle
    from runtime.client.diff import Divergence
    from runtime.client.fork import Forked, ForkEdit
    from runtime.client.work import ToolWork
    from runtime.log import Purged
    from runtime.nats.records import ThreadRecord
    from runtime.regress import Report
    from runtime.worker.dlq import DeadLetter


@dataclass(frozen=True)
class RunInfo:
    """A run as the runs index lists it (a cache of its log the hosts keep: enough to list runs)."""

    run_id: str
    actor: str
    status: str
    updated: float
    task_id: str | None
    last_seq: int  # the stream sequence of its last event (EVENTS'): see `seq` for the run's own
    bundle: str | None
    forked_from: str | None
    partition: int | None = None  # the task partition whose host drives the run
    forked_at: int | None = None  # a fork: the seq of `forked_from` it was forked at
    seq: int | None = None  # the run's seq of its last event, as `sa replay` shows it (None: not recorded)

    @classmethod
    def of(cls, run_id: str, ix: RunIndex) -> RunInfo:
        return cls(run_id, ix.actor, ix.status, ix.updated, ix.task_id, ix.last_seq, ix.bundle,
                   ix.forked_from, ix.partition, ix.forked_at, ix.seq)

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON object (`sa runs --json`)."""
        return dataclasses.asdict(self)

    def belongs_to(self, agent: str | None) -> bool:
        """True for any run when `agent` is None, else for runs of that bundle or bundle:instance."""
        return agent is None or agent in (self.actor, self.actor.split(":")[0])


class Client:
    """A connection to the fleet (see the module docstring)."""

    def __init__(self, nc: NATS, *, owns_connection: bool = False) -> None:
        self.nc = nc
        self.js: JetStream = jetstream_for(nc)
        self.log = RunLog(self.js)
        self.control = Control(self.js)
        self.schedules = Schedules(self.js)  # runs started by the cluster's clock (`sa schedule`)
        self._owns = owns_connection

    @classmethod
    def over(cls, source: Client | JetStreamContext) -> Client:
        """`source` as a client: a JetStream context (what older callers hold) becomes a client over the
        same connection, which stays the caller's to close; a client is itself."""
        return source if isinstance(source, Client) else cls(source._nc)

    @classmethod
    async def connect(cls, servers: str | Sequence[str] | None = None, *,
                      credentials: Credentials | None = None, name: str = "sa-client",
                      **options: Any) -> Client:
        """Connect to `servers` (default: `NATS_URL`, else the `sa up` running on this machine, found as
        every `sa` command finds it, `runtime.running.find_nats`, and logged at INFO; a comma-separated
        list for a cluster). Credentials
        and TLS come from `credentials`, else from the environment as `sa` reads them (NATS_CREDS,
        NATS_USER / NATS_PASSWORD, NATS_CA / NATS_CERT / NATS_KEY). `options` go to nats-py's `connect`
        (a client gives up after a few reconnect attempts unless told otherwise)."""
        if servers is None:
            import logging

            from runtime.running import find_nats

            servers = find_nats(note=logging.getLogger("runtime.client").info)
            if servers is None:
                raise ConnectionError("no NATS server: pass its URL, set NATS_URL, or start `sa up` (a "
                                      "running `sa up` is found by itself)")
        opts: dict[str, Any] = {"max_reconnect_attempts": 3}
        if credentials is not None:
            opts.update(credentials.connect_options())
        opts.update(options)
        return cls(await connect(servers, name=name, **opts), owns_connection=True)

    async def close(self) -> None:
        """Close the connection if this client opened it."""
        if self._owns:
            await close(self.nc)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- runs ------------------------------------------------------------------------------------------

    async def start(self, agent: str, input: str, *, instance: str | None = None, thread: str | None = None,
                    task_id: str | None = None, metadata: dict[str, Any] | None = None,
                    timeout: float | None = None, headers: dict[str, str] | None = None,
                    wait: float = 0.0, on_waiting: Callable[[str], None] | None = None,
                    priority: int | None = None) -> RunHandle:
        """Give `agent` (a bundle, or `bundle:instance`) a task; return its run's handle once the task is
        stored. Idempotent by `task_id` (default: a new one): starting the same task id again returns the
        same run and runs nothing twice. `timeout` is the run's deadline in seconds; `thread` continues a
        conversation of the agent; `wait` how long to wait for a host to create the streams; `priority`
        (0..9, higher first; None: the bundle's) orders its model calls at a busy endpoint. An input too
        big for one message is stored in the payload object store and the task refers to it. Raises
        `NotSent` if the task was not stored (saying why, `reason` telling the cases apart), `ValueError`
        for a name that can never be."""
        run_id, _ = await submit(self.js, agent, input, task_id=task_id, instance=instance, timeout_s=timeout,
                                 thread=thread, metadata=metadata, headers=headers, wait=wait,
                                 on_waiting=on_waiting, payloads=self.log.payloads, priority=priority)
        actor = f"{agent.split(':')[0]}:{instance}" if instance else agent
        return RunHandle(self, run_id, actor)

    async def run(self, agent: str, input: str, *, result_timeout: float | None = None,
                  **start: Any) -> Any:
        """`start(...)` then its handle's `result(result_timeout)`: the output, or the typed error."""
        handle = await self.start(agent, input, **start)
        return await handle.result(result_timeout)

    def get(self, run_id: str, actor: str | None = None) -> RunHandle:
        """A handle on an existing run (nothing is read until it is used)."""
        return RunHandle(self, run_id, actor)

    async def run_info(self, run_id: str) -> RunInfo | None:
        """The runs index's entry for one run, or None."""
        try:
            entry = await (await runs_kv(self.js)).get(run_id)
        except KeyNotFoundError:
            return None
        return RunInfo.of(run_id, RunIndex.decode(entry.value)) if entry.value else None

    async def runs(self, agent: str | None = None, *, limit: int | None = None) -> list[RunInfo]:
        """The runs the index lists (of `agent`: a bundle or bundle:instance), most recently updated
        first, at most `limit`."""
        entries = await kv_entries(await runs_kv(self.js))
        rows = [RunInfo.of(key, RunIndex.decode(entry.value)) for key, entry in entries.items()
                if entry.value]
        rows = sorted((r for r in rows if r.belongs_to(agent)), key=lambda r: r.updated, reverse=True)
        return rows[:limit] if limit is not None else rows

    async def index(self) -> dict[str, RunIndex]:
        """The runs index's entries whole, by run id, in no order: what `runs` lists, with the fields its
        rows leave out (a fork's `forked_at`, the partition), for a view that draws fork trees."""
        entries = await kv_entries(await runs_kv(self.js))
        return {key: RunIndex.decode(entry.value) for key, entry in entries.items() if entry.value}

    async def approvals(self, agent: str | None = None) -> list[Pending]:
        """Every call waiting for a person across runs (of `agent`), oldest first."""
        return await self.control.pending(agent)

    async def questions(self, agent: str | None = None) -> list[Question]:
        """Every question a run asks a person (`ask_human`) that waits for an answer, across runs (of
        `agent`), oldest first; answer one with `answer` or `RunHandle.answer`."""
        return await self.control.questions(agent)

    async def answer(self, run_id: str, call_id: str, answer: Any, *,
                     by: str | None = None) -> ev.QuestionAnswered | ev.ToolFailed:
        """Answer run `run_id`'s question of call `call_id` (`RunHandle.answer`)."""
        return await self.control.answer(run_id, call_id, answer, by=by)

    async def purge(self, before: float, *, agent: str | None = None, dry_run: bool = False) -> list[Purged]:
        """Delete finished runs last updated before unix time `before` (of `agent`): events, payloads and
        index entries together; runs still in flight are skipped with the reason."""
        rows = [r for r in await self.runs(agent) if r.updated < before]
        chosen = [r.run_id for r in sorted(rows, key=lambda r: r.updated)]
        return await self.log.purge(chosen, dry_run=dry_run)

    async def fork(self, run_id: str, at: int, edit: ForkEdit | None = None, *,
                   bundle: Bundle | None = None) -> Forked:
        """A new run that keeps run `run_id`'s events before seq `at` (with `edit` applied there) and goes
        on from that point without re-calling the model for what it kept: the fork as written (its run
        id, actor, partition, how many events it holds). `ForkError` if it cannot be made as asked
        (nothing is written then); `RunHandle.fork` is the same, returning the new run's handle."""
        from runtime.client.fork import fork

        return await fork(self.js, run_id, at, edit, bundle=bundle)

    async def diff(self, a: str, b: str) -> Divergence:
        """Where run `b` (a fork of `a`, say) diverges from `a`, and what differs after."""
        from runtime.client.diff import diverge

        first, second = await self.log.read(a), await self.log.read(b)
        for run_id, history in ((a, first), (b, second)):
            if not history.events:
                raise LookupError(f"no events for run {run_id!r} (see `sa runs`)")
        return diverge(a, first.events, b, second.events)

    async def regress(self, candidate: str | Path, **options: Any) -> Report:
        """Drive recorded runs again on the candidate bundle at `candidate`, the tools' results served from
        the log, and report run by run what changed (`runtime.regress.regression.regression`: `agent=` with a
        selection, or `set_name=`; `save=` names the selection; overrides, rules, graders). `RegressError`
        for bad input, with nothing written."""
        from runtime.regress.regression import regression

        return await regression(self.js, candidate, **options)

    async def regressions(self) -> dict[str, Any]:
        """The saved regression sets (name, agent, how many runs) and the reports kept in the fleet, newest
        first, without their rows (`runtime.regress.saved`)."""
        from runtime.regress.saved import list_reports
        from runtime.regress.sets import list_sets, load_set

        sets = [await load_set(self.js, name) for name in await list_sets(self.js)]
        return {"sets": [{"name": s.name, "agent": s.agent, "runs": len(s.runs), "created": s.created}
                         for s in sets], "reports": await list_reports(self.js)}

    async def regression_report(self, report_id: str) -> dict[str, Any]:
        """A saved regression report whole, rows included; `runtime.regress.saved.NoReport` if none."""
        from runtime.regress.saved import load_report

        return await load_report(self.js, report_id)

    # -- conversations and the fleet -------------------------------------------------------------------

    async def threads(self, agent: str | None = None) -> list[ThreadRecord]:
        """The conversations (threads) of every actor, or of `agent`'s."""
        from runtime.log.threads import Threads

        return await Threads(self.js).all(agent)

    async def thread(self, actor: str, thread: str) -> ThreadRecord | None:
        """One conversation of `actor` with its runs in order, or None."""
        from runtime.log.threads import Threads

        record, _ = await Threads(self.js).get(actor, thread)
        return record

    async def served(self) -> set[str]:
        """The bundles some live host serves now (from the hosts' heartbeats, gone a lease TTL after a host
        dies): a task for any other agent waits in TASKS until a host serving it starts."""
        from runtime.nats.kv import fleet_kv
        from runtime.nats.records import HostBeat
        from runtime.nats.subjects import HOSTS_BUCKET

        beats = await kv_entries(await fleet_kv(self.js, HOSTS_BUCKET))
        return {agent for entry in beats.values() if entry.value
                for agent in HostBeat.decode(entry.value).agents}

    async def agents(self) -> dict[str, str]:
        """The bundles some live host serves now (as `served`), each with its `description:` ("" when the
        bundle has none): what a face offers as agents to call (`sa mcp serve`'s tools)."""
        from runtime.nats.kv import fleet_kv
        from runtime.nats.records import HostBeat
        from runtime.nats.subjects import HOSTS_BUCKET

        out: dict[str, str] = {}
        for entry in (await kv_entries(await fleet_kv(self.js, HOSTS_BUCKET))).values():
            if entry.value:
                beat = HostBeat.decode(entry.value)
                for agent in beat.agents:
                    out[agent] = out.get(agent) or beat.descriptions.get(agent, "")
        return out

    async def status(self) -> dict[str, Any]:
        """The fleet now: hosts and their partitions, workers, queue depths, runs in flight."""
        from runtime.client.status import gather

        return await gather(self.js)

    async def tool_work(self) -> ToolWork:
        """The tool jobs not done yet (waiting, or held by a worker), with why earlier deliveries ended."""
        from runtime.client.work import tool_work

        return await tool_work(self.js)

    async def dead_letters(self) -> list[DeadLetter]:
        """The tool jobs no worker could finish (DLQ), oldest first, each with its reason (`sa dlq`)."""
        from runtime.client.work import dead_letters

        return await dead_letters(self.js)

    async def replay_dead_letter(self, seq: int) -> DeadLetter:
        """Send dead letter `seq` back to the workers (`sa dlq replay SEQ`); KeyError if there is none."""
        from runtime.client.work import replay_dead_letter

        return await replay_dead_letter(self.js, seq)


__all__ = ["Client", "RunInfo"]
