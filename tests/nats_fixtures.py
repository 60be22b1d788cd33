"""Real nats-server fixtures for integration tests (import them in a test module or conftest).

One server per test module is cheap (~30 ms to start) and isolates modules from each other; tests in a
module use fresh stream state via `js_clean`, which deletes every stream so no test depends on order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from runtime.nats.connection import connect
from runtime.nats.server import EmbeddedNats


@pytest.fixture(scope="module")
def nats_server() -> Iterator[EmbeddedNats]:
    server = EmbeddedNats().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: EmbeddedNats) -> AsyncIterator[object]:
    conn = await connect(nats_server.url, name="test")
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def js(nc) -> AsyncIterator[object]:
    """A JetStream context on a server with no streams left over from earlier tests of the module."""
    ctx = nc.jetstream()
    for info in await ctx.streams_info():
        await ctx.delete_stream(info.config.name)
    yield ctx
