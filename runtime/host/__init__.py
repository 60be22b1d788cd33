"""The agent host: partitions, actors, the run driver (effect runner), recovery, commands.

    agents = load_agents(["bundles/demo"], local_model_url=url)     # bundle name -> AgentRuntime
    host = Host(nc, agents)
    await host.run(stop)                                              # `sa host`, `sa up`

Modules, one concept each (`host` first: its docstring says how a task flows and where it is acked):

- `host`       — `Host`, the coordinator: assembles the parts below; starts and drives a task's run
- `config`     — `HostConfig` (what a host is told) and `HostStats` (what it counts)
- `partitions` — taking and losing a slot (a partition of a bundle), its consumers; `Guarded` drops acks
                 for a lost one
- `routing`    — a task-subject message to its actor or run (forwarded if need be), an outcome to its driver
- `actors`     — actors and their mailboxes: one task at a time per actor, every actor concurrently
- `recovery`   — folding existing runs from their log at a takeover, or after a lost append race
- `runs_index` — the ``runs`` KV index and the ``active`` bucket (unfinished runs per partition)
- `driver`     — `RunDriver`: one run's kernel loop; appends through the run log; model calls; tool jobs
- `jobs_out`   — a turn's jobs sent at once, their acks awaited after their records, re-sent through outages
- `served`     — `AgentRuntime`: one bundle's kernel config, model step and model client
- `serve`      — `load_agents`, `serve` (connect, run a host until stopped), `close_agents`
- `leases`     — which host serves which slot: expiring KV leases, fair shares per bundle, fencing
- `clock`      — how fast this host's clock runs against the NATS server's (lease ages on the server's clock)
- `unserved`   — tasks of agents no live host serves: waited for, failed `unknown_agent` after a while
- `endpoint`   — the model endpoint's fleet-wide share: permits in NATS (priority, then round robin across
                 actors), token counts per minute and per day
- `regressions` — the host's regression slots: runs of other processes' regressions (`runtime.regress.fleet`),
                 a few at a time, their model calls at the lowest priority
- `scheduler`  — the cluster's clock (SCHEDULES): schedules' fires become tasks, wake-ups wake commands
- `sleep`      — a run asleep on a timer: its wake-ups scheduled in the cluster, deleted if it ends first
- `starters`   — `StarterDesk`: a run's starter (a publisher) follows and cancels it, proved by its key
- `answers`    — what a person sends a run (an answer, an approver's verdict), checked and recorded; a
                 question's timeout recorded when the parked run wakes

The continuous pull consumer and the back-pressure budget are `runtime.nats.pull`.
"""

from runtime.host.config import HostConfig, HostStats
from runtime.host.driver import RunDriver
from runtime.host.host import Host
from runtime.host.serve import close_agents, load_agents, serve
from runtime.host.served import AgentRuntime, build_agent

__all__ = ["AgentRuntime", "Host", "HostConfig", "HostStats", "RunDriver", "build_agent", "close_agents",
           "load_agents", "serve"]
