"""Retention against a real nats-server: EVENTS and the payload store get age/size bounds, defaults for
streams never bounded, explicit bounds applied at start-up, and a stream's own bounds never reset by a
process started without them."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.nats.retention import (
    DEFAULT_EVENTS_MAX_AGE_S,
    DEFAULT_PAYLOADS_MAX_AGE_S,
    MARKER,
    PAYLOADS_STREAM,
    Retention,
    ensure_retention,
    parse_age,
    parse_bytes,
)
from runtime.nats.subjects import EVENTS
from runtime.nats.topology import ensure_topology

pytestmark = pytest.mark.anyio
DAY = 86_400.0


def test_bounds_parse_and_say_what_is_wrong() -> None:
    assert parse_age("90d") == 90 * DAY and parse_age("12h") == 43_200 and parse_age("45") == 45
    assert parse_age("0") == parse_age("none") == 0
    assert parse_bytes("20gb") == 20 << 30 and parse_bytes("512mb") == 512 << 20 and parse_bytes("off") == 0
    with pytest.raises(ValueError, match="SA_EVENTS_MAX_AGE"):
        Retention.parse(events_max_age="soon")
    assert Retention.from_env({"SA_EVENTS_MAX_AGE": "7d"}) == Retention(events_max_age=7 * DAY)
    assert Retention().resolved().events_max_age == DEFAULT_EVENTS_MAX_AGE_S == 90 * DAY


async def bounds(js, stream: str) -> tuple[float, int, bool]:
    config = (await js.stream_info(stream)).config
    return config.max_age or 0, config.max_bytes or -1, MARKER in (config.metadata or {})


async def test_new_streams_get_the_defaults_and_explicit_bounds_win(js) -> None:
    await ensure_topology(js)
    assert await bounds(js, EVENTS) == (DEFAULT_EVENTS_MAX_AGE_S, -1, True)
    assert await bounds(js, PAYLOADS_STREAM) == (DEFAULT_PAYLOADS_MAX_AGE_S, -1, True)

    asked = Retention.parse(events_max_age="365d", events_max_bytes="2gb", payloads_max_age="30d")
    await ensure_retention(js, asked)
    assert await bounds(js, EVENTS) == (365 * DAY, 2 << 30, True)
    assert (await bounds(js, PAYLOADS_STREAM))[0] == 30 * DAY

    # a host or worker started without the settings keeps them (no reset to the 90-day default)
    await ensure_retention(js, Retention())
    await ensure_topology(js)
    assert await bounds(js, EVENTS) == (365 * DAY, 2 << 30, True)
    assert (await bounds(js, PAYLOADS_STREAM))[0] == 30 * DAY

    await ensure_retention(js, Retention.parse(events_max_age="0", events_max_bytes="none"))
    assert await bounds(js, EVENTS) == (0, -1, True)  # "no bound" is kept as asked, too
    await ensure_retention(js, Retention())
    assert await bounds(js, EVENTS) == (0, -1, True)


async def test_a_stream_made_before_retention_gets_the_defaults_at_start_up(js) -> None:
    await ensure_topology(js)
    config = (await js.stream_info(EVENTS)).config
    legacy = dataclasses.replace(config, max_age=0.0, max_bytes=-1,
                                 metadata={k: v for k, v in (config.metadata or {}).items() if k != MARKER})
    await js.update_stream(legacy)
    assert await bounds(js, EVENTS) == (0, -1, False)
    in_force = await ensure_retention(js)
    assert in_force.events_max_age == DEFAULT_EVENTS_MAX_AGE_S
    assert await bounds(js, EVENTS) == (DEFAULT_EVENTS_MAX_AGE_S, -1, True)
