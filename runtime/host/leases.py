"""Partition leases: which host serves which slot, renewed while it lives, lost when it dies.

A slot is one partition of one bundle: ``(bundle, p)``. Hosts serving the same bundle split its N
partitions among themselves; hosts serving other bundles never take them, so every task reaches a host that
serves its agent (the slot's consumers take only that bundle's subjects, `runtime.host.partitions`). A host
serving two bundles holds slots of each, shared with whichever hosts serve each of them; a bundle no live
host serves has no slots held, and its tasks wait in TASKS (`runtime.host.unserved`).

Every host runs one `Leases` loop. The state lives in two KV buckets (`runtime.nats.kv`):

* ``leases``: key ``<bundle>.p<N>`` (`subjects.lease_key`) = the id of the host holding partition N of
  that bundle, written with a per-key TTL (`Nats-TTL`). A host **acquires** a free slot with a create
  (expected revision 0, or the revision of the delete marker a graceful release left), **renews** every
  `renew` seconds with an update
  expecting the revision it holds, and **releases** with a revision-checked delete. Nobody deletes
  anybody else's lease: a dead host's keys simply expire, the server removes them at their TTL.
* ``hosts``: key = host id, a `HostBeat` with the same TTL, renewed on the same tick: the live hosts and
  the bundles each serves (`HostBeat.agents`).

Each tick (every `renew` seconds, and at once when a lease is released or expires: the loop watches the
``leases`` bucket for delete and expiry markers, and the ``hosts`` bucket for a host that appears or goes)
reads both buckets when something changed (or every `LOOK_EVERY_S` as a safety net: see `_must_look`). For
each bundle it serves, with H live hosts serving that bundle and N partitions, the fair share is ceil(N / H):
a host holding more of the bundle's slots releases its excess (the ones it least prefers), a host holding
fewer acquires free ones up to its share. Preference is rendezvous hashing of (host, bundle, partition), so
hosts reach for different slots and a slot tends to go back to the same host. A starting host therefore gets
its share within two ticks of the others noticing it.

Renewing. The heartbeat and the renewal of every held lease happen every `renew` seconds on a thread of
their own, with its own event loop and NATS connection (`runtime.host.renewer`), and every lease read
and write goes through it: a host whose event loop is busy with thousands of runs, or whose connection
is full of appends, still renews on time. (`tick` called without `run`, as tests do, renews inline.)

Bounds (defaults: TTL 2 s, renew every 0.5 s = TTL/4, fence after 1.5 s)
--------------------------------------------------------------------------
* A host that stops renewing (killed, partitioned from NATS, wedged) loses every slot at most
  TTL after its last successful renewal: the server removes the key then (within ~20 ms) and leaves an
  expiry marker, which wakes the other hosts' loops, so a slot is taken over TTL - (0 to renew) =
  **1.5 to 2 s** after the host died, plus the takeover's recovery (bench/faults.py measures it: about
  2 s). Should the marker be missed, the next tick finds the key gone: at most TTL + renew = 2.5 s.
* A host fences itself: if no renewal of a lease succeeded for `fence_after` = TTL - renew = 1.5 s (three
  renewals in a row failed), it stops serving that slot (its consumers, drivers and acks;
  `on_loss`) a whole renewal period before the lease can expire, so two hosts never serve a slot at
  the same time (ages on the server's clock when the host's runs slow: `runtime.host.clock`). If a
  later renewal still succeeds (NATS was only slow, the key never expired), it serves again (`on_gain`).
  Exactly-one-writer per run does not rest on this: a takeover fences each run (`events.RunTaken`)
  and the expected-sequence append stops any stale writer (`Superseded`).
* A NATS outage longer than the fence (the ``leases`` stream electing a leader takes 4-6 s on a
  cluster) fences every host and may let leases expire: the slots are then taken again, by the
  same hosts or others, once NATS answers. That costs a recovery, never a run.

`on_gain(slot)` and `on_loss(slot, why)` are the host's hooks; `on_loss` is awaited before a lease is
released, so a slot is handed over only once this host has stopped serving it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from runtime.host.clock import ClockRate
from runtime.host.renewer import WEDGED_S, LeaseRenewer, connect_options
from runtime.host.slots import DEFAULT_TTL_S, LeaseConfig, Slot, new_host_id, preference
from runtime.nats.kv import fleet_kv, kv_entries, put_kv
from runtime.nats.records import HostBeat
from runtime.nats.subjects import HOSTS_BUCKET, LEASES_BUCKET, lease_key, parse_lease_key

log = logging.getLogger("runtime.host")

LOOK_EVERY_S = 5.0  # a host with nothing new to see reads the lease and host buckets this often

@dataclass
class _Held:
    revision: int
    renewed: float  # when the last successful renewal (or the acquisition) was sent (`ClockRate.now`)
    serving: bool = True
    lost: bool = False  # a renewal found it gone or taken (set on the lease thread, acted on by the host's)
    releasing: bool = False  # handing it over: `on_loss` runs, renewals go on until the delete
    gone: bool = False  # released: renew it no more


class _LeaseIO:
    """Lease reads and writes on one connection; one lock per slot orders a renewal and a release."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.buckets: dict[str, Any] = {}
        self.locks: dict[Slot, asyncio.Lock] = {}

    async def bucket(self, name: str) -> Any:
        if name not in self.buckets:
            self.buckets[name] = await fleet_kv(self.js, name)
        return self.buckets[name]

    async def put(self, slot: Slot, holder: bytes, held: _Held | None, last: int, ttl: float,
                  timeout: float) -> int:
        """Acquire (`held` None, `last` the free key's revision) or renew (`held`: its current revision)."""
        async with self.locks.setdefault(slot, asyncio.Lock()):
            if held is not None:
                if held.gone:
                    return held.revision
                last = held.revision
            return await put_kv(self.js, LEASES_BUCKET, lease_key(slot[1], slot[0]), holder, last=last,
                                ttl=ttl, timeout=timeout)

    async def delete(self, slot: Slot, held: _Held) -> None:
        async with self.locks.setdefault(slot, asyncio.Lock()):
            held.gone = True
            await (await self.bucket(LEASES_BUCKET)).delete(lease_key(slot[1], slot[0]), last=held.revision)

    async def heartbeat(self, host_id: str, beat: bytes, ttl: float, timeout: float) -> None:
        await put_kv(self.js, HOSTS_BUCKET, host_id, beat, ttl=ttl, timeout=timeout)

    async def remove_beat(self, host_id: str) -> None:
        await (await self.bucket(HOSTS_BUCKET)).delete(host_id)

    async def entries(self, name: str, deleted: bool) -> dict[str, Any]:
        return await kv_entries(await self.bucket(name), deleted=deleted)


@dataclass
class LeaseView:
    """One read of both buckets: slot -> holder (None: free) with its revision, and the live hosts."""

    holders: dict[Slot, tuple[str | None, int]] = field(default_factory=dict)
    hosts: dict[str, HostBeat] = field(default_factory=dict)


class Leases:
    """The lease loop of one host (see the module docstring)."""

    def __init__(self, js: JetStreamContext, host_id: str, partitions: int, *, bundles: list[str],
                 on_gain: Callable[[Slot], Awaitable[None]], on_loss: Callable[[Slot, str], Awaitable[None]],
                 beat: Callable[[], HostBeat], config: LeaseConfig | None = None) -> None:
        self.js, self.host_id, self.total = js, host_id, partitions
        self.bundles = sorted(set(bundles))
        self.config = config or LeaseConfig()
        self.on_gain, self.on_loss, self.beat = on_gain, on_loss, beat
        self.held: dict[Slot, _Held] = {}
        self.share: dict[str, int] = dict.fromkeys(self.bundles, partitions)  # bundle -> its fair share
        self.settled = anyio.Event()  # the first shares are held (or could not be had within TTL + renew)
        self.ticks = 0
        self.alive = time.monotonic()  # the host loop's last sign of life (the renewer's wedge guard)
        self._started = time.monotonic()
        self._ios: dict[int, _LeaseIO] = {}  # one per connection: the host's, the lease thread's
        self._renewer: LeaseRenewer | None = None
        self._beat_bytes: bytes | None = None
        self._wake = anyio.Event()
        self._watching = False  # the watches below run: a tick may skip its look when nothing changed
        self._dirty = True  # something a look would see changed (a lease freed, a host came or went)
        self._looked = -math.inf  # monotonic time of the last look at both buckets
        self._hosts_seen: set[str] = set()  # the live hosts the last look found
        self.clock = ClockRate(host_id)  # this host's clock against the server's (`runtime.host.clock`)

    @property
    def serving(self) -> list[Slot]:
        return sorted(slot for slot, h in self.held.items() if h.serving)

    def valid(self, slot: Slot) -> bool:
        """Whether this host may act for `slot` now: it serves it and a renewal succeeded less than
        `fence_after` ago (`ClockRate.since`), asked at the moment of acting. A host paused past its lease
        (SIGSTOP, a frozen VM) finds its monotonic clock jumped on waking and says no at once, before
        `_fence_watch` has run; whatever still slips through is refused by the log's fence."""
        held = self.held.get(slot)
        return held is not None and held.serving and not held.lost and not held.releasing \
            and self.clock.since(held.renewed) < self.config.fence_after

    def revision(self, slot: Slot) -> int:
        """The revision of this host's lease on `slot` (0 if it holds none): recorded in `run.taken`."""
        held = self.held.get(slot)
        return held.revision if held is not None else 0

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
        """Tick until `stop`, then hand every slot back (awaiting `on_loss` first)."""
        if self.config.thread:
            await self._start_renewer()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._fence_watch, stop)
                tg.start_soon(self._watch_releases)
                tg.start_soon(self._watch_hosts)
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

        async def renew(slot: Slot, held: _Held) -> None:
            sent = self.clock.now()  # jumps of the clock counted (`ClockRate.now`)
            try:
                rev = await io.put(slot, holder, held, 0, cfg.ttl, cfg.every)
            except KeyWrongLastSequenceError:
                held.lost = True  # the host's `_fence_watch` stops serving it
                return
            except Exception as e:
                log.debug("renewing %s failed: %s", _name(slot), e)
                return
            if not held.gone:
                held.revision, held.renewed = rev, sent

        jobs = [renew(slot, h) for slot, h in list(self.held.items()) if not h.gone]
        if self._beat_bytes is not None:
            jobs.append(io.heartbeat(self.host_id, self._beat_bytes, cfg.ttl, cfg.every))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.debug("heartbeat failed: %s", result)
        if self._beat_bytes is not None and not isinstance(results[-1], Exception):
            rate = await self.clock.sample(js)  # the heartbeat just stored: its server time is now
            if self._renewer is not None:  # renew on time by the server's clock
                self._renewer.every = self.config.every * min(1.0, rate)

    async def tick(self) -> None:
        self.ticks += 1
        before = self.serving
        self._beat_bytes = self.beat().encode()  # the lease thread sends the latest every round
        if self._renewer is None:  # no lease thread: heartbeat and renew here
            await self._heartbeat()
            async with anyio.create_task_group() as tg:
                for slot in list(self.held):
                    tg.start_soon(self._renew, slot)
        if not self._must_look():
            return
        self._dirty, self._looked = False, time.monotonic()
        view = await self.read()
        self._hosts_seen = set(view.hosts)
        full = True
        for bundle in self.bundles:  # each bundle is shared only by the live hosts that serve it
            live = {h for h, beat in view.hosts.items() if bundle in beat.agents} | {self.host_id}
            share = self.share[bundle] = math.ceil(self.total / len(live))
            mine = sorted((slot for slot in self.held if slot[0] == bundle),
                          key=lambda slot: preference(self.host_id, slot))
            for slot in mine[:max(0, len(mine) - share)]:  # the least preferred first
                await self.release(slot, "rebalanced")
            want = share - min(len(mine), share)
            if want > 0:
                free = [slot for slot, (holder, _) in view.holders.items()
                        if slot[0] == bundle and holder is None and slot not in self.held]
                free.sort(key=lambda slot: preference(self.host_id, slot), reverse=True)
                for slot in free[:want]:
                    await self._acquire(slot, view.holders[slot][1])
            full = full and sum(slot[0] == bundle for slot in self.held) >= min(share, self.total)
        if self.serving != before:
            await self._heartbeat()  # others and `sa status` see the new set now, not a tick later
        waited = time.monotonic() - self._started
        if full or waited >= self.config.ttl + self.config.every:
            self.settled.set()
        if not full:
            self._dirty = True  # short of its share: look again next tick

    def _must_look(self) -> bool:
        """Whether this tick reads both buckets (an ephemeral consumer each): only when a watch saw a lease
        freed or a host come or go, what changes the shares, or every `LOOK_EVERY_S` as a safety net; an
        idle host that looked twice a second spent most of its CPU finding nothing new. Without the
        watches (a test stepping `tick` by hand) every tick looks."""
        return not self._watching or self._dirty or time.monotonic() - self._looked >= LOOK_EVERY_S

    async def read(self) -> LeaseView:
        """Both buckets, as they are now (the slots of the bundles this host serves)."""
        view = LeaseView(holders={(b, p): (None, 0) for b in self.bundles for p in range(self.total)})
        for key, entry in (await self._io("entries", LEASES_BUCKET, True)).items():
            slot = parse_lease_key(key)
            if slot is None or slot not in view.holders:
                continue
            holder = entry.value.decode() if entry.operation is None and entry.value else None
            view.holders[slot] = (holder, entry.revision or 0)
        for key, entry in (await self._io("entries", HOSTS_BUCKET, False)).items():
            try:
                view.hosts[key] = HostBeat.decode(entry.value)
            except Exception as e:
                log.debug("unreadable heartbeat of %s: %s", key, e)
        return view

    async def _watch_releases(self) -> None:
        """Wake the loop as soon as a lease is deleted or expires (its marker), instead of at the next
        tick: a dead host's slots are taken the moment the server drops its leases."""
        while True:
            try:
                kv = await fleet_kv(self.js, LEASES_BUCKET)
                watcher = await kv.watchall(include_history=False)
                try:
                    self._watching = True
                    async for entry in watcher:
                        if entry is not None and entry.operation is not None and \
                                (parse_lease_key(entry.key) or ("", 0))[0] in self.bundles:
                            self._dirty = True
                            self._wake.set()
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            except Exception as e:  # the tick still runs every period: this only makes it sooner
                log.debug("watching the leases bucket: %s", e)
            await anyio.sleep(self.config.every)

    async def _watch_hosts(self) -> None:
        """Mark the shares dirty when a host appears that the last look did not count, or one goes: the
        fair share of every bundle it serves changes (headers only: the heartbeats arrive every renewal
        period from every host, and only their keys matter here)."""
        while True:
            try:
                kv = await fleet_kv(self.js, HOSTS_BUCKET)
                watcher = await kv.watchall(include_history=False, meta_only=True)
                try:
                    async for entry in watcher:
                        if entry is None or entry.key == self.host_id:
                            continue
                        if (entry.operation is None) != (entry.key in self._hosts_seen):
                            self._dirty = True
                            self._wake.set()
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            except Exception as e:  # the safety-net look still runs every LOOK_EVERY_S
                log.debug("watching the hosts bucket: %s", e)
            await anyio.sleep(self.config.every)

    # -- one lease ---------------------------------------------------------------------------------------

    async def _acquire(self, slot: Slot, revision: int) -> None:
        sent = self.clock.now()
        try:
            rev = await self._io("put", slot, self.host_id.encode(), None, revision, self.config.ttl,
                                 self.config.every)
        except KeyWrongLastSequenceError:
            return  # another host was quicker
        except Exception as e:
            log.debug("acquiring %s failed: %s", _name(slot), e)
            return
        self.held[slot] = _Held(rev, sent)
        log.info("host %s: acquired %s", self.host_id, _name(slot))
        await self.on_gain(slot)

    async def _renew(self, slot: Slot) -> None:
        """Renew one lease from the host's loop (without a lease thread) and act on the answer."""
        held = self.held.get(slot)
        if held is None:
            return
        sent = self.clock.now()
        try:
            rev = await self._io("put", slot, self.host_id.encode(), held, 0, self.config.ttl,
                                 self.config.every)
        except KeyWrongLastSequenceError:  # expired (and maybe taken): it is not ours any more
            held.lost = True
            await self._settle(slot, held)
            return
        except Exception as e:  # NATS trouble: `_fence_watch` stops serving before the lease can expire
            log.debug("renewing %s failed: %s", _name(slot), e)
            return
        if self.held.get(slot) is not held:
            return
        held.revision, held.renewed = rev, sent
        await self._settle(slot, held)

    async def _settle(self, slot: Slot, held: _Held) -> None:
        """Act on what renewals found: a lost lease stops being served; a fenced one renewed again is
        served again."""
        if self.held.get(slot) is not held or held.releasing:
            return
        if held.lost:
            del self.held[slot]
            log.warning("host %s: lost %s (its lease expired or was taken)", self.host_id, _name(slot))
            if held.serving:
                held.serving = False
                await self.on_loss(slot, "lost")
        elif not held.serving and self.clock.since(held.renewed) < self.config.fence_after:
            held.serving = True  # fenced while NATS was away, but the lease never expired: serve again
            log.info("host %s: %s renewed after a fence; serving it again", self.host_id, _name(slot))
            await self.on_gain(slot)

    async def release(self, slot: Slot, why: str) -> None:
        """Stop serving `slot` (awaiting `on_loss`; renewals go on meanwhile), then free its lease."""
        held = self.held.get(slot)
        if held is None or held.releasing:
            return
        held.releasing = True
        if held.serving:
            held.serving = False
            await self.on_loss(slot, why)
        if self.held.get(slot) is held:
            del self.held[slot]
        try:
            await self._io("delete", slot, held)
            log.info("host %s: released %s (%s)", self.host_id, _name(slot), why)
        except Exception as e:  # it expires by itself
            log.debug("releasing %s failed (%s); it expires after its TTL", _name(slot), e)

    async def release_all(self) -> None:
        for slot in list(self.held):
            await self.release(slot, "stopping")
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
        """Stop serving any slot whose lease could expire soon (renewals failing), act on what the
        lease thread found, and show the lease thread this loop lives."""
        while not stop.is_set():
            self.alive = time.monotonic()
            for slot, held in list(self.held.items()):
                if held.releasing:
                    continue
                age = self.clock.since(held.renewed)
                if held.serving and not held.lost and age > self.config.fence_after:
                    held.serving = False
                    log.warning("host %s: %s not renewed for %.1f s: fenced (not serving it)",
                                self.host_id, _name(slot), age)
                    await self.on_loss(slot, "fenced")
                elif self._renewer is not None:
                    await self._settle(slot, held)
            await anyio.sleep(0.1)


async def _first(*waits: Callable[[], Awaitable[Any]]) -> None:
    """Return when the first of `waits` returns."""
    async with anyio.create_task_group() as tg:
        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tg.cancel_scope.cancel()
        for w in waits:
            tg.start_soon(one, w)


def _name(slot: Slot) -> str:
    """How logs name a slot: ``partition 3 of adder``."""
    return f"partition {slot[1]} of {slot[0]}"


__all__ = ["DEFAULT_TTL_S", "LeaseConfig", "LeaseView", "Leases", "Slot", "new_host_id",
           "preference"]
