"""Sharing a scarce model endpoint: a fair queue in front of its permits, throttle waits, token budgets.

Many concurrent agents meet the model server first. What this module gives a model call, before each of its
HTTP attempts and after its reply:

- `Ticket`          who asks: the flow (the run's actor) and its task's priority (0..9, higher first)
- `FairQueue`       the waiting calls: strict priority, and within a priority round robin across flows, so
                    no agent's burst starves another agent's calls
- `Gate`            the queue in front of an endpoint's permits: `async with gate.slot(ticket)` around each
                    HTTP attempt (at most `limit` in flight), and the endpoint's tokens per minute; a permit
                    is given to the best waiting call, never to whoever happens to ask first
- `LocalGate`       a gate whose permits live in this process (`Agent` in process, tests); the fleet's gate,
                    whose permits every host shares through NATS, is `runtime.host.endpoint.FleetGate`
- `TokenWindows`    what counts tokens per window (a minute of an endpoint, a day of an agent); `LocalTokens`
                    counts in this process, `runtime.host.endpoint.FleetTokens` across the fleet
- `DailyBudget`     an agent's tokens per UTC day: `admit` before a call (fail with `BudgetExceeded`, or wait
                    for the next day), `spend` after its reply
- `Throttle`        one wait a call was held back for: a 429/503 with its `Retry-After`, or a budget; what
                    the runner records as `model.throttled`
- `EndpointLimits`, `Budgets`   the bundle's `endpoint:` and `budgets:` sections, resolved

With no limit configured none of this is on a call's path: the client checks one attribute (`limiter` is
None) and the step one more (no budget).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio

from runtime.events import DEFAULT_PRIORITY
from runtime.kernel import BUDGET_EXCEEDED
from runtime.nats.subjects import bundle_slug
from runtime.types import Usage

MINUTE_S = 60.0
DAY_S = 86_400.0
# A request given up on while in flight may still be running at the server (it notices the closed
# connection when it next looks): its permit is held this much longer before it goes back.
ABANDONED_HOLD_S = 2.0
RETRY_AFTER_MAX_S = 30.0  # a server's Retry-After is honoured up to this (the bundle's `retry_after_max`)
THROTTLE_RETRIES = 8  # 429/503 answers retried before a call fails (the bundle's `throttle_retries`)


@dataclass(frozen=True)
class Ticket:
    """Who a model call is for: its `flow` (the run's actor: one fair share each) and its `priority`."""

    flow: str = ""
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True)
class Throttle:
    """One wait before a call's next attempt (`model.throttled`): the server's `status` (429, 503) and its
    `Retry-After` in seconds (None without one), or `status` 0 and a budget named in `reason`."""

    wait_s: float
    status: int = 0
    retry_after: float | None = None
    attempt: int = 1
    reason: str = ""


OnThrottle = Callable[[Throttle], Awaitable[None] | None]


async def notify(callback: OnThrottle | None, throttle: Throttle) -> None:
    """Tell `callback` (sync or async, or None) about `throttle`."""
    if callback is not None:
        result = callback(throttle)
        if result is not None:
            await result


@dataclass(frozen=True)
class EndpointLimits:
    """The bundle's `endpoint:` section: how the fleet shares the model endpoint (its base URL and model).
    `max_in_flight` requests at once across every host; `tokens_per_minute` (prompt + completion) across
    every host; a 429/503's `Retry-After` honoured up to `retry_after_max` seconds, `throttle_retries`
    times."""

    max_in_flight: int | None = None
    tokens_per_minute: int | None = None
    retry_after_max: float = RETRY_AFTER_MAX_S
    throttle_retries: int = THROTTLE_RETRIES

    @property
    def limited(self) -> bool:
        """True when calls queue for this endpoint (a gate is needed), not only retried differently."""
        return self.max_in_flight is not None or self.tokens_per_minute is not None


@dataclass(frozen=True)
class Budgets:
    """The bundle's `budgets:` section: tokens per run (the kernel's), per agent per UTC day (the fleet's),
    and what a run does when the daily one is spent: fail `budget_exceeded`, or wait for the next day."""

    run_tokens: int | None = None
    agent_tokens_per_day: int | None = None
    on_exceeded: Literal["fail", "wait"] = "fail"


def endpoint_key(base_url: str, model: str | None) -> str:
    """One endpoint (a base URL and a model name) as a subject token and KV key: `ep-` and a hash."""
    digest = hashlib.blake2b(f"{base_url.rstrip('/')}\x00{model or ''}".encode(), digest_size=8).hexdigest()
    return f"ep-{digest}"


# ── the queue ────────────────────────────────────────────────────────────────────────────────────────────


class Waiter:
    """One call waiting for a permit (the gate sets `permit` and the event when it is its turn)."""

    __slots__ = ("event", "flow", "permit", "priority", "since")

    def __init__(self, ticket: Ticket) -> None:
        self.flow, self.priority = ticket.flow, ticket.priority
        self.event = anyio.Event()
        self.permit: Any = None
        self.since = time.monotonic()


class FairQueue:
    """Waiters by priority, highest first; within a priority one queue per flow, served round robin (each
    flow's oldest waiter in turn, a flow that was served goes to the back), so a flow with many calls
    waiting takes one turn in each round like a flow with one."""

    def __init__(self) -> None:
        self._levels: dict[int, OrderedDict[str, deque[Waiter]]] = {}
        self._counts: dict[int, int] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, waiter: Waiter) -> None:
        level = self._levels.setdefault(waiter.priority, OrderedDict())
        level.setdefault(waiter.flow, deque()).append(waiter)
        self._counted(waiter.priority, 1)

    def pop(self) -> Waiter | None:
        """The next waiter to serve, removed; None when nobody waits."""
        if not self._levels:
            return None
        priority = max(self._levels)
        level = self._levels[priority]
        flow, queue = next(iter(level.items()))
        waiter = queue.popleft()
        if queue:
            level.move_to_end(flow)
        else:
            del level[flow]
            if not level:
                del self._levels[priority]
        self._counted(priority, -1)
        return waiter

    def remove(self, waiter: Waiter) -> None:
        """Take out a waiter that gave up (cancelled, or its deadline passed)."""
        level = self._levels.get(waiter.priority)
        queue = level.get(waiter.flow) if level is not None else None
        if level is None or queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        self._counted(waiter.priority, -1)
        if not queue:
            del level[waiter.flow]
            if not level:
                del self._levels[waiter.priority]

    def waiting(self, priority: int) -> int:
        """How many wait at `priority`."""
        return self._counts.get(priority, 0)

    def _counted(self, priority: int, delta: int) -> None:
        self._size += delta
        left = self._counts.get(priority, 0) + delta
        if left:
            self._counts[priority] = left
        else:
            self._counts.pop(priority, None)


# ── token windows ────────────────────────────────────────────────────────────────────────────────────────


class TokenWindows(Protocol):
    """Tokens counted per window key (`tpm.<endpoint>.<minute>`, `day.<agent>.<day>`)."""

    def used(self, key: str) -> int: ...

    def add(self, key: str, tokens: int, *, ttl: float) -> None: ...


class LocalTokens:
    """Token windows counted in this process (an in-process `Agent`, tests)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def used(self, key: str) -> int:
        return self._counts.get(key, 0)

    def add(self, key: str, tokens: int, *, ttl: float) -> None:
        self._counts[key] = self._counts.get(key, 0) + tokens


def total(usage: Usage) -> int:
    return usage.prompt_tokens + usage.completion_tokens


# ── the gate ─────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class GateStats:
    """What a gate counts: permits granted, held now and at most, calls that waited and for how long."""

    granted: int = 0
    held: int = 0
    max_held: int = 0
    waited: int = 0
    wait_s: float = 0.0
    by_priority: dict[int, int] = field(default_factory=dict)  # grants per priority


class Gate:
    """A fair queue in front of an endpoint's permits (see the module docstring). Subclasses say where
    permits come from: `_try_take` (one at once, without waiting, or None), `_joined` (a waiter was queued:
    ask for a permit for it), `_left` (a waiter gave up before it got one), `_give_back` (a permit used or
    not needed; `_hand_back`, its async twin, where the caller can wait for the send). Whatever delivers a
    permit calls `grant`."""

    def __init__(self, *, key: str = "local", tokens_per_minute: int | None = None,
                 tokens: TokenWindows | None = None, clock: Callable[[], float] = time.time) -> None:
        self.key = key  # the endpoint's `endpoint_key`: its token windows are counted under it
        self.queue = FairQueue()
        self.stats = GateStats()
        self.tokens_per_minute = tokens_per_minute
        self.tokens = tokens if tokens is not None or tokens_per_minute is None else LocalTokens()
        self.clock = clock

    # -- what a call does ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, ticket: Ticket | None = None) -> AsyncIterator[None]:
        """Hold one of the endpoint's permits for one HTTP attempt (waiting for room in its tokens per minute
        first, then for the permit, in the queue's order)."""
        if self.tokens_per_minute is not None:
            await self._minute_room()
        permit = await self.acquire(ticket or Ticket())
        try:
            yield
        except anyio.get_cancelled_exc_class():  # the request was abandoned (a cancel, a deadline, a lost
            self.release(permit, after=ABANDONED_HOLD_S)  # partition): the server may still be working on it
            raise
        except BaseException:
            self.release(permit)
            raise
        self.stats.held -= 1
        with anyio.CancelScope(shield=True):  # once given back, it must reach the server
            await self._hand_back(permit)

    def spent(self, usage: Usage) -> None:
        """Count a reply's tokens against the endpoint's tokens per minute."""
        if self.tokens is not None and self.tokens_per_minute is not None:
            self.tokens.add(self._minute_key(self.clock()), total(usage), ttl=5 * MINUTE_S)

    async def acquire(self, ticket: Ticket) -> Any:
        """A permit for `ticket`, once it is its turn. Cancel-safe: a permit granted as the caller was
        cancelled goes back."""
        permit = self._try_take() if not self.queue else None
        if permit is not None:
            self._held(ticket.priority)
            return permit
        waiter = Waiter(ticket)
        self.queue.push(waiter)
        try:
            await self._joined(waiter)
            await waiter.event.wait()
        except BaseException:
            if waiter.permit is not None:
                self.release(waiter.permit)
            else:
                self.queue.remove(waiter)
                self._left(waiter)
            raise
        self.stats.waited += 1
        self.stats.wait_s += time.monotonic() - waiter.since
        return waiter.permit

    def release(self, permit: Any, *, after: float = 0.0) -> None:
        """Give a permit back, now or `after` seconds (still held meanwhile)."""
        if after > 0:
            asyncio.get_running_loop().call_later(after, self.release, permit)
            return
        self.stats.held -= 1
        self._give_back(permit)

    def grant(self, permit: Any) -> bool:
        """Give `permit` to the best waiter; False (and the permit goes back) when nobody waits."""
        waiter = self.queue.pop()
        if waiter is None:
            self._give_back(permit)
            return False
        self._held(waiter.priority)
        waiter.permit = permit
        waiter.event.set()
        return True

    def _held(self, priority: int) -> None:
        stats = self.stats
        stats.granted += 1
        stats.held += 1
        stats.max_held = max(stats.max_held, stats.held)
        stats.by_priority[priority] = stats.by_priority.get(priority, 0) + 1

    # -- tokens per minute -----------------------------------------------------------------------------------

    def _minute_key(self, now: float) -> str:
        return f"tpm.{self.key}.{int(now // MINUTE_S)}"

    async def _minute_room(self) -> None:
        """Wait while this minute's tokens are spent (until the next minute, with a little jitter so the
        waiting calls do not all start in the same millisecond)."""
        assert self.tokens is not None and self.tokens_per_minute is not None
        while self.tokens.used(self._minute_key(now := self.clock())) >= self.tokens_per_minute:
            await anyio.sleep(MINUTE_S - now % MINUTE_S + random.uniform(0.0, 0.25))

    # -- where permits come from ---------------------------------------------------------------------------

    def _try_take(self) -> Any:
        raise NotImplementedError

    async def _joined(self, waiter: Waiter) -> None:
        raise NotImplementedError

    def _left(self, waiter: Waiter) -> None:
        raise NotImplementedError

    def _give_back(self, permit: Any) -> None:
        raise NotImplementedError

    async def _hand_back(self, permit: Any) -> None:
        self._give_back(permit)


class LocalGate(Gate):
    """A gate over `limit` permits held in this process."""

    def __init__(self, limit: int, **options: Any) -> None:
        super().__init__(**options)
        if limit < 1:
            raise ValueError(f"a gate needs at least one permit, got {limit}")
        self.limit = limit
        self._free = limit

    def _try_take(self) -> Any:
        if self._free:
            self._free -= 1
            return True
        return None

    async def _joined(self, waiter: Waiter) -> None:
        if self._free:
            self._free -= 1
            self.grant(True)

    def _left(self, waiter: Waiter) -> None:
        pass

    def _give_back(self, permit: Any) -> None:
        if self.queue:
            self.grant(permit)  # someone waits: it is theirs
        else:
            self._free += 1


# ── budgets ──────────────────────────────────────────────────────────────────────────────────────────────


class BudgetExceeded(Exception):
    """A budget is spent and its bundle says fail: the message names the budget (what `model.failed` with
    kind `budget_exceeded` records, and the run's `run.failed` detail)."""

    kind = BUDGET_EXCEEDED


class DailyBudget:
    """An agent's tokens per UTC day, across the fleet (`tokens`: `runtime.host.endpoint.FleetTokens`, or
    `LocalTokens` in process). `admit` before a model call: room left, it returns at once; spent, it raises
    `BudgetExceeded` (`on_exceeded: fail`) or waits for the next day (`wait`: a `model.throttled` says so).
    `spend` counts a reply's tokens. The counts are shared within about a second: several hosts may
    together overshoot by what they spend in that second."""

    def __init__(self, agent: str, limit: int, tokens: TokenWindows, *, wait: bool = False,
                 window_s: float = DAY_S, clock: Callable[[], float] = time.time) -> None:
        self.agent, self.limit, self.tokens, self.wait = agent, limit, tokens, wait
        self.window_s, self.clock = window_s, clock
        self._slug = bundle_slug(agent)

    def key(self, now: float) -> str:
        return f"day.{self._slug}.{int(now // self.window_s)}"

    def used(self) -> int:
        return self.tokens.used(self.key(self.clock()))

    async def admit(self, on_throttle: OnThrottle | None = None) -> float:
        """Return once the budget has room (the seconds waited), or raise `BudgetExceeded`."""
        started, told = time.monotonic(), False
        while (used := self.used()) >= self.limit:
            per = "day" if self.window_s == DAY_S else f"{self.window_s:g} s"
            spent = f"agent {self.agent}'s token budget of {self.limit:,} per {per} is spent ({used:,} used)"
            if not self.wait:
                raise BudgetExceeded(f"{spent}; it renews at the start of the next {per} (UTC)")
            now = self.clock()
            left = self.window_s - now % self.window_s + random.uniform(0.0, 1.0)
            if not told:
                await notify(on_throttle, Throttle(wait_s=left, reason=f"agent_tokens_per_day: {spent}"))
                told = True
            await anyio.sleep(min(left, MINUTE_S))  # read again now and then: the count is the fleet's
        return time.monotonic() - started

    def spend(self, usage: Usage) -> None:
        self.tokens.add(self.key(self.clock()), total(usage), ttl=2 * self.window_s)


__all__ = ["ABANDONED_HOLD_S", "DAY_S", "MINUTE_S", "RETRY_AFTER_MAX_S", "THROTTLE_RETRIES", "BudgetExceeded",
           "Budgets", "DailyBudget", "EndpointLimits", "FairQueue", "Gate", "GateStats", "LocalGate",
           "LocalTokens", "OnThrottle", "Throttle", "Ticket", "TokenWindows", "Waiter", "endpoint_key",
           "notify", "total"]
