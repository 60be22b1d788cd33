"""Partition leases: which host serves which task partition, renewed while it lives, lost when it dies.

Every host runs one `Leases` loop. The state lives in two KV buckets (`runtime.nats.kv`):

* ``leases``: key ``p<N>`` = the id of the host holding partition N, written with a per-key TTL
  (`Nats-TTL`). A host **acquires** a free partition with a create (expected revision 0, or the revision
  of the delete marker a graceful release left), **renews** every `renew` seconds with an update
  expecting the revision it holds, and **releases** with a revision-checked delete. Nobody deletes
  anybody else's lease: a dead host's keys simply expire, the server removes them at their TTL.
* ``hosts``: key = host id, a `HostBeat` with the same TTL, renewed on the same tick: the live hosts.

Each tick (every `renew` seconds): heartbeat, renew every held lease, then read both buckets. With H live
hosts and N partitions the fair share is ceil(N / H): a host holding more releases its excess
(the partitions it least prefers), a host holding fewer acquires free ones up to its share. Preference
is rendezvous hashing of (host, partition), so hosts reach for different partitions and a partition
tends to go back to the same host. A starting host therefore gets its share within two ticks of the
others noticing it.

Bounds (defaults: TTL 6 s, renew every 2 s = TTL/3)
-----------------------------------------------------
* A host that stops renewing (killed, partitioned from NATS, stalled) loses every partition at most
  TTL after its last successful renewal; another host picks each up at its next tick, so a partition
  is served again within **TTL + renew = 8 s** (plus the takeover's recovery). bench/scale.py measures it.
* A host fences itself: if no renewal of a lease succeeded for `fence_after` = TTL - renew/2 = 5 s, it
  stops serving that partition (its consumers, drivers and acks; `on_loss`) before the lease can
  expire, so two hosts never serve a partition at the same time as long as clocks tick at the same
  rate. If a later renewal still succeeds (NATS was only slow, the key never expired), it resumes
  serving (`on_gain`, a full takeover of its own partition). Exactly-one-writer per run does not rest on
  this: the expected-sequence append stops any stale writer (`driver.Superseded`).

`on_gain(p)` and `on_loss(p, why)` are the host's hooks; `on_loss` is awaited before a lease is released,
so a partition is handed over only once this host has stopped serving it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from runtime.nats.kv import fleet_kv, kv_entries, put_kv
from runtime.nats.records import HostBeat
from runtime.nats.subjects import HOSTS_BUCKET, LEASES_BUCKET, lease_key

log = logging.getLogger("runtime.host")

DEFAULT_TTL_S = 6.0


@dataclass(frozen=True)
class LeaseConfig:
    ttl: float = DEFAULT_TTL_S  # a lease not renewed for this long is gone (whole seconds, ≥ 2)
    renew: float | None = None  # renew / rebalance period (default ttl / 3)

    def __post_init__(self) -> None:
        if self.ttl < 2:
            raise ValueError("lease TTL must be at least 2 s (NATS per-key TTLs are whole seconds)")
        if self.renew is not None and not 0 < self.renew < self.ttl / 2:
            raise ValueError("renew period must be below half the lease TTL")

    @property
    def every(self) -> float:
        return self.renew if self.renew is not None else self.ttl / 3

    @property
    def fence_after(self) -> float:
        """Stop serving a partition whose lease was not renewed for this long (before it can expire)."""
        return self.ttl - self.every / 2


def new_host_id() -> str:
    """A unique, KV-key-safe id: `<hostname>-<pid>-<random>`."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def preference(host_id: str, partition: int) -> int:
    """Rendezvous score: each host ranks partitions differently, the same way every time."""
    return int.from_bytes(hashlib.blake2b(f"{host_id}/{partition}".encode(), digest_size=8).digest(), "big")


@dataclass
class _Held:
    revision: int
    renewed: float  # monotonic time the last successful renewal (or the acquisition) was sent
    serving: bool = True


@dataclass
class LeaseView:
    """One read of both buckets: partition -> holder (None: free) with its revision, and the live hosts."""

    holders: dict[int, tuple[str | None, int]] = field(default_factory=dict)
    hosts: dict[str, HostBeat] = field(default_factory=dict)


class Leases:
    """The lease loop of one host (see the module docstring)."""

    def __init__(self, js: JetStreamContext, host_id: str, partitions: int, *,
                 on_gain: Callable[[int], Awaitable[None]], on_loss: Callable[[int, str], Awaitable[None]],
                 beat: Callable[[], HostBeat], config: LeaseConfig | None = None) -> None:
        self.js, self.host_id, self.total = js, host_id, partitions
        self.config = config or LeaseConfig()
        self.on_gain, self.on_loss, self.beat = on_gain, on_loss, beat
        self.held: dict[int, _Held] = {}
        self.share = partitions
        self.settled = anyio.Event()  # the first share is held (or could not be had within TTL + renew)
        self.ticks = 0
        self._started = time.monotonic()
        self._buckets: dict[str, Any] = {}

    async def _bucket(self, name: str) -> Any:
        if name not in self._buckets:
            self._buckets[name] = await fleet_kv(self.js, name)
        return self._buckets[name]

    @property
    def serving(self) -> list[int]:
        return sorted(p for p, h in self.held.items() if h.serving)

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Tick until `stop`, then hand every partition back (awaiting `on_loss` first)."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._fence_watch, stop)
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        await self.tick()
                    except Exception as e:  # NATS trouble: fences protect us; try again next tick
                        log.warning("lease tick failed: %s: %s", type(e).__name__, e)
                    with anyio.move_on_after(max(0.0, self.config.every - (time.monotonic() - t0))):
                        await stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await self.release_all()

    async def tick(self) -> None:
        self.ticks += 1
        before = self.serving
        await self._heartbeat()
        async with anyio.create_task_group() as tg:
            for p in list(self.held):
                tg.start_soon(self._renew, p)
        view = await self.read()
        live = set(view.hosts) | {self.host_id}
        self.share = math.ceil(self.total / len(live))
        mine = sorted(self.held, key=lambda p: preference(self.host_id, p))
        for p in mine[:max(0, len(self.held) - self.share)]:  # the least preferred first
            await self.release(p, "rebalanced")
        want = self.share - len(self.held)
        if want > 0:
            free = [p for p, (holder, _) in view.holders.items() if holder is None and p not in self.held]
            free.sort(key=lambda p: preference(self.host_id, p), reverse=True)
            for p in free[:want]:
                await self._acquire(p, view.holders[p][1])
        if self.serving != before:
            await self._heartbeat()  # others and `sa status` see the new set now, not a tick later
        waited = time.monotonic() - self._started
        if len(self.held) >= min(self.share, self.total) or waited >= self.config.ttl + self.config.every:
            self.settled.set()

    async def read(self) -> LeaseView:
        """Both buckets, as they are now."""
        leases = await self._bucket(LEASES_BUCKET)
        hosts = await self._bucket(HOSTS_BUCKET)
        view = LeaseView(holders={p: (None, 0) for p in range(self.total)})
        for key, entry in (await kv_entries(leases, deleted=True)).items():
            p = _partition_of_key(key)
            if p is None or p >= self.total:
                continue
            holder = entry.value.decode() if entry.operation is None and entry.value else None
            view.holders[p] = (holder, entry.revision or 0)
        for key, entry in (await kv_entries(hosts)).items():
            try:
                view.hosts[key] = HostBeat.decode(entry.value)
            except Exception as e:
                log.debug("unreadable heartbeat of %s: %s", key, e)
        return view

    # -- one lease ---------------------------------------------------------------------------------------

    async def _acquire(self, p: int, revision: int) -> None:
        sent = time.monotonic()
        try:
            rev = await put_kv(self.js, LEASES_BUCKET, lease_key(p), self.host_id.encode(),
                                   last=revision, ttl=self.config.ttl, timeout=self.config.every)
        except KeyWrongLastSequenceError:
            return  # another host was quicker
        except Exception as e:
            log.debug("acquiring partition %d failed: %s", p, e)
            return
        self.held[p] = _Held(rev, sent)
        log.info("host %s: acquired partition %d", self.host_id, p)
        await self.on_gain(p)

    async def _renew(self, p: int) -> None:
        held = self.held.get(p)
        if held is None:
            return
        sent = time.monotonic()
        try:
            rev = await put_kv(self.js, LEASES_BUCKET, lease_key(p), self.host_id.encode(),
                                   last=held.revision, ttl=self.config.ttl, timeout=self.config.every)
        except KeyWrongLastSequenceError:  # expired (and maybe taken): it is not ours any more
            if self.held.get(p) is held:
                del self.held[p]
                log.warning("host %s: lost partition %d (its lease expired or was taken)", self.host_id, p)
                if held.serving:
                    await self.on_loss(p, "lost")
            return
        except Exception as e:  # NATS trouble: `_fence_watch` stops serving before the lease can expire
            log.debug("renewing partition %d failed: %s", p, e)
            return
        if self.held.get(p) is not held:
            return
        held.revision, held.renewed = rev, sent
        if not held.serving:  # fenced while NATS was away, but the lease never expired: serve again
            held.serving = True
            log.info("host %s: partition %d renewed after a fence; serving it again", self.host_id, p)
            await self.on_gain(p)

    async def release(self, p: int, why: str) -> None:
        """Stop serving `p` (awaiting `on_loss`), then free its lease for another host."""
        held = self.held.pop(p, None)
        if held is None:
            return
        if held.serving:
            await self.on_loss(p, why)
        try:
            leases = await self._bucket(LEASES_BUCKET)
            await leases.delete(lease_key(p), last=held.revision)
            log.info("host %s: released partition %d (%s)", self.host_id, p, why)
        except Exception as e:  # it expires by itself
            log.debug("releasing partition %d failed (%s); it expires after its TTL", p, e)

    async def release_all(self) -> None:
        for p in list(self.held):
            await self.release(p, "stopping")
        try:
            hosts = await self._bucket(HOSTS_BUCKET)
            await hosts.delete(self.host_id)
        except Exception as e:
            log.debug("removing the heartbeat failed: %s", e)

    async def _heartbeat(self) -> None:
        try:
            await put_kv(self.js, HOSTS_BUCKET, self.host_id, self.beat().encode(),
                             ttl=self.config.ttl, timeout=self.config.every)
        except Exception as e:
            log.debug("heartbeat failed: %s", e)

    async def _fence_watch(self, stop: anyio.Event) -> None:
        """Stop serving any partition whose lease could expire soon (renewals failing)."""
        while not stop.is_set():
            now = time.monotonic()
            for p, held in list(self.held.items()):
                if held.serving and now - held.renewed > self.config.fence_after:
                    held.serving = False
                    log.warning("host %s: partition %d not renewed for %.1f s: fenced (not serving it)",
                                self.host_id, p, now - held.renewed)
                    await self.on_loss(p, "fenced")
            await anyio.sleep(0.1)


def _partition_of_key(key: str) -> int | None:
    if key.startswith("p") and key[1:].isdigit():
        return int(key[1:])
    return None


__all__ = ["DEFAULT_TTL_S", "LeaseConfig", "LeaseView", "Leases", "new_host_id", "preference"]
