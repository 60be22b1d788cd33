"""A job for a tool version this worker does not have: leave it to a worker that has it, or fail it naming
the version that is missing.

A job names the exact version of its tool (`ToolJob.tool_digest` and its actor's bundle: a `ToolVersion`,
`runtime.worker.registry`), and a worker never runs another version in its place. But every worker binds
the one ``workers`` consumer on TOOLS, whose jobs are published to ``tools.<tool>``: a job for bundle A's
`add` may be delivered to a worker that serves only bundle B's `add`, or no `add` at all. That worker
decides here, by what the live workers advertise in their `WorkerBeat`s (the versions each serves, in the
``workers`` bucket, read only when a job needs it and then at most once per `FLEET_READ_S`):

1. no other live worker serves the version: the job fails now, an `input` error value the run's model
   reads: "tool add version 1a2b3c4d5e6f7a8b (bundle A) is not served by any worker: start a worker with
   that bundle" (plus the versions this worker does have, which is how a stale bundle copy shows);
2. another does (or the bucket cannot be read): the job is handed off, `HandOff`: the worker naks it with a
   short delay that grows with each delivery (`handoff_delay`) and records why, so the next delivery
   explains it (`runtime.worker.attempts`), and another worker may take it. Which worker gets the next
   delivery is the server's choice: a batch pull request still open on the worker that gave it back can
   take it again;
3. another does, but this is the job's last delivery (MaxDeliver): the job fails, naming the version and
   the workers that serve it (they did not take it in time: busy or cut off).

A hand-off uses up a delivery, so a job whose every earlier delivery was a hand-off is not taken for a
poison job at its last one: a worker that has the version runs it (`runtime.worker.loop`).

Why not route by version instead. Publishing to ``tools.<tool>.<digest>`` would only help with a consumer
per version: TOOLS is a WorkQueue stream, whose consumers may not overlap, so no consumer could take the
jobs of exactly the versions one worker serves. A consumer per version means a pull subscription per tool
version in every worker, AckWait, MaxDeliver advisories and queue depths per consumer, new permissions, and
a job whose version no worker serves would wait in the stream with no worker to tell its run. The hand-off
keeps the subjects, the one consumer and its fault handling as they are, costs nothing when every worker
serves every version, and the worker that lacks a version is the one that says which version is missing.
Its cost: with workers that serve different bundles, a job may take a hand-off (a round trip and
`handoff_delay(1)`) before it reaches a worker that has it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import anyio
from nats.js import JetStreamContext

from runtime.jobs import ToolJob
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import WorkerBeat
from runtime.nats.subjects import WORKERS_BUCKET
from runtime.types import ToolResult
from runtime.worker.registry import ToolRegistry, ToolVersion

log = logging.getLogger("runtime.worker")

FLEET_READ_S = 1.0  # how long a worker trusts what it read of the other workers' beats


def handoff_delay(attempt: int) -> float:
    """How long a handed-off job waits before its next delivery: 0.5, 2, 8, 10 s, so an idle worker that
    lacks the version cannot use the job's deliveries up while the one that has it is busy."""
    return min(10.0, 0.5 * 4.0 ** (attempt - 1))


@dataclass(frozen=True)
class HandOff:
    """Leave the job to another worker: nak it after recording `reason` (it names the version and who
    serves it); its next delivery comes `delay` seconds later."""

    delay: float
    reason: str


class Fleet:
    """What the other live workers serve, from their `WorkerBeat`s (a beat lives `3 x BEAT_S`; a worker that
    stops removes its own)."""

    def __init__(self, js: JetStreamContext, worker: str) -> None:
        self.js, self.worker = js, worker
        self._served: dict[str, list[ToolVersion]] = {}  # worker name -> the versions it serves
        self._read_at = -math.inf
        self._lock = anyio.Lock()

    async def serving(self, wanted: ToolVersion) -> list[str] | None:
        """The other live workers that serve `wanted`, by name; None if the beats cannot be read."""
        try:
            served = await self._read()
        except Exception as e:
            log.warning("worker %s: cannot read which workers serve %s: %s", self.worker,
                        wanted.describe(), e)
            return None
        return sorted(name for name, versions in served.items()
                      if name != self.worker and any(v.serves(wanted) for v in versions))

    async def _read(self) -> dict[str, list[ToolVersion]]:
        async with self._lock:  # many jobs handed over at once read the bucket once
            if time.monotonic() - self._read_at >= FLEET_READ_S:
                entries = await kv_entries(await fleet_kv(self.js, WORKERS_BUCKET))
                beats = [WorkerBeat.decode(e.value) for e in entries.values() if e.value]
                self._served = {b.name: [ToolVersion(*v) for v in b.versions]
                                or [ToolVersion(t) for t in b.tools] for b in beats}  # older: by name
                self._read_at = time.monotonic()
            return self._served


async def decide(fleet: Fleet, registry: ToolRegistry, job: ToolJob, *, attempt: int, max_deliver: int,
                 worker: str) -> HandOff | ToolResult:
    """What becomes of a job whose tool version this worker lacks (see the module docstring)."""
    wanted = ToolVersion.wanted_by(job)
    what = wanted.describe()
    others = await fleet.serving(wanted)
    if others == []:
        return ToolResult.failure("input", _not_served(wanted, registry, worker),
                                  detail="missing_version" if wanted.digest else "unknown_tool")
    serving = f"worker(s) {', '.join(others)} serve it" if others else "other workers may serve it"
    if 0 < max_deliver <= attempt:
        return ToolResult.failure(
            "input", f"{what} was delivered {attempt} times, each time to a worker without it: {serving} "
                     "but did not take it in time (busy, or cut off from NATS?); start more workers with "
                     "that bundle", detail="missing_version" if wanted.digest else "unknown_tool")
    return HandOff(handoff_delay(attempt), f"it lacks {what}; {serving}")


def _not_served(wanted: ToolVersion, registry: ToolRegistry, worker: str) -> str:
    """The error for a version no live worker serves, with the versions of that tool this worker has."""
    here = [s.version for s in registry.served() if s.tool.name == wanted.name]
    if not wanted.digest:  # a job naming no version: no tool of that name anywhere
        known = ", ".join(sorted(registry.tools)) or "none"
        return (f"no tool named {wanted.name!r} is loaded on worker {worker} (it has: {known}), nor on any "
                "other live worker")
    text = f"{wanted.describe()} is not served by any worker: start a worker with that bundle"
    if here:
        text += f" (worker {worker} has {'; '.join(v.describe() for v in here)})"
    return text
