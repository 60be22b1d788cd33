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


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146_097 + (yoe * 365 + yoe // 4 - yoe // 100 + doy) - 719_468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """The date `z` days after 1970-01-01: the inverse of `_days_from_civil`."""
    z += 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


def iso(ts: float) -> str:
    """A unix time as RFC 3339 in UTC (`2030-01-01T08:00:00.250Z`; whole seconds without a fraction).
    Calendar arithmetic by hand: the kernel's modules import no `datetime` (it reads clocks)."""
    millis = round(ts * 1000)
    days, rest = divmod(millis, 86_400_000)
    y, mo, d = _civil_from_days(days)
    secs, ms = divmod(rest, 1000)
    text = f"{y:04d}-{mo:02d}-{d:02d}T{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return f"{text}.{ms:03d}Z" if ms else f"{text}Z"


_INSTANT = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?"
                      r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))?")


def parse_instant(text: str) -> float:
    """An ISO 8601 instant that names its time zone (`Z` or an offset) as a unix time; ValueError says why
    not. A time without a zone is refused: it would mean a different instant on every machine."""
    m = _INSTANT.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not an ISO 8601 time such as 2030-01-01T09:00:00+01:00")
    y, mo, d, hh, mi = (int(m.group(i)) for i in range(1, 6))
    ss = int(m.group(6) or 0)
    if not (1 <= mo <= 12 and 1 <= d <= 31 and hh <= 23 and mi <= 59 and ss <= 60):
        raise ValueError(f"{text!r} is not a valid date and time")
    if _civil_from_days(_days_from_civil(y, mo, d)) != (y, mo, d):
        raise ValueError(f"{text!r}: {y:04d}-{mo:02d} has no day {d}")
    if m.group(8) is None and m.group(9) is None:
        raise ValueError(f"{text!r} names no time zone: add Z (UTC) or an offset such as +01:00")
    offset = 0
    if m.group(9) is not None:
        offset = (int(m.group(10)) * 3600 + int(m.group(11)) * 60) * (1 if m.group(9) == "+" else -1)
    fraction = float(m.group(7)) if m.group(7) else 0.0
    return _days_from_civil(y, mo, d) * 86_400 + hh * 3600 + mi * 60 + ss + fraction - offset


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
