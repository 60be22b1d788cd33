"""`Limits`: the resource bounds of one script run, in grail's vocabulary.

    Limits(max_memory="16mb", max_duration="2s", max_recursion=200)
    Limits.strict() / Limits.default() / Limits.permissive()
    base.merge(override)            # override's set fields win; a new object
    Limits.resolve("strict" | {"max_duration": "5s"} | '{"max_memory": "32mb"}' | None | Limits)

Sizes take bytes or "512kb" / "16mb" / "1.5GB" (binary units: 1 kb = 1024 bytes); durations take seconds
or "500ms" / "2s" / "1.5m". Every field is optional so a partial `Limits` can override another; a run always
fills the gaps from `Limits.default()` (so memory and duration are bounded on every checkout: a busy Monty
worker whose host died keeps running until its feed ends).

On the wire a `Limits` is its `to_dict()` (= `model_dump(exclude_none=True)`, plain numbers), and
`Limits.resolve(d)` / `Limits.model_validate(d)` reads it back.
"""

from __future__ import annotations

import difflib
import functools
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from runtime.quantities import LimitsError, human_duration, human_size, parse_duration, parse_size

if TYPE_CHECKING:
    from pydantic_monty import ResourceLimits

__all__ = ["PRESETS", "Limits", "LimitsError"]


def _positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LimitsError(f"{field} must be a positive integer, not {value!r}")
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except ValueError:
        number = None
    if number is None or number <= 0:
        raise LimitsError(f"{field} must be a positive integer, not {value!r}")
    return number


class Limits(BaseModel):
    """Resource bounds for one script run. Frozen; `None` means "not set here" (see `merge`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_memory: int | None = None
    """Heap bytes the sandbox may use ("16mb", "1.5GB" or bytes)."""
    max_duration: float | None = None
    """Seconds of sandbox execution ("2s", "500ms" or seconds); time in host externals is not counted."""
    max_recursion: int | None = None
    """Maximum call-stack depth."""
    max_suspensions: int | None = None
    """Host round trips: external calls plus file and environment operations (`open().read()` costs 2)."""
    max_output: int | None = None
    """Bytes of the JSON-encoded result ("1mb" or bytes)."""

    # ---- validation -------------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    raise LimitsError(_unknown_key_message(str(key), allowed))
        return data

    @field_validator("max_memory", "max_output", mode="before")
    @classmethod
    def _size(cls, value: Any, info: Any) -> Any:
        return None if value is None else parse_size(value, field=info.field_name)

    @field_validator("max_duration", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> Any:
        return None if value is None else parse_duration(value, field=info.field_name)

    @field_validator("max_recursion", "max_suspensions", mode="before")
    @classmethod
    def _count(cls, value: Any, info: Any) -> Any:
        return None if value is None else _positive_int(value, info.field_name)

    # ---- presets ----------------------------------------------------------------------------------

    @classmethod
    def strict(cls) -> Limits:
        """8 MB, 500 ms, recursion 120, 200 host round trips, 256 KB of result."""
        return PRESETS["strict"]

    @classmethod
    def default(cls) -> Limits:
        """16 MB, 2 s, recursion 200, 1000 host round trips, 1 MB of result."""
        return PRESETS["default"]

    @classmethod
    def permissive(cls) -> Limits:
        """64 MB, 10 s, recursion 400, 10000 host round trips, 16 MB of result."""
        return PRESETS["permissive"]

    # ---- combining and the wire -------------------------------------------------------------------

    def merge(self, other: Limits | None) -> Limits:
        """A new `Limits`: this one with every field `other` sets (non-None) overriding it."""
        if other is None:
            return self
        key = (id(self), id(other))
        hit = _merged.get(key)
        if hit is not None and hit[0] is self and hit[1] is other:
            return hit[2]
        result = _validated(_fields({**self.to_dict(), **other.to_dict()}))
        if len(_merged) >= _MERGED_KEPT:
            _merged.pop(next(iter(_merged)), None)
        _merged[key] = (self, other, result)
        return result

    def to_dict(self) -> dict[str, int | float]:
        """The set fields as plain numbers: what goes on the wire. `Limits.resolve(d)` reads it back."""
        return {k: v for k, v in self.__dict__.items() if v is not None}  # = model_dump(exclude_none=True)

    @classmethod
    def resolve(cls, spec: Limits | str | dict[str, Any] | None) -> Limits:
        """A `Limits` from None (-> default), a preset name, a dict, a JSON object string or a `Limits`."""
        if spec is None:
            return cls.default()
        if isinstance(spec, Limits):
            return spec
        if isinstance(spec, str):
            text = spec.strip()
            if text.startswith("{"):
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as e:
                    raise LimitsError(f"limits JSON does not parse: {e}") from None
                return cls.resolve(data)
            if text in PRESETS:
                return PRESETS[text]
            close = difflib.get_close_matches(text, list(PRESETS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise LimitsError(
                f"unknown limits preset {text!r}{hint}; use one of {', '.join(map(repr, PRESETS))}, "
                'or a JSON object such as \'{"max_duration": "5s"}\''
            )
        if isinstance(spec, dict):
            try:
                key = _fields(spec)
                hash(key)
            except TypeError:  # values no valid spec has (lists, ...): validate uncached, for the message
                return _from_dict(spec)
            return _validated(key)
        raise LimitsError(f"limits must be a preset name, a dict or a Limits, not {type(spec).__name__}")

    # ---- for people and for Monty -----------------------------------------------------------------

    def describe(self) -> str:
        parts = []
        if self.max_memory is not None:
            parts.append(f"memory {human_size(self.max_memory)}")
        if self.max_duration is not None:
            parts.append(f"duration {human_duration(self.max_duration)}")
        if self.max_recursion is not None:
            parts.append(f"recursion {self.max_recursion}")
        if self.max_suspensions is not None:
            parts.append(f"host calls {self.max_suspensions}")
        if self.max_output is not None:
            parts.append(f"output {human_size(self.max_output)}")
        return ", ".join(parts) or "no limits set"

    def effective(self) -> Limits:
        """This over `Limits.default()`: every field set, as every run needs."""
        return PRESETS["default"].merge(self)

    def to_monty(self) -> ResourceLimits:
        """pydantic-monty's `ResourceLimits` for a checkout (fields filled from the default preset)."""
        return dict(_monty_of(self.effective()))  # type: ignore[return-value]  # a copy a checkout may keep


_Fields = tuple[tuple[str, type, Any], ...]

# `merge` results by the identity of both sides (each entry keeps both, so an id is never reused while it is
# cached). Why: a tool worker merges a job's limits over the tool's and over the default preset (`effective`)
# on every job, with the same few `Limits` objects each time (`_validated` hands out one object per value);
# even the cached path of `_validated` (two `to_dict`, a sorted key) was a twentieth of a trivial job's CPU.
_merged: dict[tuple[int, int], tuple[Limits, Limits, Limits]] = {}
_MERGED_KEPT = 1024


_monty: dict[int, tuple[Limits, dict[str, Any]]] = {}


def _monty_of(full: Limits) -> dict[str, Any]:
    """The checkout limits of a complete `Limits`, made once per object (`to_monty` hands out copies)."""
    hit = _monty.get(id(full))
    if hit is not None and hit[0] is full:
        return hit[1]
    if len(_monty) >= _MERGED_KEPT:
        _monty.pop(next(iter(_monty)), None)
    made = {
        "max_memory": full.max_memory,
        "max_feed_duration_secs": full.max_duration,
        # sleeps do not count as execution time; bound them by the same budget
        "max_total_sleep_secs": full.max_duration,
        "max_recursion_depth": full.max_recursion,
        "max_suspensions": full.max_suspensions,
    }
    _monty[id(full)] = (full, made)
    return made


def _fields(spec: dict[str, Any]) -> _Fields:
    """A limits dict as a cache key: sorted, and typed (so `True` and `1` stay different keys)."""
    return tuple(sorted((str(k), type(v), v) for k, v in spec.items()))


@functools.lru_cache(maxsize=1024)
def _validated(fields: _Fields) -> Limits:
    """The process's one cache of validated `Limits`, keyed by their fields: `resolve` of a dict, `merge`
    and `effective` all come through here. A tool worker resolves every job's limits dict and merges it
    over the tool's own, and validating with pydantic each time costs more than a fast script's run; every
    job of a tool carries the same dict, so after the first job these are lookups. Errors are not cached."""
    return _from_dict({name: value for name, _, value in fields})


def _from_dict(spec: dict[str, Any]) -> Limits:
    try:
        return Limits.model_validate(spec)
    except LimitsError:
        raise
    except ValueError as e:  # pydantic's ValidationError wraps our LimitsError messages
        raise LimitsError(_validation_message(e)) from None


def _unknown_key_message(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown limits key {key!r}{hint}; allowed keys are {', '.join(allowed)}"


def _validation_message(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        parts = []
        for item in errors():
            msg = str(item.get("msg", ""))
            msg = msg.removeprefix("Value error, ")
            parts.append(msg)
        return "; ".join(parts)
    return str(error)


PRESETS: dict[str, Limits] = {  # human units, so through model_validate (the validators parse them)
    "strict": Limits.model_validate(
        {"max_memory": "8mb", "max_duration": "500ms", "max_recursion": 120, "max_suspensions": 200,
         "max_output": "256kb"}
    ),
    "default": Limits.model_validate(
        {"max_memory": "16mb", "max_duration": "2s", "max_recursion": 200, "max_suspensions": 1000,
         "max_output": "1mb"}
    ),
    "permissive": Limits.model_validate(
        {"max_memory": "64mb", "max_duration": "10s", "max_recursion": 400, "max_suspensions": 10_000,
         "max_output": "16mb"}
    ),
}
