"""The ``runs`` index and the ``active`` bucket: where a run stands, without reading its log.

``runs`` holds one `RunIndex` per run (its actor, partition, status, last sequence, task id): `sa status`,
the inspector and a command for a run read it, and the host answers a late outcome or command of a run that
already ended from it. ``active`` holds one key per unfinished run, ``p<N>.<run>`` -> actor: a host taking a
partition over lists its keys only, not the whole index. An entry is written when a run starts (``running``)
when it starts or stops waiting for an approver (``waiting for approval``, `RunDriver.on_status`), when it
goes to sleep on a timer (``sleeping until <T>``: its driver let it go, and its ``active`` entry says when it
wakes, so a takeover leaves it in its log until then; its wake-up is in SCHEDULES, `runtime.host.sleep`), when
it is parked waiting for a person's answer (``waiting for an answer``, `runtime.driver.inputs`) and
when it ends (its status; its ``active`` key is then purged).

Index writes are retried until NATS answers (a leader election lasts a few seconds): an index that skipped
a write would hide a running run from its next owner.

Every write is a compare-and-set on the revision this host last wrote or read, never a blind put, because a
write can arrive late. A host connected to a NATS node that is cut off keeps writing into the dead TCP
connection until its pings fail; it then reconnects elsewhere and retries there. When the node's link comes
back, the kernel's retransmission still delivers the old bytes, the node (which never saw the connection
drop) applies them, and a blind put of ``running`` would land over the run's later ``completed``: seen in a
partition test, a completed run indexed as running for good. A late compare-and-set names a revision that
has moved on, so NATS refuses it. A conflict re-reads the entry and writes over it only if it is not newer
(`supersedes`: a run's ``last_seq`` never goes back, and an ended run never becomes unfinished again): a stale
owner's write (a host that lost the run but did not know yet) is dropped the same way, and a retry whose
first try did land finds its own entry and stops. ``active`` follows the ``runs`` decision: written (on its
own revision) only when the ``runs`` write was, purged unconditionally when the run ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from runtime import kernel
from runtime.nats.kv import fleet_kv, latest, put_kv, runs_kv
from runtime.nats.records import (
    WAITING_FOR_ANSWER,
    WAITING_FOR_APPROVAL,
    RunIndex,
    active_value,
    sleeping_status,
)
from runtime.nats.retry import retrying
from runtime.nats.subjects import ACTIVE_BUCKET, ACTIVE_PURGE_TTL_S, RUNS_BUCKET, active_key

log = logging.getLogger("runtime.host")

WRITE_RETRY_S = 0.25

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Standing:
    """What the index is told of a run: where it lives, how far its log goes, the state folded from it, and
    whether its driver let it go to sleep. The host makes one (`runtime.host.driver.standing`); a plain
    record, so the index depends on nothing else of the driver and a test can write one by hand."""

    run_id: str
    actor: str
    partition: int
    last_seq: int
    state: kernel.State
    bundle: str  # the path of the bundle the run is served from
    task_id: str | None = None
    forked: tuple[str, int] | None = None  # a fork's source run and seq
    parked: bool = False  # asleep on a timer or a question, and let go by its driver


class RunsIndex:
    """The host's handles on ``runs`` and ``active``; `open` them before anything else."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.runs: Any = None
        self.active: Any = None
        self._revisions: dict[tuple[str, str], int] = {}  # (bucket, key) -> the revision this host wrote

    def fresh(self, run_id: str, partition: int) -> None:
        """`run_id` was just created (its first event appended by this host): its entries do not exist yet,
        so the first writes are creates, with no read first."""
        self._revisions[(RUNS_BUCKET, run_id)] = 0
        self._revisions[(ACTIVE_BUCKET, active_key(partition, run_id))] = 0

    async def open(self) -> None:
        self.runs = await runs_kv(self.js)
        self.active = await fleet_kv(self.js, ACTIVE_BUCKET)

    async def record(self, run: Standing) -> None:
        """The `runs` entry of the run, and its `active` key: set while it runs, purged once it ended."""
        state = run.state
        status: str = state.status if state.status != "new" else "running"
        until = kernel.parked_until(state) if run.parked and status == "running" else None
        if status == "running" and kernel.pending_approvals(state):
            status = WAITING_FOR_APPROVAL
        elif until is not None:
            status = WAITING_FOR_ANSWER if kernel.pending_questions(state) else sleeping_status(until)
        written = await self.put(run.run_id, RunIndex(
            actor=run.actor, status=status, partition=run.partition, last_seq=run.last_seq,
            seq=state.seq - 1 if state.seq else None,
            updated=time.time(), task_id=run.task_id, bundle=run.bundle,
            forked_from=run.forked[0] if run.forked else None,
            forked_at=run.forked[1] if run.forked else None))
        key = active_key(run.partition, run.run_id)
        if status in kernel.TERMINAL:
            await _retrying(f"clearing the active entry of {run.run_id}",
                            lambda: self.active.purge(key, msg_ttl=ACTIVE_PURGE_TTL_S))
        elif written:
            value = active_value(run.actor, until)
            await _retrying(f"the active entry of {run.run_id}",
                            lambda: self._set(ACTIVE_BUCKET, key, value, keep=None))
        if status in kernel.TERMINAL or until is not None:  # over, or let go until it wakes: written no more
            self._revisions.pop((RUNS_BUCKET, run.run_id), None)  # here (its next owner reads them first)
            self._revisions.pop((ACTIVE_BUCKET, key), None)

    async def put(self, run_id: str, entry: RunIndex) -> bool:
        """Write `entry` unless the index holds a newer one for the run (`supersedes`); whether it wrote."""
        def keep(current: bytes) -> bool:
            return not supersedes(entry, RunIndex.decode(current))
        value = entry.encode()
        written = await _retrying(f"runs index update of {run_id}",
                                  lambda: self._set(RUNS_BUCKET, run_id, value, keep=keep))
        if entry.status in kernel.TERMINAL:
            self._revisions.pop((RUNS_BUCKET, run_id), None)
            self._revisions.pop((ACTIVE_BUCKET, active_key(entry.partition, run_id)), None)
        return written

    async def _set(self, bucket: str, key: str, value: bytes, *,
                   keep: Callable[[bytes], bool] | None) -> bool:
        """Compare-and-set `key` to `value` on the revision last seen; on a conflict, read the entry again and
        write over it unless `keep(current value)` says it is newer. Whether it wrote."""
        slot = (bucket, key)
        while True:
            revision = self._revisions.get(slot)
            if revision is None:
                revision, current = await latest(self.js, bucket, key)
                if current and keep is not None and keep(current):
                    return False  # not cached: a next write is checked against the entry again
            try:
                self._revisions[slot] = await put_kv(self.js, bucket, key, value, last=revision)
                return True
            except KeyWrongLastSequenceError:
                self._revisions.pop(slot, None)  # someone wrote since (or a retried write landed): read it

    async def get(self, run_id: str) -> RunIndex | None:
        try:
            entry = await self.runs.get(run_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        return RunIndex.decode(entry.value) if entry.value else None


def supersedes(new: RunIndex, current: RunIndex) -> bool:
    """Whether `new` may replace `current` in the index: it is at least as far along the run's log, and it
    does not turn an ended run back into an unfinished one."""
    if current.status in kernel.TERMINAL and new.status not in kernel.TERMINAL:
        return False
    return new.last_seq >= current.last_seq


async def _retrying(what: str, op: Callable[[], Awaitable[T]]) -> T:
    return await retrying(op, what=what, delay=WRITE_RETRY_S, logger=log)


__all__ = ["WAITING_FOR_ANSWER", "WAITING_FOR_APPROVAL", "RunsIndex", "Standing", "sleeping_status",
           "supersedes"]
