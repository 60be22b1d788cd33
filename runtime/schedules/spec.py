"""A schedule, as data: what it starts (an agent, its input, instance and thread), when (a cron expression,
an interval or one instant) and what becomes of fires nobody took in time (`catch_up`).

Pure: no NATS here. `make_schedule` checks and normalises what a person typed (the CLI, a bundle's
`schedules:` section, `Client.schedules.add`) into a `Schedule`, or raises `ScheduleError` saying what to
fix; the server checks the pattern again when the schedule is stored (`runtime.schedules.store`).

When, in the server's terms (ADR-51 message schedules, what nats-server 2.15 accepts, probed):

* ``cron``: six fields, seconds first (``0 */5 * * * *``), or ``@hourly``, ``@daily``, ``@weekly``,
  ``@monthly``, ``@yearly``; evaluated in UTC unless ``tz`` names an IANA zone (``Europe/Paris``). Five
  fields are refused by the server, so they are refused here, saying so.
* ``every``: an interval of whole seconds, at least 1 s (``30s``, ``5m``, ``1h30m``, ``2d``); the server
  counts it from when the schedule is stored. A zone means nothing for it (the server refuses one).
* ``at``: one instant, ISO 8601 with a zone (``2030-01-01T09:00:00+01:00``); stored in UTC. An instant in the
  past fires at once.

`catch_up` (fires that waited longer than `grace_s`, because no host ran when they fired):

* ``all``: every such fire runs;
* ``latest`` (default): only the newest waiting fire of the schedule runs, the older ones are skipped (a
  missed fire is skipped when a later fire of the schedule is still stored; with several hosts taking a
  backlog at the same instant, the one before the newest may run too);
* ``none``: every such fire is skipped; the schedule goes on with its next fire.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, cast

import msgspec

from runtime.commands import actor_key, check_thread, split_actor
from runtime.nats.subjects import check_token
from runtime.timers import iso, parse_instant

CatchUp = Literal["none", "latest", "all"]
CATCH_UP: tuple[CatchUp, ...] = ("none", "latest", "all")
DEFAULT_CATCH_UP: CatchUp = "latest"
DEFAULT_GRACE_S = 60.0
PREDEFINED = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_INTERVAL = re.compile(r"(?:\d+[smhd])+")


class ScheduleError(ValueError):
    """A schedule that cannot be (the message says what to fix)."""


class Schedule(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One schedule, as stored (JSON, in the body of its message on ``schedules.def.<name>``, and so in
    the body of each of its fires). Exactly one of `cron`, `every` (``<n>s``) and `at` (RFC 3339, UTC)."""

    name: str
    agent: str  # the bundle
    input: str
    cron: str | None = None
    every: str | None = None
    at: str | None = None
    tz: str | None = None
    instance: str | None = None
    thread: str | None = None
    catch_up: CatchUp = DEFAULT_CATCH_UP
    grace_s: float = DEFAULT_GRACE_S
    paused: bool = False
    origin: str = ""  # who made it: `sa schedule add (user@host)`, `bundle <path>`, ...

    @property
    def actor(self) -> str:
        """The actor its runs belong to: the agent, or `agent:instance`."""
        return actor_key(self.agent, self.instance)

    @property
    def pattern(self) -> str:
        """The `Nats-Schedule` header's value."""
        if self.at is not None:
            return f"@at {self.at}"
        if self.every is not None:
            return f"@every {self.every}"
        return cast(str, self.cron)

    @property
    def when(self) -> str:
        """For people: `every 30s`, `cron 0 */5 * * * * (Europe/Paris)`, `at 2030-01-01T08:00:00Z`."""
        if self.at is not None:
            return f"at {self.at}"
        if self.every is not None:
            return f"every {self.every}"
        return f"cron {self.cron}" + (f" ({self.tz})" if self.tz else "")

    def same_as(self, other: Schedule) -> bool:
        """True when `other` starts the same runs at the same times (it may be paused, or made elsewhere)."""
        strip = {"paused": False, "origin": ""}
        return msgspec.structs.replace(self, **strip) == msgspec.structs.replace(other, **strip)

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Schedule:
        try:
            return msgspec.json.decode(data, type=cls)
        except msgspec.DecodeError as e:
            raise ScheduleError(f"not a schedule: {e}") from None


def parse_every(text: str | int | float) -> int:
    """An interval as whole seconds (at least 1): `30`, `30s`, `5m`, `1h30m`, `2d`."""
    if isinstance(text, bool):
        raise ScheduleError(f"every: {text!r} is not an interval")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = text.strip().lower()
        if raw.isdigit():
            seconds = float(raw)
        elif _INTERVAL.fullmatch(raw):
            seconds = float(sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhd])", raw)))
        else:
            raise ScheduleError(f"every: {text!r} is not an interval such as 30s, 5m, 1h30m or 2d")
    if seconds < 1 or not seconds.is_integer():
        raise ScheduleError(f"every: {text!r}: an interval is a whole number of seconds, at least 1s")
    return int(seconds)


def check_cron(expr: str) -> str:
    """A cron expression the server takes (six fields, seconds first, or a predefined one), normalised
    to single spaces."""
    fields = expr.split()
    if len(fields) == 1 and fields[0].lower() in PREDEFINED:
        return fields[0].lower()
    if len(fields) == 5:
        raise ScheduleError(f"cron {expr!r} has five fields: give six, seconds first "
                            f"(e.g. '0 {expr.strip()}')")
    if len(fields) != 6:
        raise ScheduleError(f"cron {expr!r}: six fields (second minute hour day-of-month month "
                            f"day-of-week), or one of {', '.join(PREDEFINED)}")
    return " ".join(fields)


def check_tz(tz: str) -> str:
    """An IANA time zone this machine knows (the server checks it against its own database too)."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"tz {tz!r} is not an IANA time zone such as Europe/Paris or UTC") from None
    return tz


def _when(cron: str | None, every: Any, at: str | None, tz: str | None) -> dict[str, Any]:
    given = [k for k, v in (("cron", cron), ("every", every), ("at", at)) if v is not None]
    if len(given) != 1:
        raise ScheduleError("give exactly one of cron, every and at" + (f" (got {', '.join(given)})"
                                                                      if given else ""))
    if tz is not None and cron is None:
        raise ScheduleError("tz applies to a cron schedule only (every counts from when it is stored; at "
                            "names its own zone)")
    if cron is not None:
        return {"cron": check_cron(cron), "tz": check_tz(tz) if tz else None}
    if every is not None:
        return {"every": f"{parse_every(every)}s"}
    assert at is not None
    try:
        instant = parse_instant(at)
    except ValueError as e:
        raise ScheduleError(f"at: {e}") from None
    return {"at": iso(math.ceil(instant))}


def make_schedule(name: str, agent: str, input: str, *, cron: str | None = None, every: Any = None,
                  at: str | None = None, tz: str | None = None, instance: str | None = None,
                  thread: str | None = None, catch_up: str = DEFAULT_CATCH_UP,
                  grace_s: float = DEFAULT_GRACE_S, paused: bool = False, origin: str = "") -> Schedule:
    """A checked, normalised `Schedule`; `ScheduleError` says what is wrong. `agent` may be
    `bundle:instance`."""
    try:
        check_token(name, "schedule name")
        bundle, inst = split_actor(agent)
        check_token(bundle, "agent")
        if instance and inst and instance != inst:
            raise ScheduleError(f"the agent names instance {inst!r} and --instance says {instance!r}")
        instance = instance or inst
        actor_key(bundle, instance)
        if thread is not None:
            check_thread(thread)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    if not input:
        raise ScheduleError("a schedule needs an input: the task its runs are given")
    if catch_up not in CATCH_UP:
        raise ScheduleError(f"catch_up {catch_up!r}: one of {', '.join(CATCH_UP)}")
    if grace_s < 0:
        raise ScheduleError(f"grace must be at least 0 s, got {grace_s:g}")
    return Schedule(name=name, agent=bundle, input=input, instance=instance, thread=thread,
                    catch_up=catch_up, grace_s=float(grace_s), paused=paused, origin=origin,
                    **_when(cron, every, at, tz))


__all__ = ["CATCH_UP", "DEFAULT_CATCH_UP", "DEFAULT_GRACE_S", "CatchUp", "Schedule", "ScheduleError",
           "check_cron", "make_schedule", "parse_every"]
