"""When `ModelClient` tries a failed request again, and after how long: its retry policy, and how a failure is
said.

* 4xx request errors (but 408, 409 and 429) are never retried: they would fail the same way again.
* 429 and 503 mean the server is full. The client waits what `Retry-After` asks (seconds or an HTTP date),
  up to `retry_after_max`, plus up to a fifth more as jitter so the refused calls do not all come back in
  the same millisecond; without the header, the exponential backoff. With `throttle_retries` set such
  answers have a count of their own (a busy server is not a broken one); otherwise they count among
  `max_retries`.
* Other 5xx, timeouts, connection errors and streams cut short: exponential backoff with jitter (a
  `Retry-After` wins when it asks for longer, up to `backoff_max`), `max_retries` times.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

import openai

from runtime.model.reply import BrokenStream, StreamCut, TooSlow

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
THROTTLE_STATUS = frozenset({429, 503})  # the server is full: wait as it asks (`Retry-After`), then retry


@dataclass
class RetryPolicy:
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 20.0
    retry_after_max: float = 30.0
    throttle_retries: int | None = None  # None: 429/503 count among max_retries

    def gives_up(self, status: int | None, attempt: int, throttled: int) -> bool:
        """After failed attempt number `attempt` (`throttled` of them 429/503): stop (an answer that would
        come again, or the retries are spent)?"""
        if status is not None and status not in RETRY_STATUS:
            return True
        if self.throttle_retries is None:
            return attempt > self.max_retries
        if status in THROTTLE_STATUS:
            return throttled > self.throttle_retries
        return attempt - throttled > self.max_retries

    def throttle_wait(self, exc: Exception, throttled: int) -> tuple[float, float | None]:
        """How long to wait after the `throttled`-th 429/503, and the server's `Retry-After` (None without
        one)."""
        asked = retry_after(_header(exc))
        base = asked if asked is not None else self.backoff_base * 2 ** (throttled - 1)
        return min(base, self.retry_after_max) * random.uniform(1.0, 1.2), asked

    def backoff(self, attempt: int, exc: Exception) -> float:
        """Exponential backoff with jitter; a server's Retry-After wins when it asks for longer."""
        delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        asked = retry_after(_header(exc))
        return max(delay, min(asked, self.backoff_max)) if asked is not None else delay


def _header(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    return response.headers.get("retry-after") if response is not None else None


def retry_after(header: str | None) -> float | None:
    """A `Retry-After` header in seconds (it is a number of seconds or an HTTP date), or None."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def describe(exc: Exception, base_url: str, attempts: int) -> str:
    """What went wrong with a request to `base_url`, after how many attempts (a `ModelError`'s message)."""
    tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}"
    if isinstance(exc, openai.APITimeoutError):
        return f"model request to {base_url} timed out{tries}"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the model server at {base_url}{tries}: {exc.__cause__ or exc}"
    if isinstance(exc, openai.APIStatusError):
        return f"model server answered HTTP {exc.status_code}{tries}: {exc.message}"
    if isinstance(exc, TooSlow):
        return f"model request to {base_url} timed out{tries}: {exc}"
    if isinstance(exc, BrokenStream):
        return f"the model server at {base_url} sent a streamed reply that cannot be read{tries}: {exc}"
    if isinstance(exc, StreamCut):
        return f"the model server at {base_url} cut its streamed reply short{tries}: {exc}"
    return f"model request failed{tries}: {exc}"


__all__ = ["RETRY_STATUS", "THROTTLE_STATUS", "RetryPolicy", "describe", "retry_after"]
