"""A host's regression slots: runs of a regression driven here, a few at a time, below production.

    slots = RegressionSlots(js, endpoints.gates, slots=2, host_id=host.id, model_url=url)
    await slots.run()                                   # until cancelled, beside the host's own runs

`runtime.regress.fleet` says what a regression job is and how its client waits for the answers; this is the
host's half. Each free slot keeps one pull out on the ``regressors`` consumer; a job taken is driven by
`runtime.regress.fleet.serve_job` (the same per-run function an in-process regression calls), with the
job's message kept alive while it runs, then answered and acked. So a host gives a regression at most
`HostConfig.regress_slots` runs at once (0: none, the host takes no regression jobs), whatever the size of
the regression: its production runs keep the rest of the host.

The candidate's model calls go through this host's gate for the same endpoint when its bundles limit it
(`runtime.host.endpoint`: the fleet-wide permits), at the regression's priority, the lowest: a production
call waiting for a permit is always given it first, and a regression never takes more than the endpoint's
share. A candidate pointed at an endpoint no bundle of this host limits keeps the gate its own `endpoint:`
section gives it in one process.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime.host.endpoint import client_key
from runtime.model.limits import Gate
from runtime.nats.retry import retrying

log = logging.getLogger("runtime.host")

FETCH_S = 5.0  # a slot's pull lives this long before it is sent again
RETRY_S = 1.0


class RegressionSlots:
    """See the module docstring."""

    def __init__(self, js: JetStreamContext, gates: Mapping[str, Gate], *, slots: int, host_id: str = "",
                 model_url: str | None = None) -> None:
        self.js, self.gates, self.slots, self.host_id, self.model_url = js, gates, slots, host_id, model_url
        self.driven = 0  # jobs answered here (tests, logs)

    def _gate(self, candidate: Any) -> None:
        gate = self.gates.get(client_key(candidate.client))
        if gate is not None:
            candidate.client.limiter = gate

    async def run(self) -> None:
        if self.slots <= 0:
            return
        from runtime.regress.fleet import CONSUMER, STREAM, Candidates, ensure_jobs

        await retrying(lambda: ensure_jobs(self.js), what="creating the regression jobs' stream",
                       delay=RETRY_S, logger=log)
        sub = await self.js.pull_subscribe_bind(CONSUMER, STREAM)
        free = anyio.Semaphore(self.slots)
        with tempfile.TemporaryDirectory(prefix="sa-regress-") as tmp:
            candidates = Candidates(self.js, Path(tmp), model_url=self.model_url, prepare=self._gate)
            try:
                async with anyio.create_task_group() as tg:
                    while True:
                        await free.acquire()
                        try:
                            msgs = await sub.fetch(1, timeout=FETCH_S)
                        except nats.errors.TimeoutError:
                            free.release()
                            continue
                        except Exception as e:  # NATS away, the stream deleted: made again, pulled again
                            free.release()
                            log.warning("regression jobs: %s; pulling again", e)
                            await anyio.sleep(RETRY_S)
                            await retrying(lambda: ensure_jobs(self.js), what="creating the regression "
                                           "jobs' stream", delay=RETRY_S, logger=log)
                            continue
                        tg.start_soon(self._one, msgs[0], candidates, free)
            finally:
                with anyio.CancelScope(shield=True):
                    await candidates.aclose()

    async def _one(self, msg: Msg, candidates: Any, free: anyio.Semaphore) -> None:
        from runtime.regress.fleet import JOB_ACK_WAIT_S, MAX_ATTEMPTS, Done, Job, answer, serve_job

        try:
            try:
                job = msgspec.json.decode(msg.data, type=Job)
            except msgspec.DecodeError as e:
                log.error("a regression job that is not one, dropped: %s", e)
                await msg.term()
                return
            attempt = msg.metadata.num_delivered if msg.metadata is not None else 1
            if attempt > MAX_ATTEMPTS:
                done = Done(index=job.index, host=self.host_id, error=(
                    f"taken {attempt - 1} times by hosts that stopped before driving it to its end"))
            else:
                async with anyio.create_task_group() as alive:
                    alive.start_soon(_keep_alive, msg, JOB_ACK_WAIT_S / 3)
                    done = await serve_job(self.js, job, candidates, host=self.host_id)
                    alive.cancel_scope.cancel()
            await answer(self.js, job, done)
            await msg.ack()
            self.driven += 1
        except Exception as e:  # NATS away: the job comes back after its AckWait, to this host or another
            log.warning("a regression job could not be answered (%s): it will be taken again", e)
        finally:
            free.release()


async def _keep_alive(msg: Msg, every: float) -> None:
    while True:
        await anyio.sleep(every)
        try:
            await msg.in_progress()
        except Exception as e:  # its AckWait will tell
            log.warning("a regression job could not be kept: %s", e)


__all__ = ["RegressionSlots"]
