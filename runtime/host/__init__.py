"""The agent host: partitions, actors, the run driver (effect runner), recovery, commands.

    agents = load_agents(["bundles/demo"], local_model_url=url)     # bundle name -> AgentRuntime
    host = Host(nc, agents)
    await host.run(stop)                                              # `sa host`, `sa up`

Modules, one concept each (`host` first: its docstring says how a task flows and where it is acked):

- `host`       — `Host`, the coordinator: assembles the parts below; starts and drives a task's run
- `config`     — `HostConfig` (what a host is told) and `HostStats` (what it counts)
- `partitions` — taking and losing a partition, its consumers; `Guarded` drops acks for a lost one
- `routing`    — a task-subject message to its actor or run (forwarded if need be), an outcome to its driver
- `actors`     — actors and their mailboxes: one task at a time per actor, every actor concurrently
- `recovery`   — folding existing runs from their log at a takeover, or after a lost append race
- `runs_index` — the ``runs`` KV index and the ``active`` bucket (unfinished runs per partition)
- `driver`     — `RunDriver`: one run's kernel loop; appends through the run log; model calls; tool jobs
- `commands`   — what may be published to `agents.<agent>.tasks` (task, cancel, approve, deny); run ids
- `agent`      — `AgentRuntime`: one bundle's kernel config, model step and model client
- `leases`     — which host serves which partition: expiring KV leases, fair shares, fencing

The continuous pull consumer and the back-pressure budget are `runtime.nats.pull`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio

from runtime.host.agent import AgentRuntime, build_agent
from runtime.host.commands import BadCommand, actor_key, run_id_for, split_actor
from runtime.host.driver import RunDriver
from runtime.host.host import Host, HostConfig, HostStats
from runtime.log import Superseded
from runtime.nats.connection import close, connect
from runtime.nats.jetstream import jetstream_for
from runtime.nats.subjects import DEFAULT_PARTITIONS
from runtime.nats.topology import attach_topology


def load_agents(bundles: Iterable[str | Path], *, local_model_url: str | None = None,
                client: Any = None) -> dict[str, AgentRuntime]:
    """Load and validate every bundle (raises `BundleError` listing every problem of the first bad one)."""
    from runtime.bundle import load_bundle

    agents: dict[str, AgentRuntime] = {}
    for path in bundles:
        bundle = load_bundle(path)
        if bundle.name in agents:
            raise ValueError(f"two bundles are named {bundle.name!r}: {agents[bundle.name].bundle.path} "
                             f"and {bundle.path}")
        agents[bundle.name] = build_agent(bundle, local_model_url=local_model_url, client=client)
    return agents


async def close_agents(agents: dict[str, AgentRuntime]) -> None:
    """Close the agents' model clients (their HTTP connection pools)."""
    for agent in agents.values():
        aclose = getattr(agent.client, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # closing is best effort at shutdown
                pass


async def serve(servers: str | list[str] | None, agents: dict[str, AgentRuntime], *,
                stop: anyio.Event | None = None, config: HostConfig | None = None,
                on_ready: Callable[[Host], Any] | None = None, partitions: int = DEFAULT_PARTITIONS,
                on_event: Callable[[Any], Any] | None = None, **topology: Any) -> HostStats:
    """Connect, make sure the topology exists, run a host until `stop`; return its counters. `on_event`
    sees every event the host appends (`runtime.observe.metrics.HostMetrics.observe`)."""
    nc = await connect(servers, name="sa-host")
    try:
        js = jetstream_for(nc)
        await attach_topology(js, partitions=partitions, **topology)
        host = Host(nc, agents, config=config, on_event=on_event)
        stop = stop or anyio.Event()
        async with anyio.create_task_group() as tg:
            async def announce() -> None:
                await host.ready.wait()
                if on_ready is not None:
                    on_ready(host)

            tg.start_soon(announce)
            await host.run(stop)
            tg.cancel_scope.cancel()
        return host.stats
    finally:
        await close_agents(agents)
        await close(nc)


__all__ = ["AgentRuntime", "BadCommand", "Host", "HostConfig", "HostStats", "RunDriver", "Superseded",
           "actor_key", "build_agent", "close_agents", "load_agents", "run_id_for", "serve", "split_actor"]
