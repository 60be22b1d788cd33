"""Partition leases: which host serves which task partition, renewed while it lives, lost when it dies.

Every host runs one `Leases` loop. The state lives in two KV buckets (`runtime.nats.kv`):

* ``leases``: key ``p<N>`` = the id of the host holding partition N, written with a per-key TTL
  (`Nats-TTL`). A host **acquires** a free partition with a create (expected revision 0, or the revision
  of the delete marker a graceful release left), **renews** every `renew` seconds with an update
  expecting the revision it holds, and **releases** with a revision-checked delete. Nobody deletes
  anybody else's lease: a dead host's keys simply expire, the server removes them at their TTL.
* ``hosts``: key = host id, a `HostBeat` with the same TTL, renewed on the same tick: the live hosts.

Each tick (every `renew` seconds, and at once when a lease is released or expires: the loop watches the
``leases`` bucket for delete and expiry markers): read both buckets. With H live
hosts and N partitions the fair share is ceil(N / H): a host holding more releases its excess
(the partitions it least prefers), a host holding fewer acquires free ones up to its share. Preference
is rendezvous hashing of (host, partition), so hosts reach for different partitions and a partition
tends to go back to the same host. A starting host therefore gets its share within two ticks of the
others noticing it.

Renewing. The heartbeat and the renewal of every held lease happen every `renew` seconds on a thread of
their own, with its own event loop and NATS connection (`runtime.host.renewer`), and every lease read
and write goes through it: a host whose event loop is busy with thousands of runs, or whose connection
is full of appends, still renews on time. (`tick` called without `run`, as tests do, renews inline.)

Bounds (defaults: TTL 2 s, renew every 0.5 s = TTL/4, fence after 1.5 s)
--------------------------------------------------------------------------
* A host that stops renewing (killed, partitioned from NATS, wedged) loses every partition at most
  TTL after its last successful renewal: the server removes the key then (within ~20 ms) and leaves an
  expiry marker, which wakes the other hosts' loops, so a partition is taken over TTL - (0 to renew) =
  **1.5 to 2 s** after the host died, plus the takeover's recovery (bench/faults.py measures it: about
  2 s). Should the marker be missed, the next tick finds the key gone: at most TTL + renew = 2.5 s.
* A host fences itself: if no renewal of a lease succeeded for `fence_after` = TTL - renew = 1.5 s (three
  renewals in a row failed), it stops serving that partition (its consumers, drivers and acks;
  `on_loss`) a whole renewal period before the lease can expire, so two hosts never serve a partition at
  the same time as long as clocks tick at the same rate. If a later renewal still succeeds (NATS was only
  slow, the key never expired), it resumes serving (`on_gain`, a full takeover of its own partition).
  Exactly-one-writer per run does not rest on this: the expected-sequence append stops any stale writer
  (`driver.Superseded`).
* A NATS outage longer than the fence (the ``leases`` stream electing a leader takes 4-6 s on a
  cluster) fences every host and may let leases expire: the partitions are then taken again, by the
  same hosts or others, once NATS answers. That costs a recovery, never a run.

`on_gain(p)` and `on_loss(p, why)` are the host's hooks; `on_loss` is awaited before a lease is released,
so a partition is handed over only once this host has stopped serving it.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from runtime.host.renewer import WEDGED_S, LeaseRenewer, connect_options
from runtime.nats.kv import fleet_kv, kv_entries, put_kv
from runtime.nats.records import HostBeat
from runtime.nats.subjects import HOSTS_BUCKET, LEASES_BUCKET, lease_key

log = logging.getLogger("runtime.host")

DEFAULT_TTL_S = 2.0


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
        """Stop serving a partition whose lease was not renewed for this long: one renewal period before
        it can expire (the lease runs from when the server stored the renewal, after it was sent)."""
        return self.ttl - self.every


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
    lost: bool = False  # a renewal found it gone or taken (set on the lease thread, acted on by the host's)
    releasing: bool = False  # handing it over: `on_loss` runs, renewals go on until the delete
    gone: bool = False  # released: renew it no more


class _LeaseIO:
    """Lease reads and writes on one connection; one lock per partition orders a renewal and a release."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.buckets: dict[str, Any] = {}
        self.locks: dict[int, asyncio.Lock] = {}

    async def bucket(self, name: str) -> Any:
        if name not in self.buckets:
            self.buckets[name] = await fleet_kv(self.js, name)
        return self.buckets[name]

    async def put(self, p: int, holder: bytes, held: _Held | None, last: int, ttl: float,
                  timeout: float) -> int:
        """Acquire (`held` None, `last` the free key's revision) or renew (`held`: its current revision)."""
        async with self.locks.setdefault(p, asyncio.Lock()):
            if held is not None:
                if held.gone:
                    return held.revision
                last = held.revision
            return await put_kv(self.js, LEASES_BUCKET, lease_key(p), holder, last=last, ttl=ttl,
                                timeout=timeout)

    async def delete(self, p: int, held: _Held) -> None:
        async with self.locks.setdefault(p, asyncio.Lock()):
            held.gone = True
            await (await self.bucket(LEASES_BUCKET)).delete(lease_key(p), last=held.revision)

    async def heartbeat(self, host_id: str, beat: bytes, ttl: float, timeout: float) -> None:
        await put_kv(self.js, HOSTS_BUCKET, host_id, beat, ttl=ttl, timeout=timeout)

    async def remove_beat(self, host_id: str) -> None:
        await (await self.bucket(HOSTS_BUCKET)).delete(host_id)

    async def entries(self, name: str, deleted: bool) -> dict[str, Any]:
        return await kv_entries(await self.bucket(name), deleted=deleted)


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
        self.alive = time.monotonic()  # the host loop's last sign of life (the renewer's wedge guard)
        self._started = time.monotonic()
        self._ios: dict[int, _LeaseIO] = {}  # one per connection: the host's, the lease thread's
        self._renewer: LeaseRenewer | None = None
        self._beat_bytes: bytes | None = None
        self._wake = anyio.Event()

    @property
    def serving(self) -> list[int]:
        return sorted(p for p, h in self.held.items() if h.serving)

    def _io_for(self, js: JetStreamContext) -> _LeaseIO:
        io = self._ios.get(id(js))
        if io is None:
            io = self._ios[id(js)] = _LeaseIO(js)
        return io

    async def _io(self, name: str, *args: Any) -> Any:
        """Run one `_LeaseIO` operation: on the lease thread if it runs, else on the host's connection."""
        if self._renewer is not None:
            async def on_thread(js: JetStreamContext, *a: Any) -> Any:
                return await getattr(self._io_for(js), name)(*a)
            return await self._renewer.call(on_thread, *args)
        return await getattr(self._io_for(self.js), name)(*args)

    def _connected(self) -> bool:
        nc = getattr(self.js, "_nc", None)  # nats-py keeps the connection on the context
        return nc is None or (nc.is_connected and not nc.is_closed)

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Tick until `stop`, then hand every partition back (awaiting `on_loss` first)."""
        if self.config.thread:
            await self._start_renewer()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._fence_watch, stop)
                tg.start_soon(self._watch_releases)
                while not stop.is_set():
                    t0 = time.monotonic()
                    self._wake = anyio.Event()
                    try:
                        await self.tick()
                    except Exception as e:  # NATS trouble: fences protect us; try again next tick
                        log.warning("lease tick failed: %s: %s", type(e).__name__, e)
                    with anyio.move_on_after(max(0.0, self.config.every - (time.monotonic() - t0))):
                        await _first(stop.wait, self._wake.wait)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                if self._connected():  # a host cut off from NATS is as good as dead: its leases expire
                    await self.release_all()
                if self._renewer is not None:
                    await anyio.to_thread.run_sync(self._renewer.stop)

    async def _start_renewer(self) -> None:
        nc = getattr(self.js, "_nc", None)
        if nc is None:
            return
        self._beat_bytes = self.beat().encode()
        renewer = LeaseRenewer(connect_options(nc), self._renew_round, self.config.every)
        try:
            await anyio.to_thread.run_sync(renewer.start)
        except Exception as e:  # renew on the host's own loop and connection instead
            log.warning("host %s: no lease connection of its own (%s: %s); renewing inline",
                        self.host_id, type(e).__name__, e)
            await anyio.to_thread.run_sync(renewer.stop)
            return
        self._renewer = renewer

    async def _renew_round(self, js: JetStreamContext) -> None:
        """One renewal round, on the lease thread: heartbeat and every held lease, concurrently; only
        while the host's connection is up and its loop alive (`runtime.host.renewer`)."""
        if not self._connected() or time.monotonic() - self.alive > WEDGED_S:
            return
        io, cfg, holder = self._io_for(js), self.config, self.host_id.encode()

        async def renew(p: int, held: _Held) -> None:
            sent = time.monotonic()
            try:
                rev = await io.put(p, holder, held, 0, cfg.ttl, cfg.every)
            except KeyWrongLastSequenceError:
                held.lost = True  # the host's `_fence_watch` stops serving it
                return
            except Exception as e:
                log.debug("renewing partition %d failed: %s", p, e)
                return
            if not held.gone:
                held.revision, held.renewed = rev, sent

        jobs = [renew(p, h) for p, h in list(self.held.items()) if not h.gone]
        if self._beat_bytes is not None:
            jobs.append(io.heartbeat(self.host_id, self._beat_bytes, cfg.ttl, cfg.every))
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, Exception):
                log.debug("heartbeat failed: %s", result)

    async def tick(self) -> None:
        self.ticks += 1
        before = self.serving
        await self._heartbeat()
        if self._renewer is None:  # no lease thread: renew here
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
        view = LeaseView(holders={p: (None, 0) for p in range(self.total)})
        for key, entry in (await self._io("entries", LEASES_BUCKET, True)).items():
            p = _partition_of_key(key)
            if p is None or p >= self.total:
                continue
            holder = entry.value.decode() if entry.operation is None and entry.value else None
            view.holders[p] = (holder, entry.revision or 0)
        for key, entry in (await self._io("entries", HOSTS_BUCKET, False)).items():
            try:
                view.hosts[key] = HostBeat.decode(entry.value)
            except Exception as e:
                log.debug("unreadable heartbeat of %s: %s", key, e)
        return view

    async def _watch_releases(self) -> None:
        """Wake the loop as soon as a lease is deleted or expires (its marker), instead of at the next
        tick: a dead host's partitions are taken the moment the server drops its leases."""
        while True:
            try:
                kv = await fleet_kv(self.js, LEASES_BUCKET)
                watcher = await kv.watchall(include_history=False)
                try:
                    async for entry in watcher:
                        if entry is not None and entry.operation is not None:
                            self._wake.set()
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            except Exception as e:  # the tick still runs every period: this only makes it sooner
                log.debug("watching the leases bucket: %s", e)
            await anyio.sleep(self.config.every)

    # -- one lease ---------------------------------------------------------------------------------------

    async def _acquire(self, p: int, revision: int) -> None:
        sent = time.monotonic()
        try:
            rev = await self._io("put", p, self.host_id.encode(), None, revision, self.config.ttl,
                                 self.config.every)
        except KeyWrongLastSequenceError:
            return  # another host was quicker
        except Exception as e:
            log.debug("acquiring partition %d failed: %s", p, e)
            return
        self.held[p] = _Held(rev, sent)
        log.info("host %s: acquired partition %d", self.host_id, p)
        await self.on_gain(p)

    async def _renew(self, p: int) -> None:
        """Renew one lease from the host's loop (without a lease thread) and act on the answer."""
        held = self.held.get(p)
        if held is None:
            return
        sent = time.monotonic()
        try:
            rev = await self._io("put", p, self.host_id.encode(), held, 0, self.config.ttl, self.config.every)
        except KeyWrongLastSequenceError:  # expired (and maybe taken): it is not ours any more
            held.lost = True
            await self._settle(p, held)
            return
        except Exception as e:  # NATS trouble: `_fence_watch` stops serving before the lease can expire
            log.debug("renewing partition %d failed: %s", p, e)
            return
        if self.held.get(p) is not held:
            return
        held.revision, held.renewed = rev, sent
        await self._settle(p, held)

    async def _settle(self, p: int, held: _Held) -> None:
        """Act on what renewals found: a lost lease stops being served; a fenced one renewed again is
        served again."""
        if self.held.get(p) is not held or held.releasing:
            return
        if held.lost:
            del self.held[p]
            log.warning("host %s: lost partition %d (its lease expired or was taken)", self.host_id, p)
            if held.serving:
                held.serving = False
                await self.on_loss(p, "lost")
        elif not held.serving and time.monotonic() - held.renewed < self.config.fence_after:
            held.serving = True  # fenced while NATS was away, but the lease never expired: serve again
            log.info("host %s: partition %d renewed after a fence; serving it again", self.host_id, p)
            await self.on_gain(p)

    async def release(self, p: int, why: str) -> None:
        """Stop serving `p` (awaiting `on_loss`; renewals go on meanwhile), then free its lease."""
        held = self.held.get(p)
        if held is None or held.releasing:
            return
        held.releasing = True
        if held.serving:
            held.serving = False
            await self.on_loss(p, why)
        if self.held.get(p) is held:
            del self.held[p]
        try:
            await self._io("delete", p, held)
            log.info("host %s: released partition %d (%s)", self.host_id, p, why)
        except Exception as e:  # it expires by itself
            log.debug("releasing partition %d failed (%s); it expires after its TTL", p, e)

    async def release_all(self) -> None:
        for p in list(self.held):
            await self.release(p, "stopping")
        try:
            await self._io("remove_beat", self.host_id)
        except Exception as e:
            log.debug("removing the heartbeat failed: %s", e)

    async def _heartbeat(self) -> None:
        self._beat_bytes = self.beat().encode()  # the lease thread sends the latest every round too
        try:
            await self._io("heartbeat", self.host_id, self._beat_bytes, self.config.ttl, self.config.every)
        except Exception as e:
            log.debug("heartbeat failed: %s", e)

    async def _fence_watch(self, stop: anyio.Event) -> None:
        """Stop serving any partition whose lease could expire soon (renewals failing), act on what the
        lease thread found, and show the lease thread this loop lives."""
        while not stop.is_set():
            now = self.alive = time.monotonic()
            for p, held in list(self.held.items()):
                if held.releasing:
                    continue
                if held.serving and not held.lost and now - held.renewed > self.config.fence_after:
                    held.serving = False
                    log.warning("host %s: partition %d not renewed for %.1f s: fenced (not serving it)",
                                self.host_id, p, now - held.renewed)
                    await self.on_loss(p, "fenced")
                elif self._renewer is not None:
                    await self._settle(p, held)
            await anyio.sleep(0.1)


async def _first(*waits: Callable[[], Awaitable[Any]]) -> None:
    """Return when the first of `waits` returns."""
    async with anyio.create_task_group() as tg:
        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tg.cancel_scope.cancel()
        for w in waits:
            tg.start_soon(one, w)


def _partition_of_key(key: str) -> int | None:
    if key.startswith("p") and key[1:].isdigit():
        return int(key[1:])
    return None


__all__ = ["DEFAULT_TTL_S", "LeaseConfig", "LeaseView", "Leases", "new_host_id", "preference"]
