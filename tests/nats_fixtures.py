"""Real nats-server fixtures for integration tests (import them in a test module or conftest).

One server per test module is cheap (~30 ms to start) and isolates modules from each other; tests in a
module use fresh stream state via `js_clean`, which deletes every stream so no test depends on order.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runtime.nats.auth import ROLES
from runtime.nats.connection import connect
from runtime.nats.jetstream import jetstream_for
from runtime.nats.server import EmbeddedNats

AUTH_CONF = Path(__file__).resolve().parent.parent / "deploy" / "nats" / "auth.conf"
PASSWORDS = {role: f"pw-{role}-secret" for role in ROLES}  # each role's password for `secured`


@pytest.fixture(scope="module")
def nats_server() -> Iterator[EmbeddedNats]:
    server = EmbeddedNats().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def secured() -> Iterator[EmbeddedNats]:
    """nats-server with the shipped auth.conf, its `$SA_<ROLE>_PASSWORD`s (`PASSWORDS`) from the
    environment: what the auth and sub-run tests run against."""
    env = {**os.environ, **{f"SA_{r.upper()}_PASSWORD": pw for r, pw in PASSWORDS.items()}}
    server = EmbeddedNats(extra_args=["-c", str(AUTH_CONF)], env=env).start()
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
    ctx = jetstream_for(nc)  # the context the runtime uses (its leaner publish)
    for info in await ctx.streams_info():
        await ctx.delete_stream(info.config.name)
    yield ctx
