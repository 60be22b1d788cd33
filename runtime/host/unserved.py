"""Tasks for agents no live host serves: they wait for a host that serves them, and are failed only when
none has for `HostConfig.unserved_after` seconds.

Why they wait. A host consumes only the slots of the bundles it serves (`runtime.host.partitions`), so a task
for an agent no live host serves is delivered to nobody: it stays in TASKS, on disk, and when a host serving
the agent starts, its slot consumers deliver everything stored for the bundle. That is what a publisher
wants while the agent's hosts restart, or when a team's hosts start after its first tasks were sent.

Why they are failed at last. A task for an agent no host will ever serve (a typo, a retired bundle) must not
wait unseen for ever: as a host always did for an unknown agent, the task becomes a run that fails at once,
``run.started`` then ``run.failed`` with reason ``unknown_agent`` naming the agents that are served, so the
publisher following the run id learns why. Only the delay is new.

Who does it. One host sweeps: the live host with the smallest id (every host reads the same ``hosts``
bucket, so they agree but for a moment while hosts come and go). Every `SWEEP_EVERY_S` it looks whether
TASKS holds messages no consumer can deliver (the stream's count against its consumers'); if so it lists
the bundles stored in it (`subjects.stored_bundle`) and notes since when each bundle no live host serves
(`HostBeat.agents`) has been seen so. A bundle unserved for `unserved_after` by that watch has its messages
read through a consumer of the sweeper's own over every partition (`subjects.unserved_task_filters`): each
task fails ``unknown_agent``; a command (cancel, approve, resume) is logged and terminated, since no host
holds a run of it; a message that is not a command is terminated, as a host does. A message published for
an actor that names no agent at all (``agents.:.tasks``: its bundle token is empty, so no filter can name
it) is logged and deleted at once.

Races. The sweeper's consumer overlaps every slot consumer of the bundle, and a WorkQueue stream refuses a
consumer that overlaps another: while a host holds a slot of the bundle the sweeper cannot read its tasks
(it gives up), and while the sweeper reads, a host just started retries its slot consumers until the
sweeper deletes its own. The sweeper reads the live hosts again after making its consumer and stops if the
bundle is served by then. Two hosts sweeping at once make one consumer between them; a run refused twice
is recorded once (its ``run.started`` expects an empty log).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import anyio
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from runtime import events as ev
from runtime.commands import BadCommand, decode, run_id_for
from runtime.host.actors import Task
from runtime.host.config import HostStats
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.pull import fetch_batch
from runtime.nats.records import HostBeat
from runtime.nats.subjects import (
    HOSTS_BUCKET,
    TASKS,
    bundle_slug,
    parse_task_subject,
    stored_bundle,
    unserved_task_filters,
)
from runtime.nats.topology import consumer_infos

log = logging.getLogger("runtime.host")

SWEEP_EVERY_S = 2.0
FETCH_BATCH = 64
ERR_CONSUMER_OVERLAPS = 10100  # "filtered consumer not unique on workqueue stream"

Refuse = Callable[[str, Task, str, str], Awaitable[None]]  # (actor, task, reason, detail): a failed run


class Unserved:
    """The sweep of one host (see the module docstring); `refuse` records a task's failed run and acks it."""

    def __init__(self, js: JetStreamContext, host_id: str, *, after: float, refuse: Refuse,
                 stats: HostStats) -> None:
        self.js, self.host_id, self.after, self.refuse, self.stats = js, host_id, after, refuse, stats
        self.since: dict[str, float] = {}  # bundle -> when this host first saw it waiting, unserved

    async def run(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep()
            except Exception as e:  # NATS trouble: the tasks wait in the stream; look again next time
                log.warning("sweeping tasks of unserved agents failed: %s: %s", type(e).__name__, e)
            with anyio.move_on_after(SWEEP_EVERY_S):
                await stop.wait()

    async def sweep(self) -> int:
        """One look (if this host is the sweeper); how many tasks were failed."""
        beats = await self._live()
        if min([*beats, self.host_id]) != self.host_id:
            self.since.clear()  # another host sweeps; should it go, this one starts its own watch
            return 0
        served = _served(beats)
        waiting = await self._waiting_subjects()
        bundles = {stored_bundle(subject) for subject in waiting}
        now = time.monotonic()
        self.since = {b: self.since.get(b, now) for b in bundles if b and b not in served}
        for subject in waiting:
            if stored_bundle(subject) == "":  # published for an actor of ":" alone: no agent at all
                await self._drop_nameless(subject)
        failed = 0
        for bundle, since in list(self.since.items()):
            if now - since >= self.after:
                failed += await self._fail(bundle)
        return failed

    async def _live(self) -> dict[str, HostBeat]:
        out = {}
        for key, entry in (await kv_entries(await fleet_kv(self.js, HOSTS_BUCKET))).items():
            try:
                out[key] = HostBeat.decode(entry.value)
            except Exception as e:
                log.debug("unreadable heartbeat of %s: %s", key, e)
        return out

    async def _waiting_subjects(self) -> list[str]:
        """The stored TASKS subjects (in the current form) when some message is no consumer's; none when
        every message is some consumer's, pending or held: the common case, answered without listing
        subjects."""
        info = await self.js.stream_info(TASKS)
        consumers = await consumer_infos(self.js, TASKS)
        held = sum((c.num_pending or 0) + (c.num_ack_pending or 0) for c in consumers)
        if info.state.messages <= held:
            return []
        listed = await self.js.stream_info(TASKS, subjects_filter="tasks.>")
        return [subject for subject in listed.state.subjects or {} if stored_bundle(subject) is not None]

    async def _fail(self, bundle: str) -> int:
        """Fail every task stored for `bundle`, through a consumer of its own; 0 if a host serves it now."""
        name = f"unserved-{bundle_slug(bundle)}"
        try:
            await self.js.add_consumer(TASKS, ConsumerConfig(
                name=name, filter_subjects=unserved_task_filters(bundle), deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0, inactive_threshold=30.0))
        except BadRequestError as e:
            if e.err_code == ERR_CONSUMER_OVERLAPS:  # a host serving the bundle holds a slot of it now
                self.since.pop(bundle, None)
                return 0
            raise
        failed = 0
        try:
            beats = await self._live()
            served = _served(beats)
            if bundle in served:  # a host serving it came while the consumer was made
                self.since.pop(bundle, None)
                return 0
            agents = ", ".join(sorted(served)) or "none"
            detail = (f"no live host has served agent {bundle!r} for {self.after:g} s; agents served: "
                      f"{agents}: start a host with its bundle, then send the task again")
            psub = await self.js.pull_subscribe_bind(name, stream=TASKS)
            try:
                while msgs := await fetch_batch(psub, FETCH_BATCH, timeout=1.0):
                    for msg in msgs:
                        failed += await self._one(msg, detail)
            finally:
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(TASKS, name)
        self.since.pop(bundle, None)
        if failed:
            log.error("failed %d task(s) of agent %s: no live host served it for %g s", failed, bundle,
                      self.after)
        return failed

    async def _drop_nameless(self, subject: str) -> None:
        """Drop the messages stored on `subject`, published for an actor that names no agent (such as
        ``agents.:.tasks``), as a host drops any message that is not a command: no consumer's filter can
        name their empty bundle token, so they are read by sequence and deleted."""
        while True:
            try:
                raw = await self.js.get_msg(TASKS, subject=subject)
            except NotFoundError:
                return
            log.error("rejected a message on %s (stream sequence %s): its subject names no agent", subject,
                      raw.seq)
            await self.js.delete_msg(TASKS, raw.seq or 0)

    async def _one(self, msg: Msg, detail: str) -> int:
        """Fail one task (1), or terminate a command or a message that is none (0)."""
        try:
            subject_agent, operator = parse_task_subject(msg.subject)
            addressed = decode(subject_agent, msg.data, operator)
        except (BadCommand, ValueError) as e:
            log.error("rejected a message on %s: %s", msg.subject, e)
            await msg.term()
            return 0
        cmd = addressed.command
        if not isinstance(cmd, ev.Task):
            log.error("%s for run %s of %s dropped: no live host serves the agent", cmd.__struct_config__.tag,
                      getattr(cmd, "run_id", "?"), addressed.agent)
            await msg.term()
            return 0
        seq = msg.metadata.sequence.stream
        run_id = run_id_for(addressed.agent, cmd.task_id, stream_seq=seq)
        item = Task(cmd, msg, run_id, int(msg.subject.split(".")[1]), seq)
        log.error("task for %s (run %s): no live host serves the agent", addressed.agent, item.run_id)
        await self.refuse(addressed.agent, item, "unknown_agent", detail)
        self.stats.unserved_failed += 1
        return 1


def _served(beats: dict[str, HostBeat]) -> set[str]:
    return {agent for beat in beats.values() for agent in beat.agents}


__all__ = ["SWEEP_EVERY_S", "Unserved"]
