"""Whether the JetStream servers a process attaches to sync a write to disk before acknowledging it.

Why it matters: JetStream's default is to acknowledge a write once it is in the OS page cache and to sync
its files every two minutes (`sync_interval`). A power loss or an OS crash (of a single server, or of
every replica at once: a rack, a zone, a cluster on one machine) then loses writes the runtime was told
are stored, and the runtime acts on that word: a recorded model reply is not asked for again, a tool's
recorded outcome is not run again, an acked task is not delivered again. `sync_interval: always` makes
the acknowledgement mean "on disk" (deploy/nats/nats.conf, the Helm values and the embedded server set it).

How a client can know: not through the NATS protocol. Neither the server's INFO nor JetStream's account
info (`$JS.API.INFO`) nor a stream's info says how the store syncs; the system account's `$SYS.REQ.SERVER.
PING.VARZ` does, but a host's user is not in the system account. The server's monitoring endpoint does:
`/varz` has `jetstream.config.sync_always` (true with `sync_interval: always`, absent otherwise) and
`jetstream.config.sync_interval` (nanoseconds). So a host asks `/varz` of the monitoring URLs it is given
(`SA_NATS_MONITOR`, comma-separated) or, without them, of port 8222 on each NATS server's host (the
conventional monitoring port, which deploy/nats/nats.conf and the Helm chart use). Each node answers for
itself only: give every node's monitoring URL to check a whole cluster. A node whose monitoring port
cannot be reached leaves the answer unknown, which is reported as such, never as synced.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from runtime.nats.server import monitor_get

MONITOR_ENV = "SA_NATS_MONITOR"  # monitoring URLs (http://host:8222), comma-separated
REQUIRE_SYNC_ENV = "SA_REQUIRE_SYNC"  # "1": refuse to serve on storage that acknowledges before syncing
DEFAULT_MONITOR_PORT = 8222


class UnsyncedStorage(RuntimeError):
    """A host told to serve only on synced storage (`SA_REQUIRE_SYNC=1`) found storage that is not, or
    could not tell."""


@dataclass(frozen=True)
class NodeSync:
    """What one server's `/varz` said of its JetStream store (`synced` None: it could not be asked)."""

    monitor_url: str
    synced: bool | None
    interval_s: float | None = None  # its periodic sync when not synced on every write
    server: str = ""

    def describe(self) -> str:
        where = self.server or self.monitor_url
        if self.synced is None:
            return f"{where}: unknown (its monitoring endpoint did not answer)"
        if self.synced:
            return f"{where}: sync_interval always"
        every = f"every {self.interval_s:g} s" if self.interval_s is not None else "periodically"
        return f"{where}: syncs {every}, acknowledging before"


@dataclass(frozen=True)
class SyncReport:
    """Every node asked; `synced` is True only if each of them answered that it syncs every write."""

    nodes: tuple[NodeSync, ...]

    @property
    def synced(self) -> bool:
        return bool(self.nodes) and all(n.synced for n in self.nodes)

    @property
    def lazy(self) -> tuple[NodeSync, ...]:
        return tuple(n for n in self.nodes if n.synced is False)

    @property
    def unknown(self) -> tuple[NodeSync, ...]:
        return tuple(n for n in self.nodes if n.synced is None)

    def short(self) -> str:
        """A few words for a start-up line ("" when every server syncs each write)."""
        if self.synced:
            return ""
        if self.lazy:
            return "JetStream acknowledges writes before they are on disk (set sync_interval: always)"
        return f"whether JetStream syncs before acknowledging is unknown (set {MONITOR_ENV})"

    def summary(self) -> str:
        """One line for a log: what the storage does, and what to change when it is not synced."""
        nodes = "; ".join(n.describe() for n in self.nodes) or "no server to ask"
        if self.synced:
            return f"JetStream syncs every write to disk before acknowledging it ({nodes})"
        if self.lazy:
            return (f"JetStream acknowledges writes before they are on disk ({nodes}): a power loss or an OS "
                    "crash can lose events the runtime was told are stored (a model reply asked for again, a "
                    "tool run twice); set `sync_interval: always` in the servers' jetstream block "
                    f"(deploy/nats/nats.conf), or {REQUIRE_SYNC_ENV}=1 to refuse to serve on such storage")
        return (f"cannot tell whether JetStream syncs writes to disk before acknowledging them ({nodes}): "
                f"give the servers' monitoring URLs in {MONITOR_ENV} (http://host:8222, comma-separated)")


def require_sync_from_env() -> bool:
    """Whether the operator asked (`SA_REQUIRE_SYNC=1`) that a host refuse storage not proven synced."""
    return os.environ.get(REQUIRE_SYNC_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def monitor_urls(servers: Sequence[str], configured: Sequence[str] | str | None = None) -> list[str]:
    """The monitoring URLs to ask: `configured` (or `SA_NATS_MONITOR`), else port 8222 of each server's
    host, once per host."""
    if configured is None:
        configured = os.environ.get(MONITOR_ENV) or None
    if isinstance(configured, str):
        configured = [u.strip() for u in configured.split(",") if u.strip()]
    if configured:
        return [u.rstrip("/") for u in configured]
    out: list[str] = []
    for server in servers:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        host = parts.hostname or "127.0.0.1"
        url = f"http://{f'[{host}]' if ':' in host else host}:{DEFAULT_MONITOR_PORT}"
        if url not in out:
            out.append(url)
    return out


def node_sync(monitor_url: str) -> NodeSync:
    """Ask one server's `/varz` (blocking, about 1 s at most)."""
    varz = monitor_get(f"{monitor_url.rstrip('/')}/varz")
    if not varz:
        return NodeSync(monitor_url, None)
    js = (varz.get("jetstream") or {}).get("config") or {}
    name = str(varz.get("server_name") or "")
    if js.get("sync_always"):
        return NodeSync(monitor_url, True, server=name)
    interval = js.get("sync_interval")
    return NodeSync(monitor_url, False, interval / 1e9 if isinstance(interval, int | float) else None,
                    server=name)


async def storage_sync(servers: Sequence[str], configured: Sequence[str] | str | None = None) -> SyncReport:
    """Ask every monitoring URL (`monitor_urls`) at once, off the event loop."""
    urls = monitor_urls(servers, configured)
    nodes = await asyncio.gather(*(asyncio.to_thread(node_sync, u) for u in urls))
    return SyncReport(tuple(nodes))


__all__ = ["DEFAULT_MONITOR_PORT", "MONITOR_ENV", "REQUIRE_SYNC_ENV", "NodeSync", "SyncReport",
           "UnsyncedStorage", "monitor_urls", "node_sync", "require_sync_from_env", "storage_sync"]
