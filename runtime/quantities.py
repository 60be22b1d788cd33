"""Sizes and durations as people write them: "16mb", "1.5GB", "512kb", "500ms", "2s", "1.5m", or numbers.

    parse_size("1.5GB", field="max_memory")        # 1610612736 (binary units: 1 kb = 1024 bytes)
    parse_duration("500ms", field="timeout")       # 0.5
    human_size(16 * 1024**2), human_duration(0.5)  # "16 MB", "500 ms"

Why a module of its own, in the pure core: the sandbox's `Limits` is not their only reader. A bundle's
timeouts and deadlines, the model client's timeout and the payload threshold (`SA_PAYLOAD_THRESHOLD`) are
written the same way, by modules that must not load the sandbox to read "2s". A value that cannot be read
raises `LimitsError` (a `ValueError`) whose message names the field, what was given and what is accepted;
the name is the sandbox limits' own, because they were the first to be written this way and callers
catch it by that name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["LimitsError", "human_duration", "human_size", "parse_duration", "parse_size"]


class LimitsError(ValueError):
    """A size, a duration or a limits spec that cannot be understood: the message says what is wrong and
    what is accepted."""


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _quantity(value: Any, field: str, units: Mapping[str, float], kind: str, expected: str, unit_names: str
              ) -> float:
    """A positive number times its unit, from a number or a string such as "1.5GB" or "500ms"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _QUANTITY.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise LimitsError(f"{field} must be {expected}, not {value!r}")
    if unit not in units:
        raise LimitsError(f"{field}: unknown {kind} unit {unit!r} in {value!r}; use {unit_names}")
    amount = number * units[unit]
    if not math.isfinite(amount) or amount <= 0:
        raise LimitsError(f"{field} must be positive, not {value!r}")
    return amount


def parse_size(value: Any, *, field: str = "size") -> int:
    """Bytes from an int or a string such as "16mb", "1.5GB", "512kb", "4096"."""
    return int(_quantity(value, field, _SIZE_UNITS, "size", "a byte count or a size like '16mb' or '1.5GB'",
                         "b, kb, mb or gb"))


def parse_duration(value: Any, *, field: str = "duration") -> float:
    """Seconds from a number or a string such as "500ms", "2s", "1.5m"."""
    return _quantity(value, field, _DURATION_UNITS, "duration", "seconds or a duration like '500ms' or '2s'",
                     "ms, s or m")


def human_size(n: int) -> str:
    """Bytes for a person: "16 MB", "512 KB", "100 bytes"."""
    for unit, factor in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n} bytes"


def human_duration(s: float) -> str:
    """Seconds for a person: "500 ms", "2 s"."""
    return f"{s * 1000:g} ms" if s < 1 else f"{s:g} s"

