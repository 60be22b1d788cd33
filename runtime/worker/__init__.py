"""The tool worker (`sa worker`): runs the tool jobs of every agent, on any machine that reaches NATS.

    registry = build_registry(bundles=["bundles/demo"], tool_globs=["agents/*.pym"])
    worker = Worker(js, registry, concurrency=8)
    await worker.run(stop)                  # or: await serve(servers, registry, stop=stop)

Workers take `ToolJob`s from the TOOLS stream, run `.pym` tools in the Monty sandbox (and Python tools,
and agent tools as sub-runs), apply workspace writes once, and publish `ToolOutcome`s to RESULTS.

Modules, one concept each (`loop` first: its docstring is the per-job protocol and its failure modes):

- `loop`      — `Worker`: pull, buffer, run, publish, ack / nak / dead-letter; `serve` (connect and run)
- `execute`   — one job to its outcome, seeing the worker only through a narrow `JobEnv`: replay applied
                writes, look the tool up, limits, deadline, the sandbox run, writes persisted (re-run on a
                conflict)
- `registry`  — `ToolRegistry` (the tool versions a worker can run, from bundles and globs, each found by
                the `ToolVersion` a job names) and `build_registry`
- `handoff`   — a job whose tool version this worker lacks: left to a worker that has it, or failed
                naming the missing version (and why versions are not routed by subject)
- `cancel`    — `Cancels`: a `run.cancelled` stops the run's job in the sandbox; later jobs of it don't start
- `externals` — a script's `@external` functions per job, their recorded answers, secrets scrubbed
- `subruns`   — agent tools: the call becomes a child run (`Delegated`); the `SubrunWatch` answers it
- `stats`     — `WorkerStats` (the counters) and the `WorkerBeat` that `sa status` reads

- `attempts`  — job heartbeats and the history of a job's earlier deliveries
- `dlq`       — dead letters: a job no worker could finish, kept with its reason, listed and replayed

The job and outcome wire messages are `runtime.jobs`, shared with the host.
"""

from runtime.worker.loop import Worker, serve
from runtime.worker.registry import ToolRegistry, build_registry
from runtime.worker.stats import WorkerStats

__all__ = ["ToolRegistry", "Worker", "WorkerStats", "build_registry", "serve"]
