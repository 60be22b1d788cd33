"""A regression driven on the fleet: one job per recorded run, taken by the hosts, below production.

    driven = await drive_on_fleet(js, run_set, candidate, rules={"refund": "diverge"}, on_done=tick)
    if await fleet_serves(js): ...        # is any host taking regression jobs (`sa regress` decides with it)

Why on the fleet: a regression of a thousand runs driven from the one process that asked for it neither
scales out nor yields to production (on one machine it competes with the hosts for the same cores, and its
model calls skip the endpoint's fleet-wide queue). Driven by the hosts, the runs spread over every host, each
host gives them only its few regression slots (`HostConfig.regress_slots`), and their model calls wait for
the endpoint's permits at the lowest priority (`drive.REGRESSION_PRIORITY`), so a production call is always
served first and the regression keeps inside the endpoint's share.

The wire:

* the candidate is shipped once into the fleet's object store (`runtime.regress.shipped`);
* each run of the set is one `Job` on ``regress.jobs.<regression>`` in stream ``REGRESS`` (a work queue:
  a job taken and acked is gone), taken by the ``regressors`` consumer that every host serving regressions
  pulls from, one job per free slot;
* the host drives it with `drive.drive_source`, the same function an in-process regression calls for each
  run: the same ports (recorded results served, each tool's rule applied there, on the host, with the
  regression's scratch workspace), the same model reply cache (in the fleet's KV), the same marks on the
  run. Then it puts a `Done` (the new run's id, what the ports did, the cache's hits and misses) in the
  ``regress_runs`` bucket under ``<regression>.<index>``, and acks the job;
* the client watches those keys; for each it reads both runs from the log (the truth) and grades them here,
  as an in-process regression does (`report.report_of`). At the end it deletes its keys and purges any job
  of its regression still queued (an interrupted regression leaves nothing for the hosts to do).

A host that stops while driving a job leaves it unacked: another host takes it after the job's AckWait and
drives the run again as a new regression run (the unfinished one stays in the log, unindexed, like any run a
regression could not end). A job delivered `MAX_ATTEMPTS` times is answered as failed, so the client never
waits for ever on a run that takes its hosts down.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from runtime.log import RunLog
from runtime.nats.kv import fleet_kv
from runtime.regress.cache import ModelCache
from runtime.regress.candidate import Candidate, load_candidate
from runtime.regress.drive import Driven, drive_source
from runtime.regress.ports import Rule, Tally
from runtime.regress.recorded import Matcher, PymCompare
from runtime.regress.sets import RegressError, RunSet
from runtime.regress.shipped import ship, unpack

log = logging.getLogger("runtime.regress")

STREAM = "REGRESS"
SUBJECTS = "regress.jobs.>"
CONSUMER = "regressors"
DONE_BUCKET = "regress_runs"
JOB_ACK_WAIT_S = 30.0  # a host driving a job says so every third of this; a dead host's job waits this long
JOB_MAX_AGE_S = 86_400.0  # a job nobody took in a day (no host served regressions) is dropped
MAX_ATTEMPTS = 3
WAIT_LOG_S = 30.0  # a client waiting this long for its next answer says whether any host takes jobs


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded run to drive again on a shipped candidate, with the regression's options."""

    regression: str
    index: int
    run: str  # the source run
    agent: str
    set: str
    candidate: str  # the shipped candidate's name in the object store
    system_prompt: str | None = None
    base_url: str | None = None
    model: str | None = None
    rules: dict[str, str] = {}
    ignore: dict[str, list[str]] = {}
    match: dict[str, tuple[str, str]] = {}  # tool -> (the matcher's name, its .pym source)


class Done(msgspec.Struct, frozen=True, kw_only=True):
    """What a host did with a `Job`: the regression run it drove, or why it could not."""

    index: int
    run_id: str | None = None
    error: str | None = None
    tally: dict[str, Any] = {}
    hits: int = 0
    misses: int = 0
    host: str = ""
    actor: str | None = None  # the source run's actor, and so the regression run's (a narrower read)


def stream_config() -> StreamConfig:
    return StreamConfig(name=STREAM, subjects=[SUBJECTS], retention=RetentionPolicy.WORK_QUEUE,
                        storage=StorageType.FILE, max_age=JOB_MAX_AGE_S, duplicate_window=120.0,
                        description="regression jobs: one recorded run each, for the hosts' regression slots")


def consumer_config() -> ConsumerConfig:
    return ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=JOB_ACK_WAIT_S,
                          max_deliver=-1, max_ack_pending=100_000, filter_subject=SUBJECTS,
                          description="regression jobs, pulled by every host with a free regression slot")


async def ensure_jobs(js: JetStreamContext) -> None:
    """The jobs stream and its consumer (made by the first host or regression; the same config each time)."""
    try:
        await js.stream_info(STREAM)
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # made meanwhile by another process
            await js.add_stream(stream_config())
    try:
        await js.consumer_info(STREAM, CONSUMER)
    except NotFoundError:
        await js.add_consumer(STREAM, consumer_config())


async def fleet_serves(js: JetStreamContext) -> bool:
    """Whether any host takes regression jobs now: one is waiting for a job, or holds one."""
    try:
        info = await js.consumer_info(STREAM, CONSUMER)
    except NotFoundError:
        return False
    return bool(info.num_waiting or info.num_ack_pending)


def new_regression_key() -> str:
    return uuid.uuid4().hex[:16]


# -- the client's side ------------------------------------------------------------------------------------

async def drive_on_fleet(js: JetStreamContext, run_set: RunSet, candidate: Candidate, *,
                         shipped: str | None = None, rules: Mapping[str, Rule] | None = None,
                         ignore: Mapping[str, Sequence[str]] | None = None,
                         match: Mapping[str, str | Path] | None = None,
                         on_done: Callable[[Driven], Any] | None = None) -> list[Driven]:
    """Have the fleet's hosts drive every run of `run_set` on `candidate` (see the module docstring); the
    results in the set's order, as `drive.drive_all` returns them. `shipped`: the candidate's name in the
    object store, if `shipped.ship` stored it already."""
    name = shipped or await ship(js, candidate.bundle)
    await ensure_jobs(js)
    key = new_regression_key()
    done_kv = await fleet_kv(js, DONE_BUCKET)
    overrides = candidate.overrides
    matchers = {tool: (Path(path).stem, Path(path).read_text(encoding="utf-8"))
                for tool, path in (match or {}).items()}
    watcher = await done_kv.watch(f"{key}.*")
    runs = RunLog(js)
    results: dict[int, Driven] = {}
    try:
        for index, run in enumerate(run_set.runs):
            job = Job(regression=key, index=index, run=run, agent=run_set.agent, set=run_set.name,
                      candidate=name, system_prompt=overrides.get("system_prompt"),
                      base_url=overrides.get("base_url"), model=overrides.get("model"),
                      rules={t: str(r) for t, r in (rules or {}).items()},
                      ignore={t: list(k) for t, k in (ignore or {}).items()}, match=matchers)
            await js.publish(f"regress.jobs.{key}", msgspec.json.encode(job),
                             headers={"Nats-Msg-Id": f"{key}.{index}"})
        while len(results) < len(run_set.runs):
            try:
                entry = await watcher.updates(timeout=WAIT_LOG_S)
            except nats.errors.TimeoutError:
                if not await fleet_serves(js):
                    log.warning("regression %s: %d run(s) of %d driven, and no host takes regression jobs "
                                "now: waiting for one (`sa host`)", key, len(results), len(run_set.runs))
                continue
            if entry is None or not entry.value:
                continue
            done = msgspec.json.decode(entry.value, type=Done)
            if done.index in results:
                continue
            driven = await _read_back(runs, run_set.runs[done.index], done)
            results[done.index] = driven
            if on_done is not None:
                on_done(driven)
    finally:
        with anyio.CancelScope(shield=True):
            await _clean(js, key)
            with contextlib.suppress(Exception):
                await watcher.stop()
    return [results[i] for i in range(len(run_set.runs))]


async def _read_back(runs: RunLog, source_run: str, done: Done) -> Driven:
    """A host's `Done` as the `Driven` an in-process run gives: both runs read from the log."""
    source = await runs.read(source_run, done.actor)
    out = Driven(source, run_id=done.run_id, error=done.error, hits=done.hits, misses=done.misses,
                 host=done.host, tally=msgspec.convert(done.tally, Tally) if done.tally else Tally())
    if done.run_id is not None:
        out.events = list((await runs.read(done.run_id, done.actor)).events)
    return out


async def _clean(js: JetStreamContext, key: str) -> None:
    """Nothing of regression `key` left for a host: its queued jobs purged, its answers deleted."""
    try:
        await js.purge_stream(STREAM, subject=f"regress.jobs.{key}")
    except Exception as e:  # the connection is gone: the jobs are driven and their answers expire
        log.warning("regression %s: its queued jobs could not be purged: %s", key, e)
    with contextlib.suppress(Exception):
        await js.purge_stream(f"KV_{DONE_BUCKET}", subject=f"$KV.{DONE_BUCKET}.{key}.*")


# -- a host's side ----------------------------------------------------------------------------------------

class Candidates:
    """The candidates one host has unpacked and loaded, by shipped name and overrides (a thousand jobs of
    one regression load their candidate once); `prepare` sees each as it is loaded (the host gives its
    model client the endpoint's fleet-wide gate)."""

    KEEP = 8  # candidates kept loaded; the least recently used beyond that is closed

    def __init__(self, js: JetStreamContext, folder: Path, *, model_url: str | None = None,
                 prepare: Callable[[Candidate], Any] | None = None) -> None:
        self.js, self.folder, self.model_url, self.prepare = js, folder, model_url, prepare
        self.cache = ModelCache(js)
        self._loaded: dict[tuple[Any, ...], Candidate] = {}
        self._lock = anyio.Lock()

    async def get(self, job: Job) -> Candidate:
        key = (job.candidate, job.agent, job.system_prompt, job.base_url, job.model)
        async with self._lock:
            if key not in self._loaded:
                where = self.folder / job.candidate
                yaml = (where / json.loads((where / ".sa-candidate.json").read_text())["bundle"]
                        if where.exists() else await unpack(self.js, job.candidate, where))
                candidate = await load_candidate(yaml, job.agent, self.cache, system_prompt=job.system_prompt,
                                                 base_url=job.base_url, model=job.model,
                                                 model_url=self.model_url)
                if self.prepare is not None:
                    self.prepare(candidate)
                self._loaded[key] = candidate
                while len(self._loaded) > self.KEEP:
                    oldest = next(iter(self._loaded))
                    with contextlib.suppress(Exception):
                        await self._loaded.pop(oldest).aclose()
            self._loaded[key] = self._loaded.pop(key)  # the most recently used last
            return self._loaded[key]

    def matcher(self, job: Job) -> Matcher:
        compares = {}
        for tool, (name, source) in job.match.items():
            path = self.folder / "matchers" / hashlib.sha256(source.encode()).hexdigest()[:16] / f"{name}.pym"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source, encoding="utf-8")
            compares[tool] = PymCompare.load(path)
        return Matcher({tool: frozenset(keys) for tool, keys in job.ignore.items()}, compares)

    async def aclose(self) -> None:
        for candidate in self._loaded.values():
            with contextlib.suppress(Exception):
                await candidate.aclose()
        self._loaded.clear()


async def serve_job(js: JetStreamContext, job: Job, candidates: Candidates, *, host: str = "") -> Done:
    """Drive `job`'s run (`drive.drive_source`) and say what came of it; never raises for a bad job."""
    try:
        candidate = await candidates.get(job)
        rules = {tool: Rule(rule) for tool, rule in job.rules.items()}
        matcher = candidates.matcher(job)
    except (RegressError, OSError, ValueError, KeyError) as e:
        return Done(index=job.index, error=f"the host could not load the candidate: {e}", host=host)
    driven = await drive_source(RunLog(js), job.run, candidate, set_name=job.set, rules=rules,
                                matcher=matcher)
    return Done(index=job.index, run_id=driven.run_id, error=driven.error, hits=driven.hits,
                misses=driven.misses, tally=msgspec.to_builtins(driven.tally), host=host,
                actor=driven.source.actor or None)


async def answer(js: JetStreamContext, job: Job, done: Done) -> None:
    """Put `done` where the regression's client watches for it."""
    await (await fleet_kv(js, DONE_BUCKET)).put(f"{job.regression}.{job.index}", msgspec.json.encode(done))


__all__ = ["CONSUMER", "DONE_BUCKET", "MAX_ATTEMPTS", "STREAM", "Candidates", "Done", "Job", "answer",
           "drive_on_fleet", "ensure_jobs", "fleet_serves", "serve_job"]
