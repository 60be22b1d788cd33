"""A model server's capacity: it admits so many chat-completions requests at once and answers 429 with
`Retry-After` beyond that, as vLLM behind a gateway (or any hosted API) does when it is full.

    capacity = Capacity(32, retry_after=1.0)
    with ScriptedModelServer(responder=..., capacity=capacity) as server:
        ...
    assert capacity.peak <= 32 and capacity.refused == 0   # the fleet-wide limit held

A request is counted in flight from its arrival until its answer starts (a stream's, until its last chunk):
a client that has read an answer may send its next request at once, so counting it out any later would
see the two overlap. `peak` counts refused requests too: it is the most the server ever had at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Capacity"]


class Capacity:
    """Admits `limit` requests in flight; beyond that, 429 with `Retry-After: retry_after` (see above)."""

    def __init__(self, limit: int, *, retry_after: float = 1.0) -> None:
        self.limit, self.retry_after = limit, retry_after
        self.in_flight = self.peak = self.admitted = self.refused = 0
        self._lock = threading.Lock()

    def enter(self) -> tuple[str | None, Callable[[], None]]:
        """Count a request in: (None, or why it is refused; what counts it out)."""
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            refused = self.in_flight > self.limit
            if refused:
                self.refused += 1
            else:
                self.admitted += 1

        def leave() -> None:
            with self._lock:
                self.in_flight -= 1

        return (f"the server admits {self.limit} requests at once" if refused else None), leave
