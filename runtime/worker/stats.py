"""What a worker tells about itself: its counters (`WorkerStats`) and its heartbeat in the `workers` bucket.

`WorkerStats` counts, per process, what became of the jobs: tests and benchmarks read it, `serve` returns it,
and `runtime.observe.metrics` exposes it to Prometheus at scrape time. A `Beat` puts a `WorkerBeat` (name,
concurrency, jobs held, counters, tools and their versions) in the `workers` KV bucket every `BEAT_S`,
living three times as long, which is how `sa status` lists the live workers and how a worker tells
whether another serves a tool version (`runtime.worker.handoff`); `remove_beat` takes it away when the
worker stops.
Both are best effort and off the job path: a worker whose heartbeat cannot be written still serves jobs,
and a beat it could not remove expires by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sized
from dataclasses import dataclass, field

import anyio
from nats.js import JetStreamContext

from runtime.nats.kv import fleet_kv, put_kv
from runtime.nats.records import WorkerBeat
from runtime.nats.subjects import WORKERS_BUCKET

log = logging.getLogger("runtime.worker")

BEAT_S = 5.0  # a `WorkerBeat` in the `workers` bucket this often (for `sa status`), living 3x as long


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
    handed_off: int = 0  # jobs left to another worker: this one lacks their tool version
    handed_in: int = 0  # deliveries another worker handed to this one (`runtime.worker.handoff`)


def beat_key(name: str) -> str:
    """The worker's key in the `workers` bucket (its name, with what a KV key cannot hold replaced)."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


@dataclass
class Beat:
    """A worker's `WorkerBeat`: what it serves (tool names and versions), what it holds and has done.

    `put` writes one (best effort); `run` writes one every `BEAT_S` until cancelled. A worker puts its
    first beat before it takes a job, so a worker handed a job it lacks the version of already sees every
    worker that is taking jobs (`runtime.worker.handoff`). `held` is the jobs the worker holds (running or
    buffered), counted at each beat."""

    js: JetStreamContext
    name: str
    concurrency: int
    tools: list[str]
    versions: list[tuple[str, str, str]]
    held: Sized
    stats: WorkerStats
    started: float = field(default_factory=time.time)
    _bucket: bool = field(default=False, init=False)  # the bucket is known to exist

    async def put(self) -> None:
        if not self._bucket:
            try:
                await fleet_kv(self.js, WORKERS_BUCKET)  # streams made by an older version lack it
                self._bucket = True
            except Exception as e:
                log.debug("workers bucket: %s", e)
        record = WorkerBeat(name=self.name, started=self.started, concurrency=self.concurrency,
                            running=len(self.held), completed=self.stats.completed, failed=self.stats.failed,
                            tools=self.tools, versions=self.versions)
        try:
            await put_kv(self.js, WORKERS_BUCKET, beat_key(self.name), record.encode(), ttl=3 * BEAT_S,
                         timeout=BEAT_S)
        except Exception as e:
            log.debug("worker heartbeat failed: %s", e)

    async def run(self) -> None:
        while True:
            await anyio.sleep(BEAT_S)
            await self.put()


async def remove_beat(js: JetStreamContext, name: str) -> None:
    """Take the worker's `WorkerBeat` away (a worker that stopped leaves `sa status` at once)."""
    try:
        await (await fleet_kv(js, WORKERS_BUCKET)).delete(beat_key(name))
    except Exception as e:  # it expires by itself
        log.debug("removing the worker heartbeat failed: %s", e)
