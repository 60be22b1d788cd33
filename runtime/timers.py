"""Durable timers a model can call, the pure half: `sleep(seconds)` and `wait_until(time)`.

A bundle that lists them (`timers: [sleep, wait_until]`) offers them to its model like any tool, but no
worker runs them. The kernel settles a timer call by itself: `timer.started` records when it is due (an
instant computed here from the call's arguments and the time of the latest event, so `sa replay --verify`
reproduces it), and the call waits, like a call waiting for its result, until `timer.fired` gives it one.
A runner parks a run whose only pending work is timers (the host: no driver, no memory, no slot held) and
the cluster wakes it at the instant (`runtime.schedules`, a scheduled message). Everything here is pure: the
clock reaches it only as an event's `ts`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from runtime.types import ToolCall, ToolError, ToolSchema

SLEEP = "sleep"
WAIT_UNTIL = "wait_until"
MAX_WAIT_S = 366 * 86_400.0  # a timer is due within a year (a longer wait is a schedule, not a run)

TIMER_TOOLS: dict[str, ToolSchema] = {
    SLEEP: ToolSchema(
        SLEEP,
        "Pause this task for a number of seconds, then continue. The wait is durable: it survives restarts "
        "and holds no resources. Returns when it woke.",
        {"type": "object", "properties": {"seconds": {"type": "number", "description": "how long to wait"}},
         "required": ["seconds"], "additionalProperties": False}),
    WAIT_UNTIL: ToolSchema(
        WAIT_UNTIL,
        "Pause this task until a moment in time, then continue. The wait is durable: it survives restarts "
        "and holds no resources. Returns when it woke.",
        {"type": "object",
         "properties": {"time": {"type": "string", "description": "ISO 8601 with a time zone, e.g. "
                                                                  "2030-01-01T09:00:00+01:00 or ...Z"}},
         "required": ["time"], "additionalProperties": False}),
}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ts: float) -> str:
    """A unix time as RFC 3339 in UTC (`2030-01-01T08:00:00.250Z`; whole seconds without a fraction),
    rounded to the millisecond. Pure: the time comes in as a number, no clock is read."""
    millis = round(ts * 1000)
    when = _EPOCH + timedelta(milliseconds=millis)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis % 1000:03d}Z" if millis % 1000 else f"{text}Z"


def parse_instant(text: str) -> float:
    """An ISO 8601 instant that names its time zone (`Z` or an offset) as a unix time; ValueError says why
    not. A time without a zone is refused: it would mean a different instant on every machine."""
    raw = text.strip()
    try:
        when = datetime.fromisoformat(raw[:-1] + "+00:00" if raw[-1:] in "zZ" and raw else raw)
    except ValueError as e:
        if _DATE.match(raw):
            raise ValueError(f"{text!r} is not a valid date and time ({e})") from None
        raise ValueError(f"{text!r} is not an ISO 8601 time such as 2030-01-01T09:00:00+01:00") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} names no time zone: add Z (UTC) or an offset such as +01:00")
    return (when - _EPOCH).total_seconds()


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def due_of(call: ToolCall, now: float, deadline: float | None = None) -> float | ToolError:
    """When the timer call `call` is due, `now` being the time of the run's latest event; or the error the
    model reads (bad arguments, too long a wait, a wait past the run's deadline). A `wait_until` in the
    past is due at once."""
    args = call.arguments
    if call.name == SLEEP:
        seconds = args.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            return ToolError("input", "sleep needs `seconds`, a number of seconds of at least 0")
        due = now + float(seconds)
    elif call.name == WAIT_UNTIL:
        when = args.get("time")
        if not isinstance(when, str):
            return ToolError("input", "wait_until needs `time`, an ISO 8601 time with a time zone")
        try:
            due = max(parse_instant(when), now)
        except ValueError as e:
            return ToolError("input", str(e))
    else:
        return ToolError("input", f"{call.name!r} is not a timer")
    if due - now > MAX_WAIT_S:
        return ToolError("input", f"a timer may wait at most {MAX_WAIT_S / 86_400:g} days")
    if deadline is not None and due > deadline:
        return ToolError("input", f"waiting until {iso(due)} would pass the task's deadline "
                                  f"({iso(deadline)}): wait at most {max(deadline - now, 0):.0f} s")
    return due


def fired_output(due: float, woke: float) -> dict[str, Any]:
    """What a timer call returns to the model once it fired."""
    return {"due": iso(due), "woke": iso(woke)}


__all__ = ["MAX_WAIT_S", "SLEEP", "TIMER_TOOLS", "WAIT_UNTIL", "due_of", "fired_output", "iso",
           "parse_instant"]
