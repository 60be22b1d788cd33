"""Driving recorded runs again on a candidate: each from its recorded task, as a real run in the log.

    driven = await drive_all(js, run_set, candidate, rules={"refund": Rule.DIVERGE}, concurrency=4)

Each source run's task (its `run.started`: input, instance, deadline, metadata) starts a new run on the
candidate, driven by the one run driver (`runtime.driver.run.RunDriver`) in this process over the JetStream
run log, through `RegressPorts` (recorded results served, nothing reaching the world). So a regression run
is a run like any other for everything that reads the log: `sa replay`, `sa replay A --diff B`, `sa fork`,
`sa runs purge`. What makes it not production: its `run.started` carries `regression` (`RegressionOf`: the
source run, the set, the candidate), it has no task id (no task of anyone's is deduplicated against it), it
is not written to the runs index (so `sa runs`, schedules and takeovers never see it) nor to the `active`
bucket (no host resumes it), its model calls are charged to no budget, and they wait at the endpoint's
fleet-wide share at `REGRESSION_PRIORITY`, the lowest (behind every production run's calls; `run.started`
keeps the source's own priority, so the two logs compare equal). A source run in a thread is driven
again from the same recorded conversation (its `run.started` names the same previous run), but the regression
run is not a run of the thread: the thread's next run still continues the thread's own latest run.

A run the driver cannot finish (its source has no events, a candidate whose tool is missing, the log refusing
a write) is reported as failed with the reason, and ended in the log (`run.failed`, `regression_failed`) when
it was started; the others go on. At most `concurrency` runs are driven at
once, in the order of the set.

Where: `drive_all` drives them here, in this process; `runtime.regress.fleet` has the fleet's hosts drive
them. Both call `drive_source` for each run, so what a run does in a regression does not depend on where.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.driver.local import LocalModel
from runtime.driver.run import RunDriver
from runtime.log import RunHistory, RunLog
from runtime.log.threads import conversation_for
from runtime.regress.cache import regression_run
from runtime.regress.candidate import Candidate
from runtime.regress.ports import RegressPorts, Rule, Tally, scratch_workspace
from runtime.regress.recorded import Matcher, Recorded
from runtime.regress.sets import RunSet

log = logging.getLogger("runtime.regress")


@dataclass
class Driven:
    """One source run driven again: its log, the new run's id and events, what the ports did; or why not."""

    source: RunHistory
    run_id: str | None = None
    events: list[ev.Event] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    error: str | None = None
    hits: int = 0  # its model requests answered from the cache
    misses: int = 0  # ... and asked of the model
    host: str = ""  # the host that drove it ("" : this process)


REGRESSION_PRIORITY = ev.MIN_PRIORITY  # a regression's model calls wait behind every production call


def new_regression_id() -> str:
    return "g" + uuid.uuid4().hex[:16]


def _static_files(candidate: Candidate) -> dict[str, str | bytes]:
    spec = candidate.bundle.data_provider
    if spec.kind != "static":
        return {}
    from runtime.tools.data import StaticDataProvider

    return dict(StaticDataProvider(spec.files, folder=spec.folder).files)


async def drive_one(runs: RunLog, source: RunHistory, candidate: Candidate, *, set_name: str = "",
                    rules: Mapping[str, Rule] | None = None, matcher: Matcher | None = None,
                    clock: Callable[[], float] = time.time) -> Driven:
    """Drive `source`'s task again on `candidate`, as a new run to `runs`."""
    out = Driven(source)
    first = source.events[0] if source.events else None
    if not isinstance(first, ev.RunStarted):
        out.error = f"run {source.run_id} has no run.started to take its task from"
        return out
    run_id = out.run_id = new_regression_id()
    config = candidate.bundle.kernel_config()
    started = ev.RunStarted(
        run_id=run_id, input=first.input, instance=first.instance, timeout_s=first.timeout_s,
        metadata=dict(first.metadata), bundle_digest=candidate.bundle.digest, priority=first.priority,
        previous_run=first.previous_run, previous_seq=first.previous_seq, summary=first.summary,
        summarised=first.summarised,
        regression=ev.RegressionOf(source_run=source.run_id, set=set_name, candidate=candidate.id))
    recorded = Recorded(source.events, matcher or Matcher())
    driver: RunDriver[LocalModel] | None = None
    try:
        # a run in a thread goes on from the same recorded conversation as its source (by reference)
        conversation = await conversation_for(runs, config, source.events)
        with regression_run(run_id):
            async with anyio.create_task_group() as group:
                ports = RegressPorts(group, dict(candidate.bundle.tools), recorded, rules,
                                     data=scratch_workspace(_static_files(candidate)), clock=clock,
                                     source_run=source.run_id)
                out.tally = ports.tally
                driver = RunDriver(
                    runs, LocalModel(candidate.step, candidate.client), ports, source.actor or first.actor,
                    run_id, state=kernel.initial(config, conversation), last_seq=0,
                    on_event=out.events.append, clock=clock)
                driver.priority = REGRESSION_PRIORITY
                await driver.append(started)
                await driver.run()
                group.cancel_scope.cancel()  # a script the deadline outran
    except Exception as e:  # this run could not be driven to its end; the others go on
        log.warning("regression of run %s failed: %s", source.run_id, e, exc_info=True)
        out.error = f"{type(e).__name__}: {e}"
        if driver is not None and driver.state.status != "new" and not driver.state.done:
            await _ended_anyway(driver, out.error)
    out.hits, out.misses = candidate.client.counted(run_id)
    return out


async def drive_source(runs: RunLog, run: str, candidate: Candidate, *, set_name: str = "",
                       rules: Mapping[str, Rule] | None = None, matcher: Matcher | None = None) -> Driven:
    """Drive recorded run `run` again on `candidate` (`drive_one`), or say why not (no events for it): what
    one run of a regression is, in this process or on a host of the fleet."""
    source = await runs.read(run)
    if not source.events:
        return Driven(source, error=f"no run {run!r}: the log has no events for it (purged?)")
    return await drive_one(runs, source, candidate, set_name=set_name, rules=rules, matcher=matcher)


async def _ended_anyway(driver: RunDriver[LocalModel], why: str) -> None:
    """Leave no regression run without an ending in the log: `run.failed` saying why it stopped, if the log
    takes it (a log that refused the run's writes may refuse this one too)."""
    try:
        with anyio.CancelScope(shield=True):
            await driver.end("regression_failed", f"the regression could not drive this run on: {why}")
    except Exception as e:
        log.warning("run %s: its ending could not be recorded either: %s", driver.run_id, e)


async def drive_all(js: JetStreamContext, run_set: RunSet, candidate: Candidate, *,
                    rules: Mapping[str, Rule] | None = None, matcher: Matcher | None = None,
                    concurrency: int = 4, on_done: Callable[[Driven], Any] | None = None) -> list[Driven]:
    """Drive every run of `run_set` on `candidate`, at most `concurrency` at once; the results in the set's
    order. `on_done` hears of each as it finishes (a progress bar)."""
    runs = RunLog(js)
    limit = anyio.CapacityLimiter(max(1, concurrency))
    results: dict[str, Driven] = {}

    async def one(run: str) -> None:
        async with limit:
            done = await drive_source(runs, run, candidate, set_name=run_set.name, rules=rules,
                                      matcher=matcher)
            results[run] = done
            if on_done is not None:
                on_done(done)

    async with anyio.create_task_group() as tg:
        for run in run_set.runs:
            tg.start_soon(one, run)
    return [results[run] for run in run_set.runs]


__all__ = ["REGRESSION_PRIORITY", "Driven", "drive_all", "drive_one", "drive_source", "new_regression_id"]
