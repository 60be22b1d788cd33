"""The model endpoint's fleet-wide share: its permits and token counts in NATS, shared by every host.

A bundle's `endpoint:` section (`runtime.model.limits.EndpointLimits`) bounds the requests in flight to its
model endpoint (base URL + model name) across the whole fleet, not per process. Why JetStream messages as
permits, and not a KV semaphore: the server then is the endpoint's queue. It keeps the waiting requests in
order and serves the most urgent first, a dead host's permits come back by themselves, and a permit costs
one message each way, with no polling and no retry storm when one frees up.

* **Permits.** Stream ``PERMITS`` holds exactly `max_in_flight` messages per endpoint,
  ``permits.<endpoint>.<i>`` (one per subject; creating one that exists is refused, so hosts starting
  together make each once). One durable consumer per endpoint (the endpoint's key: `endpoint_key`) with
  explicit acks, `max_ack_pending` = the limit, and the `prioritized` priority policy.
* **Acquire.** A host sends one pull request (batch 1) per call waiting in its `FairQueue`, at the call's
  priority (NATS serves priority 0 first: ours, 9 most urgent, is sent as ``9 - priority``). The server
  answers the oldest pull of the most urgent priority with a free permit; the host gives the permit to its
  own best waiter (`Gate.grant`: priority first, then round robin across actors), which need not be the
  one that asked: pulls are anonymous demand. A permit nobody waits for any more is given back at once.
* **Hold, release.** Held: ``+WPI`` every third of the lease keeps it. Released: ``-NAK``, and the server
  redelivers it to the next pull in line, on whichever host. A host that dies holding permits stops
  renewing them: each comes back when its lease (the consumer's AckWait, `HostConfig.permit_lease`) passes.
  Two cautions. NATS applies an ack to the message, not to one delivery of it, so a late nak from a holder
  whose lease lapsed (its host stalled longer than the lease) would free the permit under its next holder
  too: a permit not renewed for most of its lease is never nakked, it comes back by itself. And a request
  given up on while in flight (a cancel, a deadline, a run handed to another host) may still run at the
  server: its permit goes back `ABANDONED_HOLD_S` later.
* **Lost pulls.** A pull lives `PULL_EXPIRES_S`; its expiry answer (408) is counted and the pull re-sent
  while the call still waits. A pull the server lost (a restart, a leader change) is forgotten after its
  expiry plus a grace, and re-sent.

What it costs: one pull, one delivered permit and one nak per HTTP attempt, about 0.2 ms of round trip on
loopback (`bench/fairness.py` measures it beside a call with no limit, which pays nothing: the client's
`limiter` is None). What it does not do: a host cut off from NATS but still calling the model keeps its
permits' calls going after their leases lapse, so the endpoint may briefly see more than the limit.

* **Token windows** (`FleetTokens`): tokens per minute of an endpoint and per day of an agent, counted in the
  ``budgets`` KV bucket (one key per window, a TTL of a few windows). A host adds what its replies counted
  locally and writes the sums every `FLUSH_S` (compare-and-set), reading back the keys it is checking, so
  the fleet's count is seen within about that long.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from runtime.events import MAX_PRIORITY, MIN_PRIORITY
from runtime.model.limits import DailyBudget, EndpointLimits, Gate, LocalGate, Waiter, endpoint_key
from runtime.nats.kv import fleet_kv, put_kv

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from runtime.host.served import AgentRuntime
    from runtime.model.client import ModelClient

log = logging.getLogger("runtime.host")

PERMITS = "PERMITS"
BUDGETS_BUCKET = "budgets"
GROUP = "sa"  # the consumers' priority group
PULL_EXPIRES_S = 20.0
LOST_GRACE_S = 5.0
DEFAULT_LEASE_S = 15.0
MAX_WAITING = 100_000  # pull requests a permits consumer keeps waiting (one per waiting call, fleet-wide)
FLUSH_S = 0.25
STALE_SHARE = 0.8  # a permit not renewed for this share of its lease is never nakked (see _give_back)
_API = "$JS.API"


class FleetGate(Gate):
    """The endpoint's permits as the fleet shares them (see the module docstring)."""

    def __init__(self, nc: NATS, key: str, limit: int, *, label: str = "", lease_s: float = DEFAULT_LEASE_S,
                 replicas: int = 1, **options: Any) -> None:
        super().__init__(key=key, **options)
        self.nc, self.limit, self.label = nc, limit, label or key
        self.lease_s, self.replicas = lease_s, replicas
        self.inbox = nc.new_inbox()
        self._issued: dict[int, deque[float]] = {}  # priority -> when each pull still out was sent
        self._holding: dict[str, float] = {}  # the ack subjects of the permits held here -> last renewed
        self._out: list[tuple[str, bytes]] = []  # naks and renewals to send (from sync code)
        self._wake = anyio.Event()
        self._subs: list[Any] = []
        self._closed = False

    # -- opening: the stream, this endpoint's permits, its consumer ---------------------------------------

    async def open(self) -> None:
        await _api(self.nc, f"STREAM.CREATE.{PERMITS}", {
            "name": PERMITS, "subjects": [f"{PERMITS.lower()}.>"], "retention": "limits", "storage": "file",
            "max_msgs_per_subject": 1, "discard": "new", "discard_new_per_subject": True,
            "num_replicas": self.replicas}, exists_ok=True)
        await self._permits()
        await _api(self.nc, f"CONSUMER.CREATE.{PERMITS}.{self.key}", {"stream_name": PERMITS, "config": {
            "durable_name": self.key, "filter_subject": f"{PERMITS.lower()}.{self.key}.>",
            "description": f"permits of {self.label}", "ack_policy": "explicit", "deliver_policy": "all",
            "ack_wait": int(self.lease_s * 1e9), "max_deliver": -1, "max_ack_pending": self.limit,
            "max_waiting": MAX_WAITING, "priority_groups": [GROUP], "priority_policy": "prioritized"}})
        for priority in range(MIN_PRIORITY, MAX_PRIORITY + 1):  # a delivered permit keeps its own subject:
            self._subs.append(await self.nc.subscribe(  # the inbox it came to says which pull it answers
                f"{self.inbox}.{priority}", cb=functools.partial(self._answered, priority)))

    async def _permits(self) -> None:
        """Exactly `limit` permits: the missing ones made, any beyond the limit (a lower limit than the
        last host's) removed."""
        prefix = f"{PERMITS.lower()}.{self.key}"
        reply = await _api(self.nc, f"STREAM.INFO.{PERMITS}", {"subjects_filter": f"{prefix}.>"})
        have = {int(s.rsplit(".", 1)[1]) for s in (reply.get("state", {}).get("subjects") or {})}
        body = json.dumps({"endpoint": self.label}).encode()
        for i in sorted(set(range(self.limit)) - have):
            await self.nc.request(f"{prefix}.{i}", body, timeout=5.0)  # refused if it exists: made once
        for i in sorted(i for i in have if i >= self.limit):
            await _api(self.nc, f"STREAM.PURGE.{PERMITS}", {"filter": f"{prefix}.{i}"})
        if have and len(have) != self.limit:
            log.warning("endpoint %s: its limit was %d requests in flight, now %d", self.label, len(have),
                        self.limit)

    # -- the gate's side ------------------------------------------------------------------------------------

    def _try_take(self) -> Any:
        return None  # every permit is the server's to give: that is what keeps the fleet's order

    async def _joined(self, waiter: Waiter) -> None:
        await self._top_up(waiter.priority)

    def _left(self, waiter: Waiter) -> None:
        pass  # its pull may still bring a permit: it goes to the next waiter, or back

    def grant(self, permit: Any) -> bool:
        given = super().grant(permit)
        if given:
            self._holding[permit] = time.monotonic()
        return given

    def _give_back(self, permit: Any) -> None:
        if self._may_nak(permit):
            self._send(permit, b"-NAK")

    async def _hand_back(self, permit: Any) -> None:
        if self._may_nak(permit):
            await self.nc.publish(permit, b"-NAK")  # at once: the next in line is waiting for it

    def _may_nak(self, permit: Any) -> bool:
        if self._closed:  # `close` gave back every permit held: a second nak would free one under its next
            return False  # holder
        renewed = self._holding.pop(permit, None)
        if renewed is not None and time.monotonic() - renewed > self.lease_s * STALE_SHARE:
            # its lease may have lapsed and the server given it to another: a nak now would take it from
            # that holder too (NATS acks by stream sequence, not by delivery), so it comes back by lease
            held = time.monotonic() - renewed
            log.warning("endpoint %s: a permit was held %.1f s since it was last renewed (the lease is %g "
                        "s): left to come back by itself", self.label, held, self.lease_s)
            return False
        return True

    async def _top_up(self, priority: int) -> None:
        """One pull out per call waiting at `priority` (sent at once: a call is waiting for it)."""
        issued = self._issued.setdefault(priority, deque())
        body = json.dumps({"batch": 1, "expires": int(PULL_EXPIRES_S * 1e9), "group": GROUP,
                           "priority": MAX_PRIORITY - priority}).encode()
        subject = f"{_API}.CONSUMER.MSG.NEXT.{PERMITS}.{self.key}"
        while len(issued) < self.queue.waiting(priority):
            issued.append(time.monotonic())  # counted before the send: a top-up running meanwhile sees it
            await self.nc.publish(subject, body, reply=f"{self.inbox}.{priority}")

    def _send(self, subject: str, data: bytes) -> None:
        """Queue a nak or a renewal for the sender (from code that cannot wait for a publish)."""
        self._out.append((subject, data))
        self._wake.set()

    async def _answered(self, priority: int, msg: Msg) -> None:
        """A pull's answer: a permit, or the pull's end (expired, or refused)."""
        issued = self._issued.get(priority)
        if issued:
            issued.popleft()
        status = (msg.headers or {}).get("Status")
        if status is None and msg.reply:
            self.grant(msg.reply)
        elif status not in ("408", "100"):
            log.warning("endpoint %s: a permit request was refused (%s %s)", self.label, status,
                        (msg.headers or {}).get("Description", ""))
            await anyio.sleep(0.5)  # not in a tight loop
        await self._top_up(priority)

    # -- what runs beside it --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Send what is queued, renew the permits held, forget lost pulls; until cancelled (then the held
        permits are given back)."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sender)
                while True:
                    await anyio.sleep(self.lease_s / 3)
                    now = time.monotonic()
                    for permit in list(self._holding):
                        self._holding[permit] = now
                        self._send(permit, b"+WPI")
                    await self._forget_lost()
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            out, self._out = self._out, []
            for subject, data in out:
                await self.nc.publish(subject, data)

    async def _forget_lost(self) -> None:
        horizon = time.monotonic() - PULL_EXPIRES_S - LOST_GRACE_S
        for priority, issued in list(self._issued.items()):
            lost = 0
            while issued and issued[0] < horizon:
                issued.popleft()
                lost += 1
            if lost:
                log.info("endpoint %s: %d permit request(s) unanswered, sent again", self.label, lost)
                await self._top_up(priority)

    async def close(self) -> None:
        """Give back every permit held here (the runs using them are being stopped)."""
        self._closed = True
        for permit in list(self._holding):
            try:
                await self.nc.publish(permit, b"-NAK")
            except Exception:  # the connection is gone: the leases bring them back
                break
        self._holding.clear()
        subs, self._subs = self._subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is gone
                break


class FleetTokens:
    """Token windows counted across the fleet in the ``budgets`` bucket (see the module docstring)."""

    def __init__(self, js: JetStreamContext, *, flush_s: float = FLUSH_S) -> None:
        self.js, self.flush_s = js, flush_s
        self._known: dict[str, int] = {}  # the fleet's count when last read or written
        self._pending: dict[str, int] = {}  # counted here, not yet written
        self._ttl: dict[str, float] = {}
        self._watched: dict[str, float] = {}  # key -> when it was last checked (read back while checked)
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        self._kv = await fleet_kv(self.js, BUDGETS_BUCKET)

    def used(self, key: str) -> int:
        self._watched[key] = time.monotonic()
        return self._known.get(key, 0) + self._pending.get(key, 0)

    def add(self, key: str, tokens: int, *, ttl: float) -> None:
        self._pending[key] = self._pending.get(key, 0) + tokens
        self._ttl[key] = ttl

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.flush_s)
            try:
                await self.flush()
            except Exception as e:  # NATS unavailable: counted here, written next time
                log.warning("token counts not written (%s); trying again", e)

    async def flush(self) -> None:
        """Write what was counted here; read back the keys checked in the last two minutes."""
        for key in list(self._pending):
            if self._pending[key]:
                await self._write(key)
        now = time.monotonic()
        for key, seen in list(self._watched.items()):
            if now - seen > 120.0:
                del self._watched[key]
            elif not self._pending.get(key):
                self._known[key] = (await self._read(key))[0]

    async def _read(self, key: str) -> tuple[int, int]:
        assert self._kv is not None
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return 0, 0
        return int(entry.value or b"0"), entry.revision or 0

    async def _write(self, key: str) -> None:
        adding = self._pending[key]
        while True:
            count, revision = await self._read(key)
            try:
                await put_kv(self.js, BUDGETS_BUCKET, key, str(count + adding).encode(), last=revision,
                             ttl=self._ttl.get(key))
            except KeyWrongLastSequenceError:
                continue  # another host wrote it meanwhile: add to its count
            break
        self._pending[key] -= adding
        self._known[key] = count + adding


class Endpoints:
    """A host's gates (one per endpoint its bundles limit) and token counts: `attach` gives each agent's
    model client its endpoint's gate and retry settings and each agent its daily budget; `run` keeps
    them going while the host serves."""

    def __init__(self, nc: NATS, js: JetStreamContext, *, lease_s: float = DEFAULT_LEASE_S,
                 replicas: int = 1) -> None:
        self.nc, self.js, self.lease_s, self.replicas = nc, js, lease_s, replicas
        self.gates: dict[str, Gate] = {}
        self.tokens: FleetTokens | None = None

    async def attach(self, agents: Iterable[AgentRuntime]) -> None:
        agents = list(agents)
        wanted: dict[str, EndpointLimits] = {}
        for agent in agents:
            limits = agent.bundle.endpoint
            if limits is None:
                continue
            agent.client.retry.retry_after_max = limits.retry_after_max
            agent.client.retry.throttle_retries = limits.throttle_retries
            if limits.limited:
                key = client_key(agent.client)
                wanted[key] = _stricter(wanted.get(key), limits, key)
        for key, limits in wanted.items():
            self.gates[key] = await self._gate(key, limits, agents)
        for agent in agents:  # every client of a limited endpoint goes through its gate, limits or not
            gate = self.gates.get(client_key(agent.client))
            if gate is not None:
                agent.client.limiter = gate
            per_day = agent.bundle.budgets.agent_tokens_per_day
            if per_day is not None:
                agent.budget = DailyBudget(agent.name, per_day, await self._tokens(),
                                           wait=agent.bundle.budgets.on_exceeded == "wait")

    async def _gate(self, key: str, limits: EndpointLimits, agents: list[AgentRuntime]) -> Gate:
        tokens = await self._tokens() if limits.tokens_per_minute is not None else None
        client = next(a.client for a in agents if client_key(a.client) == key)
        label = f"{client.base_url} ({client.model or 'its first model'})"
        if limits.max_in_flight is None:  # tokens per minute only: no permits to share
            return LocalGate(10**9, key=key, tokens_per_minute=limits.tokens_per_minute, tokens=tokens)
        gate = FleetGate(self.nc, key, limits.max_in_flight, label=label, lease_s=self.lease_s,
                         replicas=self.replicas, tokens_per_minute=limits.tokens_per_minute, tokens=tokens)
        await gate.open()
        log.info("endpoint %s: at most %d requests in flight across the fleet", label, limits.max_in_flight)
        return gate

    async def _tokens(self) -> FleetTokens:
        if self.tokens is None:
            self.tokens = FleetTokens(self.js)
            await self.tokens.open()
        return self.tokens

    async def run(self) -> None:
        """Keep the gates and the token counts going until cancelled."""
        async with anyio.create_task_group() as tg:
            for gate in self.gates.values():
                if isinstance(gate, FleetGate):
                    tg.start_soon(gate.run)
            if self.tokens is not None:
                tg.start_soon(self.tokens.run)


def client_key(client: ModelClient) -> str:
    return endpoint_key(client.base_url, client.model)


def _stricter(old: EndpointLimits | None, new: EndpointLimits, key: str) -> EndpointLimits:
    """Two bundles limiting one endpoint differently: the lower of each limit."""
    if old is None or old == new:
        return new
    log.warning("endpoint %s: bundles set different limits (%s, %s); the lower of each applies", key, old,
                new)

    def low(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else min(a, b)

    return EndpointLimits(low(old.max_in_flight, new.max_in_flight),
                          low(old.tokens_per_minute, new.tokens_per_minute),
                          min(old.retry_after_max, new.retry_after_max),
                          min(old.throttle_retries, new.throttle_retries))


async def _api(nc: NATS, what: str, body: dict[str, Any], *, exists_ok: bool = False) -> dict[str, Any]:
    """One JetStream API request; its answer, or an error saying what failed."""
    reply = json.loads((await nc.request(f"{_API}.{what}", json.dumps(body).encode(), timeout=5.0)).data)
    error = reply.get("error")
    if error and not (exists_ok and error.get("err_code") == 10058):  # stream name already in use
        raise RuntimeError(f"JetStream {what}: {error.get('description')} ({error.get('err_code')})")
    return reply


__all__ = ["BUDGETS_BUCKET", "DEFAULT_LEASE_S", "PERMITS", "Endpoints", "FleetGate", "FleetTokens",
           "client_key"]
