"""How fast this host's clock runs against the NATS server's: what a lease's age is judged on.

Every lease bound (`runtime.host.leases`) is measured on the host's monotonic clock. A pause makes that
clock jump (so `Leases.valid` says no at once after SIGCONT), but a clock can also run slow (a VM starved
of ticks, libfaketime): measured on it, a lease looks younger than it is, and a host whose lease the server
already expired would keep acting. The server's clock is the one that expires the keys, so each renewal
round reads back the server's timestamp of the host's heartbeat just stored (one read on the lease thread,
none on the hot path) and `ClockRate` compares how far the two clocks moved over the last rounds: host
seconds per server second. A host clock found below `SLOW_CLOCK` of the server's has its elapsed times
divided by that rate (`since`), its renewals made that much more often, and the host says so once.

A clock can also jump (libfaketime's offset changed, a VM restored from a snapshot). Forward is harmless: a
lease looks older than it is, the host stops acting until its next renewal. Backward is not: the host's
timers (renewals among them) wait out the jump while its network work goes on, and a lease renewed just
before it looked younger by the whole jump, so a host whose lease the server had expired kept appending
and fenced the new owner's runs back (tried: 4 of 5 runs of tests/system/test_pauses.py's ``jump``). A
monotonic clock that reads less than it read before has jumped back, so `now` adds `JUMP_PENALTY_S`
from then on: every renewal time taken before the jump looks that old, no lease is valid until it is
renewed again (`Leases` takes its renewal times from `now`), and the rate is measured afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from nats.js import JetStreamContext

from runtime.nats.subjects import HOSTS_BUCKET

log = logging.getLogger("runtime.host")

SLOW_CLOCK = 0.9  # a host clock measured below this rate of the server's is corrected for
RATE_WINDOW_S = 3.0  # the rate is measured over at least this much of the server's time
JUMP_PENALTY_S = 86_400.0  # how far `ClockRate.now` moves ahead when the host's clock jumps back


class ClockRate:
    """This host's clock rate against the server's, measured from its heartbeats' server timestamps."""

    def __init__(self, host_id: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.host_id, self._monotonic = host_id, monotonic
        self.rate = 1.0  # host monotonic seconds per server second
        self._samples: deque[tuple[float, float]] = deque(maxlen=64)  # (host monotonic, server time)
        self._told = False
        self._offset = 0.0  # what `now` adds to the monotonic clock: JUMP_PENALTY_S per jump back
        self._high = monotonic()  # the latest reading of the monotonic clock seen
        self.jumps = 0  # how many times the clock was seen to jump back
        self._lock = threading.Lock()

    def now(self) -> float:
        """The host's monotonic clock, moved `JUMP_PENALTY_S` ahead at each jump back (module docstring):
        a time taken from here before a jump is that much in the past after it. Never decreases."""
        with self._lock:  # read and compared as one: the lease thread and the host's loop both ask
            raw = self._monotonic()
            back = self._high - raw
            if back > 0:
                self._offset += back + JUMP_PENALTY_S
                self.jumps += 1
                self._samples.clear()
                self.rate = 1.0
            self._high = raw
            now = raw + self._offset
        if back > 0:
            log.warning("host %s: its clock jumped %.1f s back; its leases count as unrenewed until they "
                        "are renewed again", self.host_id, back)
        return now

    def since(self, then: float) -> float:
        """Seconds since `then` (a time from `now`), on the server's clock when this host's runs slow."""
        return (self.now() - then) / min(1.0, self.rate)

    async def sample(self, js: JetStreamContext) -> float:
        """Read back the server's timestamp of this host's heartbeat (just stored) and update `rate`;
        the rate, or 1.0 while there are too few samples."""
        sent = self.now()
        try:
            msg = await js.get_last_msg(f"KV_{HOSTS_BUCKET}", f"$KV.{HOSTS_BUCKET}.{self.host_id}")
        except Exception as e:  # NATS trouble: measured at a later round
            log.debug("reading the heartbeat's time failed: %s", e)
            return self.rate
        if msg.time is None:
            return self.rate
        back = self.now()
        if back - sent > JUMP_PENALTY_S / 2:  # it jumped back in between: measured afresh from here
            return self.rate
        self._samples.append(((sent + back) / 2, msg.time.timestamp()))
        first, last = self._samples[0], self._samples[-1]
        if last[1] - first[1] < RATE_WINDOW_S:
            return self.rate
        self.rate = (last[0] - first[0]) / (last[1] - first[1])
        if self.rate < SLOW_CLOCK and not self._told:
            self._told = True
            log.warning("host %s: its clock runs at %.2fx the NATS server's; its leases are judged on the "
                        "server's clock", self.host_id, self.rate)
        return self.rate


__all__ = ["JUMP_PENALTY_S", "RATE_WINDOW_S", "SLOW_CLOCK", "ClockRate"]
