"""How long runs are kept: the age and size bounds of the EVENTS stream and of the `payloads` object
store, and applying them to existing streams at start-up.

    bounds = Retention.parse(events_max_age="30d")        # what an operator asked for (None: not asked)
    in_force = await ensure_retention(js, bounds)           # applied to EVENTS and the payloads store

The defaults, and what they protect:

* EVENTS keeps events 90 days (`SA_EVENTS_MAX_AGE`, `sa host/up --events-max-age`) with no size bound
  (`SA_EVENTS_MAX_BYTES`). The age bound removes an event when *it* is older than the bound, whatever its
  run is doing: a run still going after 90 days (waiting for an approval, say) loses its first events,
  and a run whose `run.started` is gone cannot be resumed or replayed. So the default is generous: it
  only keeps a forgotten deployment's disk from filling, and `sa runs purge` is the normal way to delete
  finished runs. A size bound discards the oldest events first, again whatever their run's state, so it
  is off unless asked for.
* The payload store keeps objects 90 days (`SA_PAYLOADS_MAX_AGE`), no size bound (`SA_PAYLOADS_MAX_BYTES`;
  when the store is full a new big payload is refused, so the run that needed it fails). An object is
  stored before, or together with, the event that references it, so with the same age as EVENTS an
  object outlives the events that need it, except in a run longer than the bound.

"0" (or "none") means no bound. Durations: "90d", "12h", "30m", "45s", "2w" or seconds; sizes: "20gb",
"512mb" or bytes.

Who wins. An explicit bound (flag or environment variable) is applied to the existing stream. Without
one, a stream this runtime already bounded keeps its bounds (a host started without the variable must
not cut a fleet's 1-year history to 90 days: lowering `max_age` deletes at once), and a stream made before
bounds existed gets the defaults. The streams' metadata (`MARKER`) records that the runtime set them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from runtime.nats.retry import retrying
from runtime.nats.subjects import EVENTS, PAYLOADS_BUCKET

log = logging.getLogger("runtime.nats")

DAY_S = 86_400.0
DEFAULT_EVENTS_MAX_AGE_S = 90 * DAY_S
DEFAULT_EVENTS_MAX_BYTES = 0  # no bound
DEFAULT_PAYLOADS_MAX_AGE_S = 90 * DAY_S
DEFAULT_PAYLOADS_MAX_BYTES = 0  # no bound
ENV_EVENTS_MAX_AGE = "SA_EVENTS_MAX_AGE"
ENV_EVENTS_MAX_BYTES = "SA_EVENTS_MAX_BYTES"
ENV_PAYLOADS_MAX_AGE = "SA_PAYLOADS_MAX_AGE"
ENV_PAYLOADS_MAX_BYTES = "SA_PAYLOADS_MAX_BYTES"
PAYLOADS_STREAM = f"OBJ_{PAYLOADS_BUCKET}"
MARKER = "sa.retention"  # stream metadata: the runtime set this stream's bounds

_AGE_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S, "w": 7 * DAY_S}
_SIZE_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_NONE = frozenset({"0", "none", "off", "unlimited"})


def parse_age(text: str, field: str = "age") -> float:
    """Seconds from "90d", "12h", "30m", "45s", "2w" or a number of seconds; 0 for "0"/"none"."""
    return float(_parse(text, field, _AGE_UNITS, "a duration like '90d', '12h' or '30m' (or 0: none)"))


def parse_bytes(text: str, field: str = "size") -> int:
    """Bytes from "20gb", "512mb", "1tb" or a byte count; 0 for "0"/"none"."""
    return int(_parse(text, field, _SIZE_UNITS, "a size like '20gb' or '512mb' (or 0: none)"))


def _parse(text: str, field: str, units: Mapping[str, float], expected: str) -> float:
    raw = text.strip().lower()
    if raw in _NONE:
        return 0
    m = _QUANTITY.match(raw)
    if not m or m.group(2) not in units:
        raise ValueError(f"{field}: {text!r} is not {expected}")
    return float(m.group(1)) * units[m.group(2)]


def human_age(seconds: float) -> str:
    """90 days -> "90d"; 0 -> "none"."""
    if not seconds:
        return "none"
    for unit in ("w", "d", "h", "m"):
        if seconds % _AGE_UNITS[unit] == 0:
            return f"{seconds / _AGE_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Retention:
    """Age bounds in seconds and size bounds in bytes; 0 is "no bound", None "not asked for" (keep what
    the stream has, or the default for a stream no bounds were ever set on)."""

    events_max_age: float | None = None
    events_max_bytes: int | None = None
    payloads_max_age: float | None = None
    payloads_max_bytes: int | None = None

    @classmethod
    def parse(cls, *, events_max_age: str | None = None, events_max_bytes: str | None = None,
              payloads_max_age: str | None = None, payloads_max_bytes: str | None = None) -> Retention:
        """From the strings of flags or environment variables (None or "": not given). ValueError says
        which one is wrong."""
        return cls(
            parse_age(events_max_age, ENV_EVENTS_MAX_AGE) if events_max_age else None,
            parse_bytes(events_max_bytes, ENV_EVENTS_MAX_BYTES) if events_max_bytes else None,
            parse_age(payloads_max_age, ENV_PAYLOADS_MAX_AGE) if payloads_max_age else None,
            parse_bytes(payloads_max_bytes, ENV_PAYLOADS_MAX_BYTES) if payloads_max_bytes else None)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Retention:
        """The bounds the `SA_*_MAX_AGE` / `SA_*_MAX_BYTES` environment variables ask for."""
        env = env if env is not None else os.environ
        return cls.parse(events_max_age=env.get("SA_EVENTS_MAX_AGE"),
                         events_max_bytes=env.get("SA_EVENTS_MAX_BYTES"),
                         payloads_max_age=env.get("SA_PAYLOADS_MAX_AGE"),
                         payloads_max_bytes=env.get("SA_PAYLOADS_MAX_BYTES"))

    def resolved(self, events: StreamConfig | None = None, payloads: StreamConfig | None = None) -> Retention:
        """Every bound decided: asked for, else what a stream the runtime bounded has, else the default."""
        def pick(asked: float | None, config: StreamConfig | None, attr: str, default: float) -> float:
            if asked is not None:
                return asked
            if config is not None and MARKER in (config.metadata or {}):
                value = getattr(config, attr) or 0
                return 0 if value < 0 else value
            return default

        return Retention(
            pick(self.events_max_age, events, "max_age", DEFAULT_EVENTS_MAX_AGE_S),
            int(pick(self.events_max_bytes, events, "max_bytes", DEFAULT_EVENTS_MAX_BYTES)),
            pick(self.payloads_max_age, payloads, "max_age", DEFAULT_PAYLOADS_MAX_AGE_S),
            int(pick(self.payloads_max_bytes, payloads, "max_bytes", DEFAULT_PAYLOADS_MAX_BYTES)))

    def describe(self) -> str:
        """One phrase for logs and `sa status`: "events 90d / no size bound, payloads 90d / ..."."""
        def size(n: int | None) -> str:
            return f"{n / (1 << 30):g} GiB" if n else "no size bound"

        return (f"events {human_age(self.events_max_age or 0)} / {size(self.events_max_bytes)}, "
                f"payloads {human_age(self.payloads_max_age or 0)} / {size(self.payloads_max_bytes)}")


DEFAULT_RETENTION = Retention().resolved()


def bounded(config: StreamConfig, max_age: float | None, max_bytes: int | None) -> StreamConfig:
    """`config` with these bounds (0: none) and the marker that the runtime set them."""
    return dataclasses.replace(config, max_age=float(max_age or 0), max_bytes=int(max_bytes or 0) or -1,
                               metadata={**(config.metadata or {}), MARKER: "1"})


async def _config(js: JetStreamContext, stream: str) -> StreamConfig | None:
    try:
        return (await js.stream_info(stream)).config
    except NotFoundError:
        return None


async def resolve_retention(js: JetStreamContext, asked: Retention | None = None) -> Retention:
    """The bounds to apply: `asked`, else the existing streams' own, else the defaults."""
    return (asked or Retention()).resolved(await _config(js, EVENTS), await _config(js, PAYLOADS_STREAM))


async def ensure_retention(js: JetStreamContext, asked: Retention | None = None) -> Retention:
    """Apply the bounds (`resolve_retention`) to EVENTS and the payload store where they exist and differ;
    returns the bounds in force. Idempotent; every `sa host` / `sa up` calls it at start-up, so it rides
    out a NATS leader election (retried until NATS answers) instead of failing the process; a config the
    server refuses is raised at once."""
    return await retrying(lambda: _ensure_retention(js, asked), what="applying the retention bounds",
                          fatal=BadRequestError, logger=log)


async def _ensure_retention(js: JetStreamContext, asked: Retention | None) -> Retention:
    bounds = await resolve_retention(js, asked)
    for stream, age, size in ((EVENTS, bounds.events_max_age, bounds.events_max_bytes),
                              (PAYLOADS_STREAM, bounds.payloads_max_age, bounds.payloads_max_bytes)):
        config = await _config(js, stream)
        if config is None:
            continue
        wanted = bounded(config, age, size)
        if (_same(config.max_age, wanted.max_age) and (config.max_bytes or -1) == wanted.max_bytes
                and MARKER in (config.metadata or {})):
            continue
        log.debug("%s: keeping messages %s, at most %s", stream, human_age(wanted.max_age or 0),
                 "unbounded" if wanted.max_bytes == -1 else f"{wanted.max_bytes:,} bytes")
        await js.update_stream(wanted)
    return bounds


def _same(a: float | None, b: float | None) -> bool:
    return abs((a or 0) - (b or 0)) < 1e-3


__all__ = ["DEFAULT_EVENTS_MAX_AGE_S", "DEFAULT_EVENTS_MAX_BYTES", "DEFAULT_PAYLOADS_MAX_AGE_S",
           "DEFAULT_PAYLOADS_MAX_BYTES", "DEFAULT_RETENTION", "ENV_EVENTS_MAX_AGE", "ENV_EVENTS_MAX_BYTES",
           "ENV_PAYLOADS_MAX_AGE", "ENV_PAYLOADS_MAX_BYTES", "MARKER", "Retention", "bounded",
           "ensure_retention", "human_age", "parse_age", "parse_bytes", "resolve_retention"]
