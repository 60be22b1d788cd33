"""NATS / JetStream for the runtime: every name, the streams and buckets, consumers, and the server itself.

- `subjects`     every subject, filter, Msg-Id, header, stream, bucket and consumer name (pure)
- `records`      what the KV buckets hold: `RunIndex`, `HostBeat`, `WorkerBeat` (pure)
- `connection`   `connect` (reconnecting forever) and `close`
- `credentials`  how a process authenticates: credentials file, user and password, TLS
- `auth`         the roles of a secured cluster and what each may publish and subscribe
- `starter`      what a run's starter may ask the hosts (follow, cancel), proved by its key: the wire format
- `jetstream`    `jetstream_for(nc)`: the JetStream context with the leaner acked publish
- `topology`     the streams and consumers: `ensure_topology`, `read_topology`, `attach_topology`
- `retention`    how long EVENTS and the payloads keep what they hold
- `kv`           opening buckets, `put_kv` with a per-key TTL, `kv_entries` (exact listing), the payload store
- `pull`         `consume` (a continuous pull: hosts, workers), `Budget`, `fetch_batch` (a batch at a time)
- `retry`        `retrying`: the one way to retry until NATS answers
- `server`       the `nats-server` binary, its process supervisor, `EmbeddedNats`
- `cluster`      `LocalCluster`: a 3-node cluster on loopback from deploy/nats/nats.conf
- `durability`   whether the servers sync a write to disk before acknowledging it (`storage_sync`)

The package's own names are the few a program needs to get onto NATS: connect, set up or attach to the
topology, or start a server. Everything else is imported from its module
(`from runtime.nats.subjects import TASKS`). The names here load their module on first use, so a module
that only needs names (`runtime.jobs`, `runtime.commands` import `runtime.nats.subjects`) never loads nats-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.nats.cluster import LocalCluster
    from runtime.nats.connection import close, connect, servers_from_env
    from runtime.nats.jetstream import jetstream_for
    from runtime.nats.server import EmbeddedNats
    from runtime.nats.topology import attach_topology, ensure_topology

# each name and the module it loads on first use (`__getattr__`)
_LAZY = {"LocalCluster": "cluster", "close": "connection", "connect": "connection",
         "servers_from_env": "connection", "jetstream_for": "jetstream", "EmbeddedNats": "server",
         "attach_topology": "topology", "ensure_topology": "topology"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["EmbeddedNats", "LocalCluster", "attach_topology", "close", "connect", "ensure_topology",
           "jetstream_for", "servers_from_env"]
