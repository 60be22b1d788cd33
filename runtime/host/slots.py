"""What a lease is for and how hosts rank what they reach for: the slot, the lease settings, host ids.

Apart from the lease loop (`runtime.host.leases`) because these are plain values every side of a host
reads (the host's config, its partitions, the tests), while the loop is I/O.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from dataclasses import dataclass

DEFAULT_TTL_S = 2.0

Slot = tuple[str, int]  # (bundle, partition): what one lease is for, and what a host serves


@dataclass(frozen=True)
class LeaseConfig:
    ttl: float = DEFAULT_TTL_S  # a lease not renewed for this long is gone (whole seconds, ≥ 2)
    renew: float | None = None  # renew / rebalance period (default ttl / 4)
    thread: bool = True  # renew from a thread with its own connection (`runtime.host.renewer`)

    def __post_init__(self) -> None:
        if self.ttl < 2:
            raise ValueError("lease TTL must be at least 2 s (NATS per-key TTLs are whole seconds)")
        if self.renew is not None and not 0 < self.renew < self.ttl / 2:
            raise ValueError("renew period must be below half the lease TTL")

    @property
    def every(self) -> float:
        return self.renew if self.renew is not None else self.ttl / 4

    @property
    def fence_after(self) -> float:
        """Stop serving a slot whose lease was not renewed for this long: one renewal period before
        it can expire (the lease runs from when the server stored the renewal, after it was sent)."""
        return self.ttl - self.every


def new_host_id() -> str:
    """A unique, KV-key-safe id: `<hostname>-<pid>-<random>`."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def preference(host_id: str, slot: Slot) -> int:
    """Rendezvous score: each host ranks slots differently, the same way every time."""
    bundle, partition = slot
    key = f"{host_id}/{bundle}/{partition}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


__all__ = ["DEFAULT_TTL_S", "LeaseConfig", "Slot", "new_host_id", "preference"]
