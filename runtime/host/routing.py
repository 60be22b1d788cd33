"""Where a message of a served slot goes: a task to its actor, a command or an outcome to its run.

A slot is one partition of one bundle (`runtime.host.leases.Slot`); its consumers deliver only that
bundle's messages, so every message here is for an agent this host serves.

A task-subject message (`runtime.commands`) is one of:
* a task: queued in its actor's mailbox, its run id derived from it (`commands.run_id_for`); it keeps its
  unit of the back-pressure budget while it waits. First the host admits it (`admit`): when its actor or
  thread is busy, the bundle's `conversation.double_texting` may refuse it or interrupt the active run.
  A task on its bundle's subject whose body names an instance is not run here: it is published again on the
  instance's subject, which stores it in the instance's partition, and acked (`Router._to_instance`);
* a resume for a run written by a client (a fork): folded from its log and queued in its actor's mailbox
  at once (a run with no events is logged and terminated);
* a cancel / approve / deny / answer for a run (only from a command subject, ``ops.<agent>.<operator>``,
  whose operator becomes the command's ``by``), or a wake for a run's timer or question (from the cluster's
  clock, `runtime.host.scheduler`): handed to the run's driver, or kept beside a task still waiting (a
  cancel, applied right after the run starts), or acked if the run already ended; a run of this partition
  that no driver holds (asleep on a timer, or waiting for an answer) is folded back first
  (`Recovery.unpark`); a command sent on the bundle's subject for a run of ``bundle:instance`` is
  republished to the partition that owns the run; a command for a run that does not exist is logged and
  terminated;
* not a command at all (`commands.BadCommand`): logged with the reason and terminated — never redelivered,
  never stopping the host; on a task subject it is also recorded as a run that fails at once with
  `bad_task` and the reason, under the run id a task gets, so its publisher finds why (`sa replay RUN`).

A RESULTS message (a tool outcome) goes to the driver of its run; a late or duplicate outcome of a run that
ended is acked; one for a run nobody drives yet (it is starting, or being resumed) is retried a little
later; from its third delivery, an unfinished run of a slot this host serves is folded back from its log
to take it (a takeover's recovery missed it); one for a run the index does not know is dropped after 20
deliveries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.commands import PARENT_RUN, BadCommand, decode, refused_task, run_id_for, split_actor
from runtime.driver.ports import release_quietly
from runtime.host.actors import Actors, Task
from runtime.host.config import HostStats
from runtime.host.driver import Inbound, RunDriver, ack_quietly
from runtime.host.leases import Slot
from runtime.host.partitions import Guarded
from runtime.host.runs_index import RunsIndex
from runtime.jobs import JobDecodeError, ToolOutcome
from runtime.log import Superseded
from runtime.nats.pull import Budget
from runtime.nats.records import QUEUED, RunIndex
from runtime.nats.subjects import (
    ANONYMOUS,
    HDR_MSG_ID,
    HDR_TASK_SEQ,
    command_subject,
    is_subtask_subject,
    parse_task_subject,
    partition_of,
    subtask_subject,
    task_subject,
)

log = logging.getLogger("runtime.host")

OUTCOME_RETRY_S = 1.0  # an outcome for a run nobody drives yet comes again this late
OUTCOME_MAX_DELIVERIES = 20
OUTCOME_FOLD_AFTER = 3  # deliveries of an outcome finding no driver before its run is folded back for it
RunCommand = ev.Cancel | ev.Approve | ev.Deny | ev.Wake | ev.Answer  # a command for one existing run


class Router:
    """Routes the messages of the slots `serves` says this host holds; `total_partitions()` is the
    partition count of the streams (known once the host has read the topology)."""

    def __init__(self, js: JetStreamContext, actors: Actors, index: RunsIndex, budget: Budget,
                 stats: HostStats, *, serves: Callable[[Slot], bool],
                 total_partitions: Callable[[], int],
                 resume: Callable[[str, str, int], Awaitable[bool]],
                 admit: Callable[[str, Task], Awaitable[bool]] | None = None,
                 refuse: Callable[[str, Task, str, str], Awaitable[None]] | None = None,
                 unpark: Callable[[str, str, int], Awaitable[RunDriver | None]] | None = None) -> None:
        self.js, self.actors, self.index, self.budget, self.stats = js, actors, index, budget, stats
        self.serves, self.total_partitions, self.resume, self.admit = serves, total_partitions, resume, admit
        self.refuse = refuse  # records a refused task as a run failing with the reason (`Host._refuse`)
        self.unpark = unpark  # folds back a run no driver holds (asleep on a timer) for a command

    async def on_task(self, slot: Slot, raw: Msg) -> None:
        """A message of `slot`'s task consumer; it carries one unit of `self.budget`."""
        kept = False
        try:
            kept = await self.route_command(slot[1], Guarded(raw, self.serves, slot))
        finally:
            if not kept:
                self.budget.release()

    async def route_command(self, p: int, msg: Guarded) -> bool:
        """Route one task-subject message; True if it now waits in a mailbox (keeping its budget unit)."""
        headers = msg.headers or {}
        msg_id = headers.get(HDR_MSG_ID)
        first_seq = _first_seq(headers)  # a task moved here from its bundle's subject, that had no id
        try:
            subject_agent, operator = parse_task_subject(msg.subject)
            addressed = decode(subject_agent, msg.data, operator, msg_id=None if first_seq else msg_id)
        except (BadCommand, ValueError) as e:
            self.stats.rejected += 1
            log.error("rejected a message on %s: %s", msg.subject, e)
            if not await self._record_refusal(p, msg, msg_id, str(e)):
                await _term(msg)
            return False
        cmd = addressed.command
        md = msg.metadata
        if isinstance(cmd, ev.Task) and is_subtask_subject(msg.subject) and not cmd.metadata.get(PARENT_RUN):
            self.stats.rejected += 1
            log.error("rejected a task on %s: the sub-run subject carries only tasks that name their parent "
                      "run (%s); publish other tasks on agents.<agent>.tasks", msg.subject, PARENT_RUN)
            await _term(msg)
            return False
        if isinstance(cmd, ev.Task) and addressed.agent != subject_agent:
            await self._to_instance(addressed.agent, cmd, msg)  # its instance was named in the body only
            return False
        if isinstance(cmd, ev.Task):
            self.stats.tasks += 1
            run_id = run_id_for(addressed.agent, cmd.task_id, stream_seq=first_seq or md.sequence.stream)
            task = Task(cmd, msg, run_id, p, md.sequence.stream)
            if self.admit is not None and not await self.admit(addressed.agent, task):
                return False  # refused by the bundle's double_texting (and acked)
            queued = self.actors.enqueue(addressed.agent, task)
            if queued and self.actors.behind(addressed.agent, run_id):
                self.actors.spawn(self._index_queued, addressed.agent, task)
            return queued
        if isinstance(cmd, ev.Resume):
            if await self.resume(cmd.run_id, addressed.agent, p):
                await ack_quietly(msg)
            else:
                self.stats.rejected += 1
                log.error("resume of run %s (on %s): the run has no events", cmd.run_id, msg.subject)
                await _term(msg)
            return False
        assert isinstance(cmd, ev.Cancel | ev.Approve | ev.Deny | ev.Wake | ev.Answer)
        await self._to_run(cmd, p, msg)
        return False

    async def _to_run(self, cmd: RunCommand, p: int, msg: Guarded) -> None:
        """A command for one run: to its driver, beside its waiting task, or to the run folded back from its
        sleep; acked if the run ended, forwarded if it lives in another partition, else dropped."""
        driver = self.actors.drivers.get(cmd.run_id)
        if driver is not None:
            driver.deliver(Inbound(cmd, msg))
            return
        waiting = self.actors.waiting.get(cmd.run_id)
        if waiting is not None and isinstance(cmd, ev.Cancel):
            if waiting.cancel is not None and waiting.cancel.msg is not None:
                await ack_quietly(waiting.cancel.msg)
            waiting.cancel = Inbound(cmd, msg)  # applied right after the run starts
            return
        ix = await self.index.get(cmd.run_id)
        if ix is not None and ix.status in kernel.TERMINAL:
            log.info("%s for run %s ignored: the run already %s", cmd.__struct_config__.tag, cmd.run_id,
                     ix.status)
            await ack_quietly(msg)
            return
        if ix is not None and ix.partition == p and await self._unparked(cmd, ix, msg):
            return
        if ix is not None and ix.partition != p and not isinstance(cmd, ev.Wake) and \
                await self._forward(cmd, ix, msg):
            return
        self.stats.rejected += 1
        log.error("%s for unknown run %s (published on %s): dropped", cmd.__struct_config__.tag, cmd.run_id,
                  msg.subject)
        await _term(msg)

    async def _index_queued(self, actor: str, task: Task) -> None:
        """List a task that waits behind its actor's run as ``queued`` (`sa runs`, the client), so a task
        behind a long run is visible. Written once and only for a task that waits: an idle actor's task
        costs no write; the run's own entry replaces it when it starts (an entry further along its log is
        never overwritten by this one, `supersedes`)."""
        await self.index.put(task.run_id, RunIndex(actor=actor, status=QUEUED, partition=task.partition,
                                                   last_seq=0, updated=time.time(),
                                                   task_id=task.task.task_id))

    async def _unparked(self, item: RunCommand | ToolOutcome, ix: RunIndex, msg: Guarded) -> bool:
        """A command or outcome for an unfinished run of this partition that no driver holds: the run folded
        back from its log takes it first; True if it was handled (or the run turned out to have ended:
        acked). For a command the run is usually asleep on a timer; for an outcome that came back
        `OUTCOME_FOLD_AFTER` times, a takeover's recovery missed the run, and without this the outcome
        would be dropped after `OUTCOME_MAX_DELIVERIES` and nothing would drive the run again. The fold
        fences the run; refused (`Superseded`: this host cannot show it holds the slot, or another writer
        appended meanwhile), the message is handed back (a nak) for the owner, not left to its AckWait."""
        if self.unpark is None:
            return False
        try:
            driver = await self.unpark(item.run_id, ix.actor, ix.partition)
        except Superseded as e:  # this host lost the slot, or another writer appended while it folded
            log.info("run %s: not folded back here (%s); its %s is handed back", item.run_id, e,
                     "outcome" if isinstance(item, ToolOutcome) else item.__struct_config__.tag)
            await release_quietly(msg, delay=OUTCOME_RETRY_S)
            return True
        if driver is not None:
            if isinstance(item, ToolOutcome):
                log.warning("run %s: its tool outcome found no driver here; folded back from its log",
                            item.run_id)
            driver.deliver(Inbound(item, msg))
            return True
        if (await self.index.get(item.run_id) or ix).status in kernel.TERMINAL:
            await ack_quietly(msg)  # its log says it ended
            return True
        return False

    async def _record_refusal(self, p: int, msg: Guarded, msg_id: str | None, reason: str) -> bool:
        """A message on a task subject that is not a task: recorded as a run that fails at once with
        `bad_task` and the reason (`commands.refused_task`), under the run id any task gets (from its
        Nats-Msg-Id, else its stream sequence), so its publisher can find why; True if it was (and the
        message acked). Refused commands and sub-run tasks are only logged, as before."""
        try:
            subject_agent, operator = parse_task_subject(msg.subject)
        except ValueError:
            return False
        if self.refuse is None or operator is not None or is_subtask_subject(msg.subject):
            return False
        seq = msg.metadata.sequence.stream
        task = refused_task(subject_agent, msg.data, msg_id)
        run_id = run_id_for(subject_agent, task.task_id, stream_seq=seq)
        await self.refuse(subject_agent, Task(task, msg, run_id, p, seq), "bad_task", reason)
        return True

    async def _to_instance(self, actor: str, task: ev.Task, msg: Guarded) -> None:
        """A task published on its bundle's subject whose body names an instance: publish it on the
        instance's own subject, which the stream stores in the instance's partition (the subject alone
        decides the partition, so this is the only way the body can), then ack this one. So instances
        spread over partitions, hence hosts, whichever way a publisher names them, and a task reaches the
        same host as one `sa send --instance` publishes.

        Nothing is lost or run twice: the copy is stored before the original is acked, and a redelivered
        original publishes the same copy again, which the stream drops as a duplicate: its Msg-Id is the
        run id, the same on every delivery (not the original's Msg-Id: the stream remembers that one and
        would drop the copy). The copy carries the task id the run id derives from (one taken from the
        original's Msg-Id is written into the task), or for a task with neither, the original's stream
        sequence (`HDR_TASK_SEQ`), so the run id is the one the publisher can compute either way. Headers
        other than the server's own (a `traceparent`) go with it."""
        seq = _first_seq(msg.headers or {}) or msg.metadata.sequence.stream
        run_id = run_id_for(actor, task.task_id, stream_seq=seq)
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers[HDR_MSG_ID] = run_id
        if task.task_id is None:
            headers[HDR_TASK_SEQ] = str(seq)
        subject = (subtask_subject if is_subtask_subject(msg.subject) else task_subject)(actor)
        try:
            await self.js.publish(subject, ev.encode_command(task), headers=headers)
        except Exception as e:  # NATS trouble: the original comes back and is moved then
            log.warning("task of run %s: cannot move it to %s (%s); will retry", run_id, subject, e)
            await msg.nak(delay=OUTCOME_RETRY_S)
            return
        log.info("task of run %s moved from %s to %s (its instance's partition)", run_id, msg.subject,
                 subject)
        await ack_quietly(msg)

    async def _forward(self, cmd: ev.Cancel | ev.Approve | ev.Deny | ev.Answer, ix: RunIndex,
                       msg: Guarded) -> bool:
        """A command published on another subject than its run's task (say the bundle's, for a run of
        `bundle:instance`) lands in another partition: republish it where the run's host reads, under the
        operator who sent it (a host may publish on any operator's subject; see `runtime.nats.auth`)."""
        for agent in (ix.actor, split_actor(ix.actor)[0]):
            if partition_of(agent, self.total_partitions()) == ix.partition:
                await self.js.publish(command_subject(agent, cmd.by or ANONYMOUS), ev.encode_command(cmd))
                await ack_quietly(msg)
                log.info("%s for run %s forwarded to partition %d", cmd.__struct_config__.tag, cmd.run_id,
                         ix.partition)
                return True
        return False

    async def on_result(self, slot: Slot, raw: Msg) -> None:
        """A message of `slot`'s RESULTS consumer: a tool outcome for one run."""
        msg = Guarded(raw, self.serves, slot)
        try:
            outcome = ToolOutcome.decode(msg.data)
        except JobDecodeError as e:
            self.stats.rejected += 1
            log.error("rejected a message on %s: %s", msg.subject, e)
            await _term(msg)
            return
        self.stats.outcomes += 1
        driver = self.actors.drivers.get(outcome.run_id)
        if driver is not None:
            driver.deliver(Inbound(outcome, msg))
            return
        ix = await self.index.get(outcome.run_id)
        if ix is not None and ix.status in kernel.TERMINAL:
            await ack_quietly(msg)  # a late or duplicate outcome of a finished run
            return
        if ix is not None and ix.partition == slot[1] and outcome.run_id not in self.actors.waiting and \
                msg.metadata.num_delivered >= OUTCOME_FOLD_AFTER and await self._unparked(outcome, ix, msg):
            return
        if msg.metadata.num_delivered >= OUTCOME_MAX_DELIVERIES:
            log.error("outcome of %s for run %s that no host drives: dropped", outcome.call_id,
                      outcome.run_id)
            await _term(msg)
            return
        await msg.nak(delay=OUTCOME_RETRY_S)  # the run is starting or being resumed: try again soon


def _first_seq(headers: dict[str, str]) -> int | None:
    """The stream sequence a task without any id was first stored at, if a host moved it to its
    instance's subject (`Router._to_instance`); None otherwise (or for a header that is not a number)."""
    value = headers.get(HDR_TASK_SEQ, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


async def _term(msg: Any) -> None:
    try:
        await msg.term()
    except Exception as e:
        log.debug("term failed: %s", e)


__all__ = ["Router"]
