"""A host's regression slots: runs of other processes' regressions, a few at a time, below production.

    tg.start_soon(RegressionChild(host, endpoints.gates).run)   # in `Host.run`: the child, while it serves

`runtime.regress.fleet` says what a regression job is and how its client waits for the answers; this is the
host's half. Each host with `HostConfig.regress_slots` (0: none) starts one child process,
``python -m runtime.host.regressions``, that drives at most that many regression runs at once, whatever the
size of the regression, and stops with the host.

Why a child process, and why niced (`HostConfig.regress_nice`): a regression run costs a host what a
production run costs (appends, model calls, the sandbox for a script with no recorded result), and in the
host's own event loop it would queue beside every production turn, which no priority can reorder. In a
process of its own at a lower CPU priority, the operating system runs the host's production runs first
whenever both want the CPU, and the regression takes what is left. `bench/regress.py --fleet` measures it.

In the child, `RegressionSlots` keeps one pull out on the ``regressors`` consumer while it has a free slot;
a job taken is driven by `runtime.regress.fleet.serve_job` (the same per-run function an in-process
regression calls), its message kept alive while it runs, then answered and acked.

The candidate's model calls wait for the host's endpoint permits (`runtime.host.endpoint`, the fleet-wide
share: the child opens the same permits, with the host's limit, for each endpoint the host's bundles
limit), at the regression's priority, the lowest: a production call waiting for a permit is always given it
first, and a regression never takes more than the endpoint's share. A candidate pointed at an endpoint no
bundle of the host limits keeps the gate its own `endpoint:` section gives it in one process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runtime.host.endpoint import FleetGate, client_key
from runtime.model.limits import Gate
from runtime.nats.retry import retrying

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from runtime.host.config import HostConfig
    from runtime.host.served import AgentRuntime

log = logging.getLogger("runtime.host")

FETCH_S = 5.0  # a slot's pull lives this long before it is sent again
RETRY_S = 1.0
RESTART_S = 5.0
GIVE_UP_S = 60.0  # a host that cannot make or use the jobs' stream for this long serves no regressions


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

        try:
            await retrying(lambda: ensure_jobs(self.js), what="creating the regression jobs' stream",
                           delay=RETRY_S, give_up=GIVE_UP_S, logger=log)
            sub = await self.js.pull_subscribe_bind(CONSUMER, STREAM)
        except Exception as e:  # a role that may not (a secured fleet's host user): production goes on
            log.error("host %s takes no regression jobs: the %s stream cannot be used (%s)", self.host_id,
                      STREAM, e)
            return
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


class RegressionChild:
    """The host's side: its regression slots' child process, started with the host, stopped with it (and
    started again if it dies)."""

    def __init__(self, config: HostConfig, host_id: str, nc: NATS, agents: Mapping[str, AgentRuntime],
                 gates: Mapping[str, Gate]) -> None:
        self.config, self.host_id, self.nc, self.agents, self.gates = config, host_id, nc, agents, gates

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "runtime.host.regressions", "--slots", str(self.config.regress_slots),
                "--nice", str(self.config.regress_nice), "--host", self.host_id]
        argv += [f"--server={s.geturl()}" for s in getattr(self.nc, "servers", None) or []]
        for key, gate in self.gates.items():
            if isinstance(gate, FleetGate):
                argv += [f"--gate={key}={gate.limit}={gate.lease_s}={gate.replicas}"]
        model_url = next((a.client.base_url for a in self.agents.values()
                          if a.bundle.spec.model.base_url == "local"), None)
        return argv + ([f"--model-url={model_url}"] if model_url else [])

    async def run(self) -> None:
        if self.config.regress_slots <= 0:
            return
        while True:
            # its stdin is a pipe from this process: when the host dies (even by SIGKILL), the child reads
            # its end and stops, so no orphan goes on taking jobs
            process = await anyio.open_process(self.argv(), stdin=subprocess.PIPE, stdout=None, stderr=None)
            try:
                code = await process.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    if process.returncode is None:
                        process.terminate()
                        with anyio.move_on_after(10):
                            await process.wait()
                        if process.returncode is None:
                            process.kill()
                            await process.wait()
            log.error("host %s: its regression slots' process ended (exit %s); started again", self.host_id,
                      code)
            await anyio.sleep(RESTART_S)


async def _child(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.host.regressions",
                                     description="A host's regression slots (started by the host).")
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--host", default="")
    parser.add_argument("--server", action="append", default=None)
    parser.add_argument("--gate", action="append", default=[], help="KEY=LIMIT=LEASE_S=REPLICAS")
    parser.add_argument("--model-url", default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the host too: it ends this with SIGTERM
    if args.nice:
        os.nice(args.nice)
    from runtime.nats.connection import close, connect
    from runtime.nats.jetstream import jetstream_for

    nc = await connect(args.server, name=f"sa-regress-{args.host}")
    try:
        gates: dict[str, FleetGate] = {}
        for spec in args.gate:
            key, limit, lease_s, replicas = spec.split("=")
            gate = FleetGate(nc, key, int(limit), lease_s=float(lease_s), replicas=int(replicas))
            await gate.open()
            gates[key] = gate
        slots = RegressionSlots(jetstream_for(nc), gates, slots=args.slots, host_id=args.host,
                                model_url=args.model_url)
        async with anyio.create_task_group() as tg:
            for gate in gates.values():
                tg.start_soon(gate.run)
            tg.start_soon(slots.run)

            async def orphaned() -> None:  # the host's end of stdin closed: the host is gone
                await anyio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
                tg.cancel_scope.cancel()

            tg.start_soon(orphaned)
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            tg.cancel_scope.cancel()
    finally:
        await close(nc)


__all__ = ["RegressionChild", "RegressionSlots"]

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    anyio.run(_child, sys.argv[1:], backend="asyncio")
