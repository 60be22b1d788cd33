"""The ``runs`` index and the ``active`` bucket: where a run stands, without reading its log.

``runs`` holds one `RunIndex` per run (its actor, partition, status, last sequence, task id): `sa status`,
the inspector and a command for a run read it, and the host answers a late outcome or command of a run that
already ended from it. ``active`` holds one key per unfinished run, ``p<N>.<run>`` -> actor: a host taking a
partition over lists its keys only, not the whole index. An entry is written when a run starts (``running``)
when it starts or stops waiting for an approver (``waiting for approval``, `RunDriver.on_status`), when it
goes to sleep on a timer (``sleeping until <T>``: its driver let it go, and its ``active`` entry says when it
wakes, so a takeover leaves it in its log until then; its wake-up is in SCHEDULES, `runtime.host.sleep`), when
it is parked waiting for a person's answer (``waiting for an answer``, `runtime.host.answers`) and
when it ends (its status; its ``active`` key is then purged).

Index writes are retried until NATS answers (a leader election lasts a few seconds): an index that skipped
a write would hide a running run from its next owner.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from runtime import kernel
from runtime.host.driver import RunDriver
from runtime.nats.kv import fleet_kv, runs_kv
from runtime.nats.records import (
    WAITING_FOR_ANSWER,
    WAITING_FOR_APPROVAL,
    RunIndex,
    active_value,
    sleeping_status,
)
from runtime.nats.retry import retrying
from runtime.nats.subjects import ACTIVE_BUCKET, ACTIVE_PURGE_TTL_S, active_key

log = logging.getLogger("runtime.host")

WRITE_RETRY_S = 0.25


class RunsIndex:
    """The host's handles on ``runs`` and ``active``; `open` them before anything else."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.runs: Any = None
        self.active: Any = None

    async def open(self) -> None:
        self.runs = await runs_kv(self.js)
        self.active = await fleet_kv(self.js, ACTIVE_BUCKET)

    async def record(self, driver: RunDriver) -> None:
        """The `runs` entry of the run, and its `active` key: set while it runs, purged once it ended."""
        state = driver.state
        status: str = state.status if state.status != "new" else "running"
        if status == "running" and kernel.pending_approvals(state):
            status = WAITING_FOR_APPROVAL
        until = kernel.parked_until(state) if driver.parked and status == "running" else None
        if until is not None:
            status = WAITING_FOR_ANSWER if kernel.pending_questions(state) else sleeping_status(until)
        await self.put(driver.run_id, RunIndex(
            actor=driver.actor, status=status, partition=driver.partition, last_seq=driver.last_seq,
            updated=time.time(), task_id=driver.task_id, bundle=str(driver.agent.bundle.path),
            forked_from=driver.forked[0] if driver.forked else None,
            forked_at=driver.forked[1] if driver.forked else None))
        key = active_key(driver.partition, driver.run_id)
        if status in kernel.TERMINAL:
            await _retrying(f"clearing the active entry of {driver.run_id}",
                            lambda: self.active.purge(key, msg_ttl=ACTIVE_PURGE_TTL_S))
        else:
            await _retrying(f"the active entry of {driver.run_id}",
                            lambda: self.active.put(key, active_value(driver.actor, until)))

    async def put(self, run_id: str, entry: RunIndex) -> None:
        await _retrying(f"runs index update of {run_id}", lambda: self.runs.put(run_id, entry.encode()))

    async def get(self, run_id: str) -> RunIndex | None:
        try:
            entry = await self.runs.get(run_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        return RunIndex.decode(entry.value) if entry.value else None


async def _retrying(what: str, op: Any) -> None:
    await retrying(op, what=what, delay=WRITE_RETRY_S, logger=log)


__all__ = ["WAITING_FOR_ANSWER", "WAITING_FOR_APPROVAL", "RunsIndex", "sleeping_status"]
