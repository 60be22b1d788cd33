"""Serving bundles: load them into `AgentRuntime`s, run a host until told to stop, close their clients.

What `sa host` and `sa up` call; a program embedding a host calls the same three functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio

from runtime.bundle import Bundle
from runtime.host.config import HostConfig, HostStats
from runtime.host.host import Host
from runtime.host.served import AgentRuntime, build_agent
from runtime.model import get_adapter
from runtime.model.constraints import prepare_constraints
from runtime.nats.connection import close, connect
from runtime.nats.jetstream import jetstream_for
from runtime.nats.subjects import DEFAULT_PARTITIONS
from runtime.nats.topology import attach_topology

log = logging.getLogger("runtime.host")


def load_agents(bundles: Iterable[str | Path], *, local_model_url: str | None = None,
                client: Any = None) -> dict[str, AgentRuntime]:
    """Load and validate every bundle (raises `BundleError` listing every problem of the first bad one).

    One exception: a bundle whose only problems lie in what it talks to is left out with an error in the log
    naming the bundle and why, and the others are served; only when no bundle is left is the first error
    raised. Those problems (`runtime.bundle.problems.BundleError.outside`): an MCP server that cannot be
    reached now (not started, not answering), and a model server that cannot enforce the bundle's constraint
    strategy (`model.server`, or what `auto` found: `runtime.model.dialects`). Why: one host serves many
    teams' bundles, and one team pointing its bundle at the wrong server must not take the others down; a
    bundle that is wrong in itself (a typo, a bad schema) still stops the host, as `sa check` would."""
    from runtime.bundle import BundleError, load_bundle
    from runtime.model.dialects import DialectError

    loaded: dict[str, Bundle] = {}
    skipped: list[Exception] = []
    for path in bundles:
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            elsewhere = e.outside()
            if not elsewhere:
                raise
            log.error("not serving %s: %s", e.source, "; ".join(elsewhere))
            skipped.append(e)
            continue
        if bundle.name in loaded:
            raise ValueError(f"two bundles are named {bundle.name!r}: {loaded[bundle.name].path} "
                             f"and {bundle.path}")
        loaded[bundle.name] = bundle
    _prepare_grammars(loaded.values())
    agents: dict[str, AgentRuntime] = {}
    for name, bundle in loaded.items():
        try:
            agents[name] = build_agent(bundle, local_model_url=local_model_url, client=client)
        except DialectError as e:  # `model.server: auto` asked the server, and it cannot enforce the strategy
            log.error("not serving %s: model.server: %s", bundle.path, e)
            skipped.append(e)
    if skipped and not agents:
        raise skipped[0]
    return agents


def _prepare_grammars(bundles: Iterable[Bundle]) -> None:
    """Every `ebnf` grammar the bundles will send (full tool set and forced last turn), derived by one
    xgrammar child for all of them (`runtime.model.ebnf`): a host serving many bundles starts in one
    child's time, not one per bundle."""
    wanted = []
    for bundle in bundles:
        config, constraint = bundle.kernel_config(), bundle.decoding_constraint()
        adapter = get_adapter(bundle.spec.model.adapter)
        for tools in (config.tools, config.offered(config.max_turns)):
            wanted.append((adapter, tools, constraint))
    prepare_constraints(wanted)


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


__all__ = ["close_agents", "load_agents", "serve"]
